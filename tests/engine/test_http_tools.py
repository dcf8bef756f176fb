"""HTTP tools (``tools.http``) against a real service on loopback that verifies every request's signature.

The service (``tests/support/fakes/tool_service.py``) is a ThreadingHTTPServer in
this process; nothing of httpx is mocked. Runs use the scripted provider
and the real Dramatiq worker of ``tests/conftest.py``.
"""

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from runs.engine.lifecycle import start_run
from runs.models import Message, RunEvent, RunStatus, WaitingReason
from runs.sweeping import sweep
from tests.support.bookings import (NIGHT, ROOM, SECRET, SECRET_ENV, book_room, book_room_env, booking_run,
                                    find_rooms, service, use)  # noqa: F401  (service: a fixture)
from tests.support.durability import make_agent, wait_for_lease_expiry
from tests.support.provider import decide
from tools import registry
from tools.http import check_endpoints, http_tool, tools_from_settings
from tools.models import ToolCall, ToolCallStatus
from tools.registry import ToolError, ToolUnavailable

S = ToolCallStatus
ROOT = Path(__file__).resolve().parents[2]
def drained(worker, run):
    worker.drain()
    run.refresh_from_db()
    return run


def test_a_run_calls_a_read_and_an_approved_side_effect_signed_with_keys_and_ids(people, worker, service, monkeypatch):
    find_rooms(monkeypatch)
    book_room(monkeypatch)
    run = drained(worker, booking_run(people))
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.APPROVAL)
    assert service.to("/tools/book") == [], "nothing is sent before the approval"

    run = decide(worker, run, people["approver"], "approved")

    assert run.status == RunStatus.COMPLETED
    read, = service.to("/tools/rooms")
    book, = service.to("/tools/book")
    rooms = ToolCall.objects.get(run=run, name="find_rooms")
    booking = ToolCall.objects.get(run=run, name="book_room")
    assert read["verified"] and book["verified"]
    assert read["body"] == {"tool": "find_rooms", "arguments": {"night": "2026-09-01"},
                            "idempotency_key": rooms.idempotency_key, "run_id": run.pk,
                            "tool_call_id": rooms.pk, "session_id": run.session_id}
    assert book["body"] == {"tool": "book_room", "arguments": {"room": 4, "night": "2026-09-01"},
                            "idempotency_key": booking.idempotency_key, "run_id": run.pk,
                            "tool_call_id": booking.pk, "session_id": run.session_id}
    assert booking.idempotency_key and book["headers"]["webhook-id"] == f"call_{booking.pk}_1"
    assert (rooms.status, rooms.result) == (S.SUCCEEDED, {"rooms": [4, 7], "night": "2026-09-01"})
    assert (booking.status, booking.result) == (S.SUCCEEDED, {"booking": "B-1", "room": 4})


def test_a_4xx_is_a_failed_call_the_model_is_told_about(people, worker, service, monkeypatch):
    book_room(monkeypatch, approval="never")
    service.mode("/tools/book", "refuse")
    run = drained(worker, booking_run(people, find=False))

    call = ToolCall.objects.get(run=run, name="book_room")
    assert run.status == RunStatus.COMPLETED
    assert call.status == S.FAILED
    assert call.error == "The tool's service refused the call (HTTP 409): Room 4 is taken that night."
    told, = Message.objects.filter(run=run, role="tool").values_list("content", flat=True)
    assert "Room 4 is taken that night." in told
    assert service.to("/tools/lookup") == [], "a refusal is definite: nothing to reconcile"


def test_a_side_effect_whose_answer_times_out_is_unknown_then_found_by_the_lookup(people, worker, service, monkeypatch):
    book_room(monkeypatch, approval="never", timeout_s=0.5)
    service.mode("/tools/book", "slow")  # books, then answers after 1.5 s: the answer is lost
    run = drained(worker, booking_run(people, find=False))

    call = ToolCall.objects.get(run=run, name="book_room")
    assert run.status == RunStatus.COMPLETED
    assert (call.status, call.result, call.attempts) == (S.SUCCEEDED, {"booking": "B-1", "room": 4}, 1)
    statuses = list(run.events.filter(type="tool_call", payload__tool_call=call.pk).values_list("to_status", flat=True))
    assert statuses[-2:] == ["unknown", "succeeded"]
    lookup, = service.to("/tools/lookup")
    assert lookup["verified"] and lookup["body"] == {"tool": "book_room", "idempotency_key": call.idempotency_key}
    assert len(service.to("/tools/book")) == 1, "never sent again blindly"


