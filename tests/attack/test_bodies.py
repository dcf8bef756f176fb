"""Hostile request bodies on the integrator endpoints: a clear 4xx in the one error shape, nothing written.

Found by attacking the API (tests/attack/): a ``Content-Type``
whose ``charset`` names a codec that is no text encoding (``rot13``,
``zlib``, ...) or whose decoder fails with a bare ``UnicodeError``
(``punycode``), and an escaped lone surrogate (``"\\ud800"``) anywhere in a
JSON body (a metadata key, an event payload, a list item) were 500s: the
first in the parser, the second when the value reached the database or
was echoed in the error answer. Run on SQLite and PostgreSQL by tests/run.sh.
"""

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from runs.webhooks.models import WebhookSubscription
from tests.support.api import error_of, get_run, start_run
from tests.support.security import core_approval_item, stored_state  # noqa: F401
from tests.support.waits import waiting_agent
from tools.models import ExternalEvent, Wait

pytestmark = pytest.mark.django_db(transaction=True)

EVENT_TYPE, EVENT_KEY = "payment.settled", "K-attack-order-123"


@pytest.fixture
def event_wait(people, api, worker) -> Wait:
    """A run waiting for ``EVENT_TYPE`` with ``EVENT_KEY``: a body that reached the service would resume it."""
    call = {"name": "wait_for_event",
            "arguments": {"event_type": EVENT_TYPE, "correlation_key": EVENT_KEY, "timeout_s": 3600}}
    agent = waiting_agent(api(people["admin"]), "attack-waits", call)
    run = start_run(api(people["requester"]), agent, "Ship once paid.")
    worker.drain()
    assert get_run(api(people["requester"]), run["id"])["waiting_reason"] == "external_event"
    return Wait.objects.get(run_id=run["id"])


def _raw_client(user) -> Client:
    """A test client sending the bytes it is given, with ``user``'s token (no re-encoding of the body)."""
    token, _ = Token.objects.get_or_create(user=user)
    return Client(HTTP_AUTHORIZATION=f"Token {token.key}")


def _bodies(item_id: int) -> dict[str, bytes]:
    """A body each write endpoint would accept, keyed by URL."""
    return {
        "/api/events/": b'{"type": "%s", "key": "%s", "payload": {"ok": 1}}' % (EVENT_TYPE.encode(), EVENT_KEY.encode()),
        "/api/runs/": b'{"agent": "transfer-80", "input": "Send 80 to acme."}',
        "/api/sessions/": b'{"agent": "transfer-80", "metadata": {"ticket": "T-1"}}',
        "/api/webhooks/": b'{"url": "https://hooks.example.com/tollgate"}',
        f"/api/interrupts/{item_id}/approve/": b'{"comment": "fine"}',
    }


def _unchanged(before, wait: Wait) -> None:
    assert stored_state() == before
    assert (ExternalEvent.objects.count(), WebhookSubscription.objects.count()) == (0, 0)
    wait.refresh_from_db()
    assert wait.status == "pending"


@pytest.mark.parametrize("charset", ["rot13", "zlib", "base64", "hex", "bz2", "quopri", "uu"])
def test_a_charset_that_is_no_text_encoding_is_415_on_every_write_endpoint(people, core_approval_item, event_wait,
                                                                           charset):
    before = stored_state()
    client = _raw_client(people["approver"])
    for url, body in _bodies(core_approval_item.pk).items():
        response = client.generic("POST", url, body, content_type=f"application/json; charset={charset}")
        error = error_of(response, 415)
        assert error["code"] == "unsupported_media_type" and charset in error["message"], (url, error)
    _unchanged(before, event_wait)


@pytest.mark.parametrize("charset", ["punycode", "undefined", "utf-16"])
def test_a_body_its_charset_cannot_decode_is_400(people, core_approval_item, event_wait, charset):
    before = stored_state()
    client = _raw_client(people["approver"])
    for url, body in _bodies(core_approval_item.pk).items():
        response = client.generic("POST", url, body, content_type=f"application/json; charset={charset}",
                                  headers={"Idempotency-Key": f"charset-{charset}"})
        assert error_of(response, 400)["code"] == "parse_error", url
    _unchanged(before, event_wait)


