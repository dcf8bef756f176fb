"""Attacks over real HTTP (``manage.py serve``, Daphne): how a body is framed, and errors Django answers itself.

Found by attacking the API:

* a body sent with ``Transfer-Encoding: chunked`` (no ``Content-Length``)
  was read as empty: ``approve`` with edited arguments approved the
  model's own arguments (80 transferred where the approver said 10).
  Now every such request is a 411 and nothing changes;
* a path under ``/api/`` that matches no route answered Django's HTML 404
  page, a 500 outside DRF its HTML page, and ``POST /api/runs/{id}/wait/``
  the CSRF failure page (HTML 403) instead of a 405: all are now the one
  error object.
"""

import json

import httpx
import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from approvals.models import Interrupt
from runs.models import Run
from tests.support.api import error_of
from tests.support.core import asking_agent, serving_core
from tests.support.security import core_approval_item, stored_state  # noqa: F401
from tools.models import ToolCall

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def served(people, tmp_path):
    """Base URL of ``manage.py serve`` against the test database (``serving_core``)."""
    with serving_core(people, tmp_path) as (base, _):
        yield base


def _headers(user) -> dict:
    token, _ = Token.objects.get_or_create(user=user)
    return {"Authorization": f"Token {token.key}", "Content-Type": "application/json"}


def _chunked(body: dict):
    """The body as a generator: httpx then sends it with ``Transfer-Encoding: chunked`` and no length."""
    text = json.dumps(body).encode()
    yield text[:10]
    yield text[10:]


def test_a_chunked_approval_with_edited_arguments_is_411_and_approves_nothing(served, people,
                                                                              core_approval_item):  # noqa: F811
    before = stored_state()
    url = f"{served}/api/interrupts/{core_approval_item.pk}/approve/"
    edited = {"arguments": {"account": "acme", "amount": 10}, "comment": "Only 10."}

    response = httpx.post(url, content=_chunked(edited), headers=_headers(people["approver"]), timeout=30)

    error = error_of(response, 411)
    assert error["code"] == "length_required" and "Content-Length" in error["message"]
    assert stored_state() == before
    core_approval_item.refresh_from_db()
    assert core_approval_item.status == "pending"
    assert ToolCall.objects.get(pk=core_approval_item.tool_call_id).status == "awaiting_approval"

    # The same request with its length is carried out as sent: the edited amount.
    sent = httpx.post(url, content=json.dumps(edited).encode(), headers=_headers(people["approver"]), timeout=30)
    assert sent.status_code == 200, sent.content
    assert Interrupt.objects.get(pk=core_approval_item.pk).edited_arguments == {"account": "acme", "amount": 10}


def test_chunked_bodies_are_411_on_every_write_endpoint(served, people):
    agent = asking_agent().slug
    before = stored_state()
    headers = _headers(people["requester"])
    for url, body in [("/api/runs/", {"agent": agent, "input": "Send 80 to acme."}),
                      ("/api/sessions/", {"agent": agent}),
                      ("/api/events/", {"type": "payment.settled", "key": "K-order-123-settlement"}),
                      ("/api/webhooks/", {"url": "https://hooks.example.com/x"})]:
        response = httpx.post(served + url, content=_chunked(body), headers=headers, timeout=30)
        assert error_of(response, 411)["code"] == "length_required", url
    assert stored_state() == before and not Run.objects.exists()
    page = httpx.post(f"{served}/accounts/login/", content=_chunked({"username": "x"}), timeout=30)
    assert page.status_code == 411  # pages too, as plain text


def test_errors_django_answers_under_api_have_the_one_error_shape(served, people):
    headers = _headers(people["requester"])
    for path in ["/api/nothing/", "/api/runs/abc/wait/", "/api/runs/1.5/", "/api/webhooks/abc/"]:
        response = httpx.get(served + path, headers=headers, timeout=30)
        assert error_of(response, 404)["code"] == "not_found", path
        assert response.headers["content-type"] == "application/json"

    posted = httpx.post(f"{served}/api/runs/1/wait/", headers=headers, timeout=30)
    assert error_of(posted, 405)["code"] == "method_not_allowed"
    assert posted.headers["allow"] == "GET"

    page = httpx.get(f"{served}/no-such-page/", timeout=30)
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")


def test_a_bug_under_api_outside_drf_is_a_500_in_the_error_shape(people, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug, with a secret detail")

    monkeypatch.setattr("runs.api.waits._timeout_s", broken)
    client = Client(raise_request_exception=False)
    client.force_login(people["requester"])

    response = client.get("/api/runs/1/wait/")

    error = error_of(response, 500)
    assert error["code"] == "server_error" and "secret" not in response.content.decode()


def test_the_schema_documents_411_on_every_post(people, api):
    schema = api(people["requester"]).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    posts = [(path, ops["post"]) for path, ops in schema["paths"].items() if "post" in ops]
    assert posts and all("411" in operation["responses"] for _, operation in posts)
