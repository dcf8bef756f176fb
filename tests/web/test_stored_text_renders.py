"""Whatever is already stored renders (issue 26): a lone surrogate kept in a JSON column took down every list.

Before the checks at the door (``runs.base.model_output``, ``config.strict_json``)
a JSON column could be given a lone surrogate as its escape (``"\\ud800"``).
SQLite keeps it; PostgreSQL's ``jsonb`` refuses it, so there the door was
always shut and these tests have nothing to plant. Read back, it is a
``str`` no UTF-8 text can hold: the API, the inbox and the admin answered
500 for every approver. Every JSON column now reads it back as U+FFFD
(``config.strict_json.StoredJSONDecoder``).
"""

import pytest
from django.db import DataError, connection
from django.test import Client
from rest_framework.test import APIClient

from approvals.models import Interrupt
from runs.engine.lifecycle import start_run
from runs.models import RunEvent
from tests.support.core import asking_agent
from tools.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def planted(people, worker):
    """A transfer waiting for approval, whose call, item and events hold lone surrogates as stored JSON."""
    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL's jsonb refuses a lone surrogate: it cannot have been stored there")
    run = start_run(agent=asking_agent(), user=people["requester"], input="send 80 to acme")
    worker.drain()
    ToolCall.objects.filter(run=run).update(arguments={"account": "acme", "amount": 80, "note": "a \ud800 b"})
    RunEvent.objects.filter(run=run).update(payload={"note": "\udfff"})
    Interrupt.objects.filter(run=run).update(edited_arguments={"account": "acme", "amount": 80, "note": "\ud800"})
    return run


def test_the_api_answers_for_stored_lone_surrogates(people, planted):
    item = Interrupt.objects.get(run=planted)
    client = APIClient()
    client.force_authenticate(people["approver"])
    for path in ("/api/interrupts/", "/api/interrupts/?status=pending", f"/api/interrupts/{item.pk}/",
                 f"/api/runs/{planted.pk}/", f"/api/runs/{planted.pk}/tool-calls/", f"/api/runs/{planted.pk}/events/"):
        response = client.get(path)
        assert response.status_code == 200, path
        response.json()  # valid JSON


def test_pages_the_admin_and_emails_answer_for_stored_lone_surrogates(people, planted, mailoutbox):
    from approvals.notifications import send_queued

    item = Interrupt.objects.get(run=planted)
    call = ToolCall.objects.get(run=planted, name="fake_transfer")
    browser = Client()
    browser.force_login(people["admin"])  # a superuser: an approver, and the admin too
    for path in ("/inbox/", f"/inbox/{item.pk}/", f"/runs/{planted.pk}/", "/runs/",
                 f"/admin/tools/toolcall/{call.pk}/change/", f"/admin/runs/run/{planted.pk}/change/",
                 f"/admin/approvals/interrupt/{item.pk}/change/", "/admin/runs/runevent/"):
        response = browser.get(path)
        assert response.status_code == 200, path
        response.content.decode("utf-8")
    assert call.arguments["note"] == "a \ufffd b"  # read back as U+FFFD, never as a lone surrogate

    mailoutbox.clear()
    assert send_queued("new_item", item.pk) >= 1
    for message in mailoutbox:
        message.message().as_bytes()


def test_planting_is_refused_where_the_database_refuses_it(people, worker):
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL refuses it")
    run = start_run(agent=asking_agent(), user=people["requester"], input="send 80 to acme")
    worker.drain()
    with pytest.raises(DataError):
        ToolCall.objects.filter(run=run).update(arguments={"note": "\ud800"})