def test_a_5xx_side_effect_the_lookup_does_not_find_goes_to_a_person(people, worker, service, monkeypatch, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 1}
    book_room(monkeypatch, approval="never")
    service.mode("/tools/book", "fail")
    run = drained(worker, booking_run(people, find=False))

    call = ToolCall.objects.get(run=run, name="book_room")
    assert call.status == S.UNKNOWN and "HTTP 503" in call.error
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
    assert Interrupt.objects.filter(run=run, kind=InterruptKind.RECONCILIATION, status=InterruptStatus.PENDING).exists()
    assert len(service.to("/tools/lookup")) == 1 and len(service.to("/tools/book")) == 1


def test_a_lookup_answering_unknown_learns_nothing_and_sends_nothing_again(people, worker, service, monkeypatch,
                                                                           settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 1}
    book_room(monkeypatch, approval="never", idempotent=True)
    service.mode("/tools/book", "fail")
    service.mode("/tools/lookup", "unknown")
    run = drained(worker, booking_run(people, find=False))

    call = ToolCall.objects.get(run=run, name="book_room")
    assert call.status == S.UNKNOWN
    assert run.events.filter(type="reconciliation", reason__contains="cannot tell yet").exists()
    # Idempotent, and yet not sent again: before a re-send the call is looked up, and "unknown" is no answer.
    assert len(service.to("/tools/book")) == 1
    assert "Could not ask the external system before sending again" in call.error


def call_directly(tool, arguments):
    """Await ``tool``'s handler outside a run (the context's run and call are stand-ins with ids)."""
    context = SimpleNamespace(tool_call=SimpleNamespace(pk=7, attempts=1), run=SimpleNamespace(pk=3, session_id=5),
                              idempotency_key="k-1")
    return asyncio.run(tool.handler(context, arguments))


@pytest.mark.parametrize("mode, message", [
    ("huge", "larger than 100000 bytes"),
    ("not_json", "not JSON"),
    ("off_schema", "does not match the tool's result schema ((root): 'rooms' is a required property)"),
])
def test_an_unusable_answer_fails_a_read_and_leaves_a_side_effect_unknown(service, monkeypatch, mode, message):
    rooms = find_rooms(monkeypatch, result_schema={"type": "object", "required": ["rooms"]})
    book = book_room(monkeypatch, result_schema={"type": "object", "required": ["booking"]})
    service.mode("/tools/rooms", mode)
    service.mode("/tools/book", mode)

    with pytest.raises(ToolError) as read:
        call_directly(rooms, {"night": "2026-09-01"})
    with pytest.raises(ToolUnavailable) as side_effect:
        call_directly(book, {"room": 4, "night": "2026-09-01"})
    assert type(read.value) is ToolError, "a read fails at once, it is not retried"
    assert message.replace("'rooms'", "'booking'") in str(side_effect.value)
    assert message in str(read.value)


def test_an_unusable_side_effect_answer_in_a_run_is_unknown(people, worker, service, monkeypatch, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 1}
    book_room(monkeypatch, approval="never")
    service.mode("/tools/book", "not_json")
    service.mode("/tools/lookup", "not_json")
    run = drained(worker, booking_run(people, find=False))

    call = ToolCall.objects.get(run=run, name="book_room")
    assert call.status == S.UNKNOWN and "not JSON" in call.error
    assert run.events.filter(type="reconciliation", reason__contains="could not be asked (ToolUnavailable)").exists()


