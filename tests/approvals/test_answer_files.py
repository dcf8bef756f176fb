"""ask_user with a file: the requester answers with one (API multipart, the item page), the model gets its metadata.

Files are checked by their bytes (size, type) before anything is stored;
a refused file leaves the item pending and nothing in the storage. Only
users who may see the run download it, as an attachment with nosniff.
"""

import hashlib
import json
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client

from approvals.models import AnswerFile, Interrupt
from runs.models import Run
from tests.support.answer_files import CSV, answered_with_file, asking, respond
from tests.support.api import error_of, field_errors, get_run, start_run
from tests.support.waits import tool_result, waiting_agent

pytestmark = pytest.mark.django_db(transaction=True)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 40
PDF = b"%PDF-1.4\n1 0 obj\n<<>>\nendobj\ntrailer\n<<>>\n%%EOF\n"


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def _stored_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()] if root.exists() else []


@pytest.fixture
def csv_question(worker, people, api):
    return asking(worker, people, api, "asks-csv", file="required", file_types=["text/csv", "application/pdf"])


def test_an_api_answer_with_a_file_stores_it_and_the_model_reads_its_metadata_and_text(
        worker, people, api, csv_question, media_root):
    run_id, item_id = csv_question
    requester = api(people["requester"])

    response = respond(requester, item_id, "Here it is.", SimpleUploadedFile("../../etc/statement.csv", CSV, "text/csv"))

    assert response.status_code == 200, response.content
    sha = hashlib.sha256(CSV).hexdigest()
    shown = response.json()["answer_file"]
    assert shown == {**shown, "name": "statement.csv", "content_type": "text/csv", "size": len(CSV), "sha256": sha,
                     "download": f"/api/interrupts/{item_id}/file/"}
    stored = AnswerFile.objects.get(interrupt_id=item_id)
    assert stored.file.name.startswith(f"answers/{run_id}/") and "statement" not in stored.file.name
    assert (media_root / stored.file.name).read_bytes() == CSV
    worker.drain()
    assert get_run(requester, run_id)["status"] == "completed"
    assert tool_result(run_id, "ask_user") == {"status": "succeeded", "result": {
        "answer": "Here it is.", "answered_by": "requester",
        "file": {"id": stored.pk, "name": "statement.csv", "content_type": "text/csv", "size": len(CSV),
                 "sha256": sha, "text": CSV.decode(), "text_truncated": False}}}


def test_the_page_answers_with_a_file(worker, people, api, csv_question, media_root):
    run_id, item_id = csv_question
    browser = Client()
    browser.force_login(people["requester"])
    page = browser.get(f"/inbox/{item_id}/")
    assert b'enctype="multipart/form-data"' in page.content and b'name="file"' in page.content

    response = browser.post(f"/inbox/{item_id}/", {"answer": "", "file": SimpleUploadedFile("s.pdf", PDF,
                                                                                              "application/pdf")})

    assert response.status_code == 302, response.content[:2000]
    stored = AnswerFile.objects.get(interrupt_id=item_id)
    assert (stored.content_type, stored.size, stored.uploaded_by) == ("application/pdf", len(PDF), people["requester"])
    worker.drain()
    result = tool_result(run_id, "ask_user")["result"]
    assert result["answer"] == "" and result["file"]["content_type"] == "application/pdf"
    assert "text" not in result["file"]  # binary: metadata only
    resolved = browser.get(f"/inbox/{item_id}/")
    assert f'href="/inbox/{item_id}/file/"'.encode() in resolved.content


