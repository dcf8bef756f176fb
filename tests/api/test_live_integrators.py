"""Issue 11: integrators' WebSockets at ``ws/api/runs/<id>/``: an API token, no Origin, resume from an event seq.

Every socket goes through the real ASGI application (``config.asgi``) and
the configured channel layer (Redis in the PostgreSQL pass). Events are
written by the real services (the worker, ``cancel_run_as``,
``append_event``) and must arrive as the log holds them: each once, in
``seq`` order, after the ``after_seq`` the client gave.
"""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from rest_framework.authtoken.models import Token

from config.ws_throttle import ConnectThrottleMiddleware
from runs.web import consumers
from runs.engine.lifecycle import cancel_run_as
from runs.models import Run, RunEvent
from runs.services import append_event
from tests.support.security import core_approval_item  # noqa: F401 - a run waiting for an approval, with events

pytestmark = pytest.mark.django_db(transaction=True)

APPROVERS_GROUP = "approvers"


def _key(user) -> str:
    return Token.objects.get_or_create(user=user)[0].key


def _socket(path: str, *, token: str | None = None, headers=(), subprotocols=None,
            client: str | None = None) -> WebsocketCommunicator:
    """A handshake as a program sends it: Host, no Origin, no cookie, unless ``headers`` add them;
    from address ``client`` when given (the server's ``scope["client"]``)."""
    from config.asgi import application

    sent = [(b"host", b"testserver"), *headers]
    if token is not None:
        sent.append((b"authorization", f"Token {token}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=sent, subprotocols=subprotocols)
    if client is not None:
        communicator.scope["client"] = (client, 50000)
    return communicator


def _seqs(run_id: int) -> list[int]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))


async def _next_events(communicator, count: int) -> list[dict]:
    """The next ``count`` ``run.event`` messages (snapshots and deltas in between skipped)."""
    events = []
    while len(events) < count:
        message = await communicator.receive_json_from(timeout=10)
        if message["type"] == "run.event":
            events.append(message["event"])
    return events


async def _no_more_events(communicator) -> None:
    """Nothing but snapshots arrives within half a second (no duplicate, no stray event)."""
    while not await communicator.receive_nothing(timeout=0.5):
        message = await communicator.receive_json_from(timeout=5)
        assert message["type"] != "run.event", message


def _connects(communicator) -> bool:
    @async_to_sync
    async def attempt():
        connected, _ = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return connected

    return attempt()


def test_a_token_socket_without_origin_or_cookie_gets_the_whole_log_then_live_events(people, core_approval_item):
    run_id = core_approval_item.run_id
    stored = _seqs(run_id)
    assert stored == list(range(1, len(stored) + 1)) and len(stored) >= 3

    @async_to_sync
    async def scenario():
        communicator = _socket(f"/ws/api/runs/{run_id}/", token=await database_sync_to_async(_key)(people["requester"]))
        connected, subprotocol = await communicator.connect(timeout=5)
        assert connected and subprotocol is None
        first = await communicator.receive_json_from(timeout=5)
        assert first["type"] == "run.update" and first["run"]["status"] == "waiting"
        backlog = await _next_events(communicator, len(stored))
        run = await database_sync_to_async(Run.objects.get)(pk=run_id)
        await database_sync_to_async(cancel_run_as)(run=run, user=people["requester"])
        live_seqs = await database_sync_to_async(lambda: _seqs(run_id)[len(stored):])()
        live = await _next_events(communicator, len(live_seqs))
        await _no_more_events(communicator)
        await communicator.disconnect()
        return backlog, live, live_seqs

    backlog, live, live_seqs = scenario()
    assert [event["seq"] for event in backlog] == stored
    assert backlog[0] == {**backlog[0], "type": "transition", "reason": "created", "to_status": "queued"}
    assert set(backlog[0]) == {"seq", "type", "from_status", "to_status", "actor", "reason", "payload", "created_at"}
    assert live_seqs and [event["seq"] for event in live] == live_seqs
    assert any(event["to_status"] == "cancelled" for event in live)


def test_resume_after_seq_sends_exactly_the_later_events_in_order_then_live_ones(people, core_approval_item):
    run_id = core_approval_item.run_id
    stored = _seqs(run_id)
    after = stored[1]

    @async_to_sync
    async def scenario():
        key = await database_sync_to_async(_key)(people["requester"])
        communicator = _socket(f"/ws/api/runs/{run_id}/?after_seq={after}", token=key)
        assert (await communicator.connect(timeout=5))[0]
        resumed = await _next_events(communicator, len(stored) - after)
        await database_sync_to_async(_note)(run_id, "one")
        await database_sync_to_async(_note)(run_id, "two")
        live = await _next_events(communicator, 2)
        await _no_more_events(communicator)
        await communicator.disconnect()
        return resumed, live

    resumed, live = scenario()
    assert [event["seq"] for event in resumed] == stored[after:]
    assert [(event["seq"], event["reason"]) for event in live] == [(stored[-1] + 1, "one"), (stored[-1] + 2, "two")]