def test_an_unused_profile_at_a_refused_address_stops_the_start_too(settings, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    settings.TOLLGATE = {**settings.TOLLGATE, "TOOL_ENDPOINTS": {"spare": {
        "base_url": "https://169.254.169.254", "secret_env": SECRET_ENV}}}
    with pytest.raises(ImproperlyConfigured, match="TOLLGATE_TOOL_ENDPOINTS.'spare'.*metadata"):
        check_endpoints()


@pytest.mark.parametrize("base_url, profile, reason", [
    ("http://127.0.0.1:9", {}, "is this server"),
    ("http://127.8.0.1:9", {}, "loopback"),
    ("http://10.1.2.3:9", {}, "private network"),
    ("http://169.254.169.254", {"allow_private_networks": True}, "metadata"),
    ("https://93.184.216.34", {"allowed_hosts": [], "allow_http": False}, None),
    ("http://93.184.216.34", {"allow_http": False}, "plain http is off"),
])
def test_a_profile_at_a_refused_address_is_rejected_unless_allowed(settings, monkeypatch, base_url, profile, reason):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    settings.TOLLGATE = {**settings.TOLLGATE, "TOOL_ENDPOINTS": {"bookings": {
        "base_url": base_url, "secret_env": SECRET_ENV, "allow_http": True, **profile}}}
    declare = dict(name="find_rooms", description="d", parameters=NIGHT, endpoint="bookings", path="/tools/rooms")
    if reason is None:
        assert http_tool(**declare).name == "find_rooms"
        return
    with pytest.raises(ImproperlyConfigured, match=reason) as refused:
        http_tool(**declare)
    assert "TOLLGATE_TOOL_ENDPOINTS['bookings']" in str(refused.value)
    settings.TOLLGATE["TOOL_ENDPOINTS"]["bookings"]["allowed_hosts"] = [base_url.split("/")[2].split(":")[0]]
    if reason != "plain http is off":
        assert http_tool(**declare).name == "find_rooms", "an operator may trust the address"


def test_a_name_resolving_to_loopback_at_call_time_is_refused_and_nothing_sent(service, monkeypatch, settings):
    """DNS rebinding: the profile's name resolved to a public address at start, to loopback at the call."""
    import socket

    real = socket.getaddrinfo
    public = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 80))]
    loopback = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", service.server.server_address[1]))]
    answers = {"tools.example.com": public}
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: answers[host] if host in answers else real(host, *a, **k))
    settings.TOLLGATE["TOOL_ENDPOINTS"]["bookings"] = {
        "base_url": f"http://tools.example.com:{service.server.server_address[1]}", "secret_env": SECRET_ENV,
        "allow_http": True}
    rooms = find_rooms(monkeypatch)
    answers["tools.example.com"] = loopback

    with pytest.raises(ToolError, match="may not call; nothing was sent"):
        call_directly(rooms, {"night": "2026-09-01"})
    assert service.to("/tools/rooms") == []


def test_the_secret_is_in_no_event_error_log_or_api_answer(people, worker, service, monkeypatch, api, caplog, settings):
    caplog.set_level(logging.DEBUG)
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 1}
    find_rooms(monkeypatch)
    book_room(monkeypatch, approval="never")
    service.mode("/tools/book", "fail")
    run = drained(worker, booking_run(people))
    monkeypatch.delenv(SECRET_ENV)  # gone at the next call: nothing is sent, and the error names no value
    with pytest.raises(ToolError, match="has no signing secret on this server; nothing was sent"):
        call_directly(registry.get_tool("find_rooms"), {"night": "x"})

    key = SECRET.removeprefix("whsec_")
    seen = [caplog.text, json.dumps(list(RunEvent.objects.values()), default=str),
            json.dumps(list(ToolCall.objects.values()), default=str)]
    for path in (f"/api/runs/{run.pk}/", f"/api/runs/{run.pk}/tool-calls/", f"/api/runs/{run.pk}/events/", "/api/tools/",
                 "/api/interrupts/"):
        answer = api(people["admin"]).get(path)
        assert answer.status_code == 200, path
        seen.append(answer.content.decode())
    assert len(service.requests) >= 2
    for text in seen:
        assert key not in text and base64.b64decode(key).decode() not in text


