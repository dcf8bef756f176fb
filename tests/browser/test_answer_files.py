"""Real browser: the requester answers a question with a file on the item page, then downloads it.

``manage.py serve`` without the demo (the ``served_core`` fixture of ``tests.support.browser``)
keeps the file under a ``MEDIA_ROOT`` of this test's own.
"""

import hashlib
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from approvals.models import AnswerFile
from runs.models import Run
from tests.support.api import pending_interrupts, start_run
from tests.support.browser import browser, log_in, served_core  # noqa: F401 - fixtures
from tests.support.waits import tool_result, waiting_agent

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CSV = b"order,amount\n123,80.00\n"


@pytest.fixture
def media_root(tmp_path, monkeypatch, settings):
    """A MEDIA_ROOT for the server (environment, set before ``served_core`` starts it) and for this process."""
    root = tmp_path / "media"
    monkeypatch.setenv("MEDIA_ROOT", str(root))
    settings.MEDIA_ROOT = root
    return root


@pytest.fixture
def asked(media_root, people, api, worker) -> tuple[dict, dict]:
    """(run, item): a run waiting on a question that needs a CSV file (made before the browser starts)."""
    call = {"name": "ask_user", "arguments": {"question": "Send the statement as CSV.", "file": "required",
                                              "file_types": ["text/csv"]}}
    agent = waiting_agent(api(people["admin"]), "asks-statement", call, final="Thanks.")
    run = start_run(api(people["requester"]), agent, "Check my statement.")
    worker.drain()
    item, = pending_interrupts(api(people["requester"]), run["id"])
    return run, item


def _in_thread(fn):
    """``fn()`` in a thread of its own: Playwright's sync API runs an event loop in this one, where Django
    refuses database calls."""

    def call():
        try:
            return fn()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def test_the_requester_answers_with_a_file_in_the_browser_and_downloads_it(  # noqa: F811
        asked, served_core, browser, worker, media_root, tmp_path):
    run, item = asked
    upload = tmp_path / "statement.csv"
    upload.write_bytes(CSV)

    page = log_in(browser, served_core, "requester", "requester-demo")
    page.goto(f"{served_core}/inbox/{item['id']}/")
    assert "text/csv" in page.text_content("#file-rule")
    page.set_input_files("#id_file", str(upload))
    page.fill("#id_answer", "Attached.")
    page.click("#send-answer")
    page.wait_for_url(f"{served_core}/runs/{run['id']}/")
    worker.drain()
    page.wait_for_selector("#run-status[data-status=completed]")

    stored = _in_thread(lambda: AnswerFile.objects.get(interrupt_id=item["id"]))
    assert (stored.name, stored.content_type, stored.sha256) == ("statement.csv", "text/csv",
                                                                  hashlib.sha256(CSV).hexdigest())
    assert (media_root / stored.file.name).read_bytes() == CSV
    assert _in_thread(lambda: tool_result(run["id"], "ask_user"))["result"]["file"]["text"] == CSV.decode()
    assert _in_thread(lambda: Run.objects.get(pk=run["id"]).outcome) == "achieved"

    page.goto(f"{served_core}/inbox/{item['id']}/")
    with page.expect_download() as downloading:
        page.click("#answer-file")
    download = downloading.value
    assert download.suggested_filename == "statement.csv"
    assert open(download.path(), "rb").read() == CSV