def test_resume_from_the_last_seq_sends_only_new_events(people, core_approval_item):
    run_id = core_approval_item.run_id
    last = _seqs(run_id)[-1]

    @async_to_sync
    async def scenario():
        key = await database_sync_to_async(_key)(people["requester"])
        communicator = _socket(f"/ws/api/runs/{run_id}/?after_seq={last}", token=key)
        assert (await communicator.connect(timeout=5))[0]
        await _no_more_events(communicator)
        await database_sync_to_async(_note)(run_id, "new")
        live = await _next_events(communicator, 1)
        await communicator.disconnect()
        return live

    assert [(event["seq"], event["reason"]) for event in scenario()] == [(last + 1, "new")]


def _note(run_id: int, reason: str) -> None:
    """Append (and commit) one event to the run's log, as any writer does."""
    with transaction.atomic():
        append_event(Run.objects.get(pk=run_id), type="note", actor="system", reason=reason)


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_event_committed_during_the_first_read_is_sent_once(people, core_approval_item, monkeypatch, when):
    """The socket joins the group before it reads the log: an event committed just before or just after
    that read (after the join) arrives once, in its place."""
    run_id = core_approval_item.run_id
    stored = _seqs(run_id)
    real_read = consumers._events_after
    calls = []

    async def read_with_a_commit_around_the_first(run, seq):
        calls.append(seq)
        if len(calls) == 1 and when == "before":
            await database_sync_to_async(_note)(run_id, "racing")
        events = await real_read(run, seq)
        if len(calls) == 1 and when == "after":
            await database_sync_to_async(_note)(run_id, "racing")
        return events

    monkeypatch.setattr(consumers, "_events_after", read_with_a_commit_around_the_first)

    @async_to_sync
    async def scenario():
        key = await database_sync_to_async(_key)(people["requester"])
        communicator = _socket(f"/ws/api/runs/{run_id}/", token=key)
        assert (await communicator.connect(timeout=5))[0]
        events = await _next_events(communicator, len(stored) + 1)
        await _no_more_events(communicator)
        await communicator.disconnect()
        return events

    events = scenario()
    assert [event["seq"] for event in events] == [*stored, stored[-1] + 1]
    assert events[-1]["reason"] == "racing"


def test_the_token_may_come_as_a_subprotocol_and_is_not_echoed(people, core_approval_item):
    @async_to_sync
    async def scenario():
        key = await database_sync_to_async(_key)(people["requester"])
        communicator = _socket(f"/ws/api/runs/{core_approval_item.run_id}/",
                               subprotocols=["tollgate", f"tollgate.token.{key}"])
        connected, subprotocol = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return connected, subprotocol

    assert scenario() == (True, "tollgate")


def test_bad_missing_or_misplaced_tokens_are_refused(people, core_approval_item):
    key = _key(people["requester"])
    path = f"/ws/api/runs/{core_approval_item.run_id}/"
    assert _connects(_socket(path, token=key))  # the control
    assert not _connects(_socket(path))
    assert not _connects(_socket(path, token="0" * 40))
    assert not _connects(_socket(path, token=key[:-1]))
    assert not _connects(_socket(path, headers=[(b"authorization", f"Bearer {key}".encode())]))
    assert not _connects(_socket(f"{path}?token={key}"))  # never in the query string
    assert not _connects(_socket(path, subprotocols=[f"tollgate.token.{key}"]))  # would have to echo it
    people["requester"].is_active = False
    people["requester"].save()
    assert not _connects(_socket(path, token=key))


def test_another_users_run_is_refused_and_deciders_see_it(people, core_approval_item):
    stranger = get_user_model().objects.create_user("stranger", password="x")
    path = f"/ws/api/runs/{core_approval_item.run_id}/"
    assert not _connects(_socket(path, token=_key(stranger)))
    assert not _connects(_socket("/ws/api/runs/999999/", token=_key(people["requester"])))
    assert _connects(_socket(path, token=_key(people["approver"])))  # sees every run, as in the REST API


def test_the_token_route_never_accepts_a_session_cookie(client, people, core_approval_item):
    """A page on another site cannot open an integrator socket with a user's cookie (CSWSH)."""
    client.force_login(people["requester"])
    cookie = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())
    path = f"/ws/api/runs/{core_approval_item.run_id}/"
    assert not _connects(_socket(path, headers=[cookie, (b"origin", b"http://evil.example")]))
    assert not _connects(_socket(path, headers=[cookie, (b"origin", b"http://testserver")]))
    # The browser route keeps its checks: a cookie without an Origin, or from another origin, is refused.
    assert not _connects(_socket(f"/ws/runs/{core_approval_item.run_id}/", headers=[cookie]))
    assert not _connects(_socket(f"/ws/runs/{core_approval_item.run_id}/",
                                 headers=[cookie, (b"origin", b"http://evil.example")]))
    assert _connects(_socket(f"/ws/runs/{core_approval_item.run_id}/",
                             headers=[cookie, (b"origin", b"http://testserver")]))


