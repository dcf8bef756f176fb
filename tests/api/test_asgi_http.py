"""HTTP through the real ASGI application (``config.asgi``), as Daphne serves it.

The middleware chain and the view run synchronously, entered once from the
event loop (``SyncChainASGIHandler``). Django's default handler crossed
between the loop and the request's thread around fifteen times per request
with this project's middleware.
"""

import json

import pytest
from asgiref import sync
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from rest_framework.authtoken.models import Token

from approvals.models import Interrupt
from tests.support.security import core_approval_item  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _request(method: str, path: str, *, body: bytes = b"", headers=()) -> dict:
    """``{"status": int, "body": bytes, "headers": list}`` of one request sent to ``config.asgi.application``."""
    from config.asgi import application

    sent = [(b"host", b"testserver"), *headers]
    if body:
        sent.append((b"content-length", str(len(body)).encode()))
    communicator = HttpCommunicator(application, method, path, body=body, headers=sent)
    return async_to_sync(communicator.get_response)(timeout=10)


class _Hops:
    """Counts the crossings between the event loop and threads (``sync_to_async`` / ``async_to_sync`` calls)."""

    def __init__(self, monkeypatch):
        self.to_thread = self.to_loop = 0
        to_thread, to_loop = sync.SyncToAsync.__call__, sync.AsyncToSync.__call__

        def counted_to_thread(this, *args, **kwargs):
            self.to_thread += 1
            return to_thread(this, *args, **kwargs)

        def counted_to_loop(this, *args, **kwargs):
            self.to_loop += 1
            return to_loop(this, *args, **kwargs)

        monkeypatch.setattr(sync.SyncToAsync, "__call__", counted_to_thread)
        monkeypatch.setattr(sync.AsyncToSync, "__call__", counted_to_loop)


def test_an_approval_over_asgi_enters_the_request_thread_once(people, core_approval_item, monkeypatch):
    token = Token.objects.get_or_create(user=people["approver"])[0].key
    body = json.dumps({"comment": "ok"}).encode()
    hops = _Hops(monkeypatch)
    response = _request("POST", f"/api/interrupts/{core_approval_item.pk}/approve/", body=body, headers=[
        (b"authorization", f"Token {token}".encode()), (b"content-type", b"application/json")])
    assert response["status"] == 200, response["body"]
    assert json.loads(response["body"])["status"] == "resolved"
    assert Interrupt.objects.get(pk=core_approval_item.pk).status == "resolved"
    # request_started's receivers, the chain with the view, the response's close (request_finished)
    # (and this test's own one call into the loop)
    assert (hops.to_thread, hops.to_loop) == (3, 1)


def test_the_synchronous_chain_still_applies_every_middleware(people, core_approval_item):
    # CSRF (CsrfViewMiddleware.process_view): a session POST to a page without a token is refused
    from django.test import Client

    client = Client()
    client.force_login(people["approver"])
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    refused = _request("POST", f"/inbox/{core_approval_item.pk}/", body=b"decision=approved",
                       headers=[(b"cookie", cookie), (b"content-type", b"application/x-www-form-urlencoded")])
    assert refused["status"] == 403
    assert Interrupt.objects.get(pk=core_approval_item.pk).status == "pending"
    # LengthRequiredMiddleware answers a chunked body; the API's error shape comes back
    chunked = _request("POST", f"/api/interrupts/{core_approval_item.pk}/approve/",
                       headers=[(b"transfer-encoding", b"chunked")])
    assert chunked["status"] == 411 and json.loads(chunked["body"])["error"]["code"] == "length_required"
    # security headers (SecurityMiddleware, XFrameOptionsMiddleware, CSP) on a page
    page = _request("GET", "/accounts/login/")
    names = {name.lower() for name, _ in page["headers"]}
    assert page["status"] == 200
    assert {b"x-frame-options", b"x-content-type-options", b"content-security-policy"} <= names


def test_requests_one_after_another_run_in_one_kept_thread(people):
    """Each request's synchronous code (here ``request_started``'s receivers) runs in a thread of its own, and the
    thread is kept for the next request instead of being started anew."""
    import threading

    from django.core.signals import request_started

    seen = []

    def note(**_kwargs):
        seen.append(threading.current_thread())

    request_started.connect(note)
    try:
        for _ in range(3):
            assert _request("GET", "/accounts/login/")["status"] == 200
    finally:
        request_started.disconnect(note)
    assert len(seen) == 3 and seen[0] is not threading.current_thread()
    assert seen[0] is seen[1] is seen[2]


def test_requests_at_once_get_threads_of_their_own_and_at_most_idle_max_are_kept():
    from config.asgi import RequestThreads

    threads = RequestThreads(idle_max=1)
    first, second = threads.take(), threads.take()
    assert first is not second
    threads.give_back(first)
    threads.give_back(second)  # over idle_max: shut down
    assert threads.take() is first
    assert threads.take() is not second


def test_a_request_cut_short_does_not_give_its_thread_to_another(monkeypatch):
    from config.asgi import RequestThreads, SyncChainASGIHandler

    handler = SyncChainASGIHandler()
    handler.threads = RequestThreads()
    taken = []
    take = handler.threads.take
    monkeypatch.setattr(handler.threads, "take", lambda: taken.append(take()) or taken[-1])

    async def cut_short(scope, receive, send):
        raise RuntimeError("the client went away")

    monkeypatch.setattr(handler, "handle", cut_short)
    with pytest.raises(RuntimeError):
        async_to_sync(handler)({"type": "http"}, None, None)
    assert len(taken) == 1 and handler.threads.take() is not taken[0]
    with pytest.raises(RuntimeError):  # shut down, not kept
        taken[0].submit(print)