@pytest.mark.parametrize("entries, message", [
    ([{"name": "x", "description": "d", "parameters": NIGHT, "endpoint": "nowhere", "path": "/x"}],
     "Unknown tool endpoint 'nowhere'; known: bookings"),
    ([{"name": "x", "description": "d", "parameters": NIGHT, "endpoint": "bookings"}],
     r"TOLLGATE_HTTP_TOOLS\[0\] \('x'\): missing path"),
    ([{"name": "x", "description": "d", "parameters": NIGHT, "endpoint": "bookings", "path": "/x", "url": "y"}],
     "unknown key.s. url"),
    ([{"name": "x", "description": "d", "parameters": NIGHT, "endpoint": "bookings", "path": "/x",
       "reconcile_path": "/y"}], "reconcile_path needs side_effect=True"),
    ([{"name": "x", "description": "d", "parameters": NIGHT, "endpoint": "bookings", "path": "/x",
       "result_schema": {"type": "nonsense"}}], "result_schema is not a JSON Schema"),
    ([{"name": "x", "description": "d", "parameters": NIGHT, "endpoint": "bookings", "path": "/x",
       "approval": "amount >"}], r"TOLLGATE_HTTP_TOOLS\[0\] \('x'\)"),
    ({"name": "x"}, "must be a JSON list"),
])
def test_misdeclared_tools_are_refused_with_a_clear_message(service, settings, entries, message):
    settings.TOLLGATE = {**settings.TOLLGATE, "HTTP_TOOLS": entries}
    with pytest.raises(ImproperlyConfigured, match=message):
        tools_from_settings()


@pytest.mark.parametrize("profile, environment, message", [
    ({}, {}, "BOOKINGS_TOOLS_SECRET .its \"secret_env\". is not set"),
    ({}, {SECRET_ENV: "not-a-secret"}, "does not hold a Standard Webhooks secret"),
    ({"secret_env": ""}, {}, "must name the environment variable"),
    ({"base_url": "ftp://example.com"}, {SECRET_ENV: SECRET}, "valid http"),
    ({"base_url": "https://[::1/x"}, {SECRET_ENV: SECRET}, "without query or fragment"),
    ({"max_response_bytes": 0}, {SECRET_ENV: SECRET}, "max_response_bytes"),
    ({"token": "abc"}, {SECRET_ENV: SECRET}, "unknown key.s. token"),
])
def test_misconfigured_profiles_are_refused_naming_the_variable_never_its_value(settings, monkeypatch, profile,
                                                                               environment, message):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    settings.TOLLGATE = {**settings.TOLLGATE, "TOOL_ENDPOINTS": {"bookings": {
        "base_url": "https://93.184.216.34", "secret_env": SECRET_ENV, **profile}}}
    with pytest.raises(ImproperlyConfigured, match=message) as refused:
        http_tool(name="x", description="d", parameters=NIGHT, endpoint="bookings", path="/x")
    assert "not-a-secret" not in str(refused.value)


def test_a_misconfigured_http_tool_stops_the_start(tmp_path):
    """``manage.py check`` (any start) fails with the message, not a traceback deep in a call later."""
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
                   "TOLLGATE_TOOL_ENDPOINTS": json.dumps({"bookings": {"base_url": "https://127.0.0.1:8443",
                                                                       "secret_env": SECRET_ENV}}),
                   "TOLLGATE_HTTP_TOOLS": json.dumps([{"name": "book_room", "description": "d", "parameters": ROOM,
                                                       "endpoint": "bookings", "path": "/tools/book"}]),
                   SECRET_ENV: SECRET}
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "ImproperlyConfigured: TOLLGATE_TOOL_ENDPOINTS['bookings']: \"base_url\" is refused. Refused: 127.0.0.1 " \
           "is this server." in done.stderr
    assert SECRET not in done.stderr

    environment["TOLLGATE_TOOL_ENDPOINTS"] = json.dumps({"bookings": {
        "base_url": "https://127.0.0.1:8443", "secret_env": SECRET_ENV, "allowed_hosts": ["127.0.0.1"]}})
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("point", ["tool_call_started:book_room", "tool_call_returned:book_room"])
def test_a_worker_killed_around_the_send_keeps_the_idempotency_key_and_books_once(
        point, people, service, monkeypatch, settings, idle_worker, worker_process):
    """The worker that sends the booking is another process, SIGKILLed just before the POST or just after its
    answer; a fresh worker looks the key up and sends again only what never arrived, under the same key."""
    book_room(monkeypatch, approval="never", idempotent=True)
    agent = make_agent("booker", [{"tool_calls": [{"name": "book_room", "arguments": {"room": 4, "night": "2026-09-01"}}]},
                                  {"content": "Booked."}], tools=["book_room"])
    run = start_run(agent=agent, user=people["requester"], input="Book room 4.")

    assert worker_process(run.pk, failpoint=point, env=book_room_env(settings, idempotent=True)) == -9
    idle_worker.worker.start()
    wait_for_lease_expiry(run.pk)
    assert sweep()["reenqueued"] >= 1
    run = drained(idle_worker, run)

    booking = ToolCall.objects.get(run=run, name="book_room")
    assert (run.status, booking.status) == (RunStatus.COMPLETED, S.SUCCEEDED)
    sent = service.to("/tools/book")
    assert {request["body"]["idempotency_key"] for request in sent} == {booking.idempotency_key}
    assert all(request["verified"] for request in sent + service.to("/tools/lookup"))
    assert [request["body"]["idempotency_key"] for request in service.to("/tools/lookup")] == [booking.idempotency_key]
    assert list(service.bookings) == [booking.idempotency_key]  # one booking
    # Sent by the killed worker only when it died after the answer; else sent once, by the fresh one.
    assert len(sent) == 1 and booking.result == service.bookings[booking.idempotency_key]