def test_a_file_over_the_limit_is_413_and_nothing_is_lost(worker, people, api, csv_question, settings, media_root):
    body_limit = 1024 + settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    settings.TOLLGATE = {**settings.TOLLGATE, "ANSWER_FILE_MAX_BYTES": 1024, "REQUEST_BODY_MAX_BYTES": body_limit}
    run_id, item_id = csv_question
    requester = api(people["requester"])

    too_big = respond(requester, item_id, "Big.", SimpleUploadedFile("big.csv", b"a,b\n" * 300, "text/csv"))
    way_too_big = respond(requester, item_id, "Bigger.",
                           SimpleUploadedFile("huge.csv", b"a,b\n" * (body_limit // 4 + 1), "text/csv"))

    assert error_of(too_big, 413)["details"] == {"limit_bytes": 1024, "field": "file"}
    assert error_of(way_too_big, 413)["details"] == {"limit_bytes": body_limit}  # refused before parsing the body
    assert Interrupt.objects.get(pk=item_id).status == "pending"
    assert not AnswerFile.objects.exists() and _stored_files(media_root) == []
    assert respond(requester, item_id, "Small.", SimpleUploadedFile("s.csv", CSV, "text/csv")).status_code == 200


@pytest.mark.parametrize("name, content, declared", [
    ("picture.csv", PNG, "text/csv"),  # the bytes are a PNG whatever the name and type say
    ("statement.exe", b"MZ\x90\x00" + b"\x00" * 60, "application/pdf"),
    ("notes.csv", b"\xff\xfe\x00binary\x00", "text/csv"),  # not text, no known magic number
    ("page.html", b"<script>alert(1)</script>", "text/html"),  # text, so text/plain: not accepted here
    ("a.json", b"{not json", "application/json"),
    ("deep.json", b"[" * 200_000, "text/plain"),  # JSON by its name only: too deep to parse (was a 500)
    ("deep", b"[" * 200_000, "application/json"),  # JSON by its declared type only
    ("twice.json", b'{"a": 1, "a": 2}', "application/json"),  # ambiguous: which "a"?
])
def test_a_file_of_a_refused_type_is_400_and_nothing_is_stored(worker, people, api, csv_question, media_root,
                                                                 name, content, declared):
    _, item_id = csv_question
    response = respond(api(people["requester"]), item_id, "Here.", SimpleUploadedFile(name, content, declared))

    assert "file" in field_errors(response)
    assert Interrupt.objects.get(pk=item_id).status == "pending"
    assert not AnswerFile.objects.exists() and _stored_files(media_root) == []


def test_a_required_file_must_come_and_a_question_without_one_takes_none(worker, people, api, csv_question):
    _, item_id = csv_question
    requester = api(people["requester"])
    assert "file" in field_errors(requester.post(f"/api/interrupts/{item_id}/respond/", {"answer": "No file."},
                                                 format="json"))
    _, plain_item = asking(worker, people, api, "asks-plain")
    refused = respond(requester, plain_item, "Also a file.", SimpleUploadedFile("s.csv", CSV, "text/csv"))
    assert "file" in field_errors(refused)
    assert not AnswerFile.objects.exists()


def test_the_question_cannot_widen_the_accepted_types(worker, people, api):
    call = {"name": "ask_user", "arguments": {"question": "Send a program.", "file": "optional",
                                              "file_types": ["application/x-msdownload"]}}
    agent = waiting_agent(api(people["admin"]), "asks-exe", call)
    run = start_run(api(people["requester"]), agent, "Go.")
    worker.drain()
    asked = Run.objects.get(pk=run["id"]).tool_calls.get(name="ask_user")
    assert asked.status == "denied" and "application/x-msdownload" in asked.error
    assert not Interrupt.objects.filter(run_id=run["id"]).exists()


def test_only_users_who_may_see_the_run_download_the_file(worker, people, api, csv_question):
    _, item_id = csv_question
    assert respond(api(people["requester"]), item_id, "", SimpleUploadedFile("s.csv", CSV, "text/csv")).status_code == 200
    stranger = get_user_model().objects.create_user("stranger", password="x")

    for user in (people["requester"], people["approver"]):  # the requester, and a decider (sees every run)
        download = api(user).get(f"/api/interrupts/{item_id}/file/")
        assert download.status_code == 200
        assert b"".join(download.streaming_content) == CSV
        assert download["Content-Disposition"] == 'attachment; filename="s.csv"'
        assert download["X-Content-Type-Options"] == "nosniff"
        assert download["Content-Type"] == "text/csv"
    assert error_of(api(stranger).get(f"/api/interrupts/{item_id}/file/"), 404)
    page = Client()
    page.force_login(stranger)
    assert page.get(f"/inbox/{item_id}/file/").status_code == 404
    page.force_login(people["requester"])
    assert b"".join(page.get(f"/inbox/{item_id}/file/").streaming_content) == CSV
    assert Client().get(f"/inbox/{item_id}/file/").status_code == 302  # to the login page


def test_idempotency_key_works_with_a_multipart_answer(worker, people, api, csv_question):
    _, item_id = csv_question
    requester = api(people["requester"])

    def send(content: bytes):
        return respond(requester, item_id, "Here.", SimpleUploadedFile("s.csv", content, "text/csv"),
                        **{"Idempotency-Key": "answer-1"})

    first, again = send(CSV), send(CSV)
    other = send(CSV + b"124,5.00\n")

    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert error_of(other, 422)["code"] == "idempotency_key_reused"
    assert AnswerFile.objects.count() == 1


def test_text_given_to_the_model_is_cut_at_the_limit(worker, people, api, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "ANSWER_FILE_TEXT_CHARS": 10}
    run_id, item_id = asking(worker, people, api, "asks-json", file="optional", file_types=["application/json"])
    body = json.dumps({"accounts": ["A", "B"]}).encode()
    assert respond(api(people["requester"]), item_id, "", SimpleUploadedFile("a.json", body, "application/json")
                    ).status_code == 200
    worker.drain()
    shown = tool_result(run_id, "ask_user")["result"]["file"]
    assert (shown["content_type"], shown["text"], shown["text_truncated"]) == ("application/json", body.decode()[:10],
                                                                               True)


def test_deleting_the_run_deletes_its_answer_file_once_committed_and_a_rollback_keeps_it(worker, people, api,
                                                                                          media_root):
    stored = answered_with_file(worker, people, api)
    path = media_root / stored.file.name
    assert path.read_bytes() == CSV

    with pytest.raises(RuntimeError), transaction.atomic():
        Run.objects.filter(pk=stored.interrupt.run_id).delete()  # cascades: run → item → answer file
        assert not AnswerFile.objects.filter(pk=stored.pk).exists()
        assert path.exists()  # nothing leaves the disk before the commit
        raise RuntimeError("roll the delete back")
    assert AnswerFile.objects.filter(pk=stored.pk).exists() and path.read_bytes() == CSV

    Run.objects.get(pk=stored.interrupt.run_id).delete()

    assert not AnswerFile.objects.filter(pk=stored.pk).exists()
    assert _stored_files(media_root) == []


def test_deleting_the_item_or_the_row_alone_deletes_the_file_too(worker, people, api, media_root):
    first = answered_with_file(worker, people, api, "asks-first")
    second = answered_with_file(worker, people, api, "asks-second")

    Interrupt.objects.filter(pk=first.interrupt_id).delete()
    AnswerFile.objects.get(pk=second.pk).delete()

    assert not AnswerFile.objects.exists() and _stored_files(media_root) == []