LONE_SURROGATES = {
    "/api/events/": [b'{"type": "%s", "key": "%s", "payload": {"note": "\\ud800"}}' % (EVENT_TYPE.encode(),
                                                                                      EVENT_KEY.encode()),
                     b'{"type": "%s", "key": "%s", "payload": {"\\udfff": 1}}' % (EVENT_TYPE.encode(),
                                                                                   EVENT_KEY.encode())],
    "/api/sessions/": [b'{"agent": "transfer-80", "metadata": {"\\ud800": 1}}',
                       b'{"agent": "transfer-80", "metadata": {"notes": ["ok", "\\udc00"]}}',
                       b'{"agent": "transfer-80", "title": "\\ud800"}'],
    "/api/runs/": [b'{"agent": "transfer-80", "input": "Send \\udbff 80 to acme."}'],
    "/api/webhooks/": [b'{"url": "https://hooks.example.com/x", "event_types": ["\\ud800"]}'],
    "approve": [b'{"comment": "ok", "arguments": {"account": "acme", "amount": 10, "note": "\\ud800"}}'],
}


@pytest.mark.parametrize("with_key", [False, True], ids=["no-key", "idempotency-key"])
def test_a_lone_surrogate_anywhere_in_a_body_is_400_and_nothing_is_written(people, core_approval_item, event_wait,
                                                                          with_key):
    before = stored_state()
    client = _raw_client(people["approver"])
    for url, bodies in LONE_SURROGATES.items():
        url = f"/api/interrupts/{core_approval_item.pk}/approve/" if url == "approve" else url
        for n, body in enumerate(bodies):
            headers = {"Idempotency-Key": f"surrogate-{n}"} if with_key else {}
            response = client.generic("POST", url, body, content_type="application/json", headers=headers)
            error = error_of(response, 400)
            assert error["code"] == "parse_error" and "surrogate" in error["message"], (url, error)
    _unchanged(before, event_wait)


def test_a_surrogate_pair_is_one_character_and_is_accepted(people, event_wait):
    response = _raw_client(people["requester"]).generic(
        "POST", "/api/sessions/",
        b'{"agent": "attack-waits", "title": "\\ud83d\\ude00", "metadata": {"e": "\\ud83d\\ude00"}}',
        content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["title"] == "\U0001F600" and response.json()["metadata"] == {"e": "\U0001F600"}


DUPLICATE_KEYS = {
    "/api/events/": b'{"type": "%s", "key": "%s", "key": "K-other", "payload": {}}' % (EVENT_TYPE.encode(),
                                                                                        EVENT_KEY.encode()),
    "/api/runs/": b'{"agent": "transfer-80", "agent": "send-80", "input": "Send 80 to acme."}',
    "/api/sessions/": b'{"agent": "transfer-80", "metadata": {"ticket": "T-1", "ticket": "T-2"}}',
    "/api/webhooks/": b'{"url": "https://hooks.example.com/a", "url": "https://hooks.example.com/b"}',
    "approve": b'{"comment": "ok", "arguments": {"account": "acme", "amount": 10, "amount": 1000}}',
}


def test_a_key_given_twice_in_one_object_is_400_on_every_write_endpoint_and_nothing_is_written(
        people, core_approval_item, event_wait):
    before = stored_state()
    client = _raw_client(people["approver"])
    for url, body in DUPLICATE_KEYS.items():
        url = f"/api/interrupts/{core_approval_item.pk}/approve/" if url == "approve" else url
        error = error_of(client.generic("POST", url, body, content_type="application/json"), 400)
        assert error["code"] == "parse_error" and "more than once" in error["message"], (url, error)
    _unchanged(before, event_wait)