def test_the_inbox_item_and_the_api_say_where_an_http_tool_lives(people, worker, service, monkeypatch, client):
    book_room(monkeypatch)
    run = drained(worker, booking_run(people, find=False))
    item = Interrupt.objects.get(run=run, kind=InterruptKind.APPROVAL)
    client.force_login(people["approver"])

    page = client.get(f"/inbox/{item.pk}/").content.decode()
    assert 'id="tool-location"' in page and "Runs outside Tollgate: HTTP bookings /tools/book." in page
    listed = {tool["name"]: tool for tool in client.get("/api/tools/").json()["results"]}
    assert listed["book_room"]["location"] == "HTTP bookings /tools/book" and listed["fake_lookup"]["location"] == ""


def test_a_service_that_cannot_be_reached_raises_not_sent(settings, monkeypatch):
    """A refused connection is ``ToolNotSent`` (nothing left); the engine may send any call again."""
    import socket

    from tools.registry import ToolContext, ToolNotSent

    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv(SECRET_ENV, SECRET)
    settings.TOLLGATE = {**settings.TOLLGATE, "TOOL_ENDPOINTS": {"bookings": {
        "base_url": f"http://127.0.0.1:{port}", "secret_env": SECRET_ENV, "allowed_hosts": ["127.0.0.1"],
        "allow_http": True}}}
    tool = http_tool(name="book_room", description="Book a room.", parameters=ROOM, endpoint="bookings",
                     path="/tools/book", side_effect=True)
    run = SimpleNamespace(pk=1, session_id=2)
    context = ToolContext(run=run, user=None, idempotency_key="k-1", timeout_s=5,
                          tool_call=SimpleNamespace(pk=3, attempts=1))
    with pytest.raises(ToolNotSent, match="nothing was sent"):
        asyncio.run(tool.handler(context, {"room": 4, "night": "2026-09-01"}))


def test_a_temporary_dns_failure_is_not_sent_and_the_side_effect_is_sent_after_a_backoff(
        people, worker, service, monkeypatch, settings):
    """The endpoint's name fails to resolve once (EAI_AGAIN): the request never left, so the booking is sent
    again after a backoff, not failed (nor ``unknown``)."""
    import socket

    real, failures = socket.getaddrinfo, []
    port = service.server.server_address[1]

    def resolve(host, *args, **kwargs):
        if host != "tools.example.com":
            return real(host, *args, **kwargs)
        if failures:
            raise failures.pop()
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    settings.TOLLGATE["TOOL_ENDPOINTS"]["bookings"]["base_url"] = f"http://tools.example.com:{port}"
    settings.TOLLGATE["TOOL_ENDPOINTS"]["bookings"]["allowed_hosts"] = ["tools.example.com"]
    book_room(monkeypatch, approval="never", backoff_s=0.01)  # resolved here, at the declaration
    failures.append(socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"))  # then at the call
    run = drained(worker, booking_run(people, find=False))

    call = ToolCall.objects.get(run=run, name="book_room")
    assert (run.status, call.status, call.attempts) == (RunStatus.COMPLETED, S.SUCCEEDED, 2)
    assert run.events.filter(type="tool_call", payload__tool_call=call.pk, reason="retrying").exists()
    assert len(service.to("/tools/book")) == 1 and list(service.bookings) == [call.idempotency_key]
