"""Helpers of the tests about files answering a question (``ask_user`` with ``file``): ask, answer, one answered.

``users`` is ``{username: User}`` with ``admin`` and ``requester`` (the ``people`` or ``demo`` fixture).
"""

from django.core.files.uploadedfile import SimpleUploadedFile

from approvals.models import AnswerFile
from tests.support.api import pending_interrupts, start_run
from tests.support.waits import waiting_agent

CSV = b"order,amount\n123,80.00\n"


def asking(worker, users, api, slug: str, **arguments) -> tuple[int, int]:
    """(run id, item id) of a run of a new agent ``slug`` waiting on ``ask_user`` with ``arguments``."""
    call = {"name": "ask_user", "arguments": {"question": "Send the statement, please.", **arguments}}
    agent = waiting_agent(api(users["admin"]), slug, call, final="Thanks.")
    run = start_run(api(users["requester"]), agent, "Check my statement.")
    worker.drain()
    item, = pending_interrupts(api(users["requester"]), run["id"])
    return run["id"], item["id"]


def respond(client, item_id: int, answer: str = "", file=None, **headers):
    """POST an answer (and ``file``) to item ``item_id`` through the API, as multipart."""
    body = {"answer": answer}
    if file is not None:
        body["file"] = file
    return client.post(f"/api/interrupts/{item_id}/respond/", body, format="multipart", headers=headers)


def answered_with_file(worker, users, api, slug: str = "asks-for-a-csv") -> AnswerFile:
    """A question of a new agent ``slug`` answered by its requester with ``CSV`` (``statement.csv``), run drained."""
    _, item_id = asking(worker, users, api, slug, file="required", file_types=["text/csv"])
    answer = respond(api(users["requester"]), item_id, "Here.", SimpleUploadedFile("statement.csv", CSV, "text/csv"))
    assert answer.status_code == 200, answer.content
    worker.drain()
    return AnswerFile.objects.select_related("interrupt").get(interrupt_id=item_id)