def test_a_bad_after_seq_closes_with_4400(people, core_approval_item):
    @async_to_sync
    async def scenario(query):
        key = await database_sync_to_async(_key)(people["requester"])
        communicator = _socket(f"/ws/api/runs/{core_approval_item.run_id}/?{query}", token=key)
        assert (await communicator.connect(timeout=5))[0]
        while (message := await communicator.receive_output(timeout=5))["type"] != "websocket.close":
            pass
        await communicator.disconnect()
        return message["code"]

    for query in ("after_seq=-1", "after_seq=x", "after_seq=1&after_seq=2", "after_seq=2147483648",
                  "after_seq=99999999999", "after_seq=%EF%BC%91"):
        assert scenario(query) == 4400, query


def _closed_after(people, run_id: int, user, act) -> dict:
    """Connect as ``user`` by token, do ``act`` (in a thread), append an event; the next non-event output."""

    @async_to_sync
    async def scenario():
        key = await database_sync_to_async(_key)(user)
        last = (await database_sync_to_async(_seqs)(run_id))[-1]
        communicator = _socket(f"/ws/api/runs/{run_id}/?after_seq={last}", token=key)
        assert (await communicator.connect(timeout=5))[0]
        assert (await communicator.receive_json_from(timeout=5))["type"] == "run.update"
        await database_sync_to_async(act)()
        await database_sync_to_async(_note)(run_id, "after the change")
        message = await communicator.receive_output(timeout=5)
        await communicator.disconnect()
        return message

    return scenario()


def test_deleting_the_token_closes_its_sockets(people, core_approval_item):
    message = _closed_after(people, core_approval_item.run_id, people["requester"],
                            lambda: Token.objects.filter(user=people["requester"]).delete())
    assert message == {"type": "websocket.close", "code": 4403}


def test_losing_the_permission_closes_a_deciders_socket(people, core_approval_item):
    group = Group.objects.get(name=APPROVERS_GROUP)
    message = _closed_after(people, core_approval_item.run_id, people["approver"],
                            lambda: people["approver"].groups.remove(group))
    assert message == {"type": "websocket.close", "code": 4403}


def test_the_socket_streams_on_while_access_holds(people, core_approval_item):
    message = _closed_after(people, core_approval_item.run_id, people["requester"], lambda: None)
    assert message["type"] == "websocket.send" and '"after the change"' in message["text"]


def _outcome(communicator):
    """``"open"`` (accepted, the log follows), ``"refused"`` (at the handshake) or the close code sent at once."""
    @async_to_sync
    async def attempt():
        connected, _ = await communicator.connect(timeout=5)
        if not connected:
            result = "refused"
        else:
            first = await communicator.receive_output(timeout=10)
            result = first["code"] if first["type"] == "websocket.close" else "open"
        await communicator.disconnect()
        return result

    return attempt()


def test_connection_attempts_are_limited_per_token_and_per_address(people, core_approval_item, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "WS_CONNECT_RATES": {"token": "3/hour", "address": "5/hour"}}
    path = f"/ws/api/runs/{core_approval_item.run_id}/"
    key, other_key = _key(people["requester"]), _key(people["approver"])

    # One token from a new address each time: the token's own count stops it.
    assert [_outcome(_socket(path, token=key, client=f"192.0.2.{n}")) for n in range(4)] == ["open"] * 3 + [4429]
    assert _outcome(_socket(path, token=other_key, client="192.0.2.9")) == "open"

    # Guessed tokens from one address: refused one by one, then the address is over its rate (before any lookup).
    guesses = [_outcome(_socket(path, token=f"{n:040d}", client="198.51.100.9")) for n in range(6)]
    assert guesses == ["refused"] * 5 + [4429]
    third_key = _key(people["admin"])
    assert _outcome(_socket(path, token=third_key, client="198.51.100.9")) == 4429  # a good token does not help
    made_up = [(b"x-forwarded-for", b"203.0.113.1")]  # nor does a made-up X-Forwarded-For
    assert _outcome(_socket(path, token=third_key, client="198.51.100.9", headers=made_up)) == 4429
    assert _outcome(_socket(path, token=third_key, client="198.51.100.10")) == "open"  # another address


def test_a_refused_attempt_answers_the_subprotocol_offered_and_a_bad_rate_stops_the_start(people, core_approval_item,
                                                                                          settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "WS_CONNECT_RATES": {"token": "1/day", "address": "100/day"}}
    key = _key(people["requester"])

    @async_to_sync
    async def offer_twice():
        answers = []
        for _ in range(2):
            communicator = _socket(f"/ws/api/runs/{core_approval_item.run_id}/",
                                   subprotocols=["tollgate", f"tollgate.token.{key}"])
            answers.append(await communicator.connect(timeout=5))
            if answers[-1][0]:
                first = await communicator.receive_output(timeout=10)
                answers[-1] += (first.get("code"),)
            await communicator.disconnect()
        return answers

    assert offer_twice() == [(True, "tollgate", None), (True, "tollgate", 4429)]
    settings.TOLLGATE = {**settings.TOLLGATE, "WS_CONNECT_RATES": {"token": "many/min", "address": "100/day"}}
    with pytest.raises(ImproperlyConfigured):
        ConnectThrottleMiddleware(None)
