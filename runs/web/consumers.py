"""WebSocket consumers: live run snapshots for browsers and integrators.

* ``RunConsumer`` at ``ws/runs/<id>/``: one run. Sends the current
  snapshot on connect, then every ``run.update`` and ``run.delta`` that
  ``runs.live`` publishes to the run's group. It joins the group before
  it reads the snapshot, so no change falls between the two.
* ``RunListConsumer`` at ``ws/runs/``: ``run.update`` of every run the user
  may see (the inbox and run list refresh on them).
* ``RunEventsConsumer`` at ``ws/api/runs/<id>/?after_seq=N`` (integrators,
  API token: ``config.ws_token``): what ``RunConsumer`` sends, plus every
  event of the run's log after ``seq`` N (default 0: all), in ``seq``
  order, as ``{"type": "run.event", "event": {...}}`` (the fields of
  ``GET /api/runs/{id}/events/``), first the stored ones, then each new
  one once committed. It joins the run's ``run-events`` group before it
  reads the log and reads the log again on every notice, sending only
  what follows the last ``seq`` it sent: an event committed during the
  first read is sent once, none is skipped. A bad ``after_seq`` closes
  the socket with 4400 after the handshake.

Only authenticated users who may see the run
(``Run.objects.visible_to``, ``runs.access``) are accepted; anyone else
is closed before the handshake completes. Access is then kept per socket
as the rule's facts (``runs.access.RunAccess``: who the user is, if
still logged in, and whether they see every run) and checked again
against the user as stored now (``current_user``) whenever
``runs.web.access_signals`` says the user's access may have changed (a
logout, a password change, a deactivation, a change of groups or
permissions: the ``access.changed`` message to the user's group), and in
any case before forwarding an event when the last check is older than
``TOLLGATE["LIVE_ACCESS_RECHECK_S"]`` seconds (a backstop for changes no
signal reports, such as a session deleted from its store). A socket
whose access is gone is closed (code 4403). So forwarding an event costs
no query, while revocation still takes effect before the next event.
The consumers are thin: load, check, forward. They never change a run.
"""

import time
from importlib import import_module
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.models import AnonymousUser
from django.utils.crypto import constant_time_compare

from config.ws_token import SUBPROTOCOL, token_owner
from runs import selectors
from runs.access import RunAccess
from runs.live import RUNS_GROUP, run_events_group, run_group, run_snapshot, user_group
from runs.api.serializers import RunEventSerializer

ACCESS_LOST = 4403  # close code: the user may no longer see this
BAD_REQUEST = 4400  # close code: the handshake's query is invalid (after_seq)
EVENTS_PER_READ = 500  # events read from the log per query
MAX_SEQ = 2**31 - 1  # the largest seq a RunEvent can have (PositiveIntegerField)


def current_user(scope):
    """The user of the socket's ``scope`` as the database has them now, or ``AnonymousUser``.

    With a session (browsers): the session is read again from its store,
    so a logout (session deleted), a login as someone else or a password
    change (session hash) counts. With an API token (integrators): the
    token must still exist and belong to the same user. Without either
    (tests, other authentication): the scope's user reloaded by id.
    Inactive users are anonymous. Synchronous: call through
    ``database_sync_to_async``.
    """
    anonymous = AnonymousUser()
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return anonymous
    if scope.get("auth_token"):
        owner = token_owner(scope["auth_token"])
        return owner if owner is not None and owner.pk == user.pk else anonymous
    session = scope.get("session")
    if session is None:
        fresh = get_user_model().objects.filter(pk=user.pk, is_active=True).first()
        return fresh or anonymous
    if not session.session_key:
        return anonymous
    stored = import_module(settings.SESSION_ENGINE).SessionStore(session.session_key)
    try:
        user_pk = get_user_model()._meta.pk.to_python(stored[SESSION_KEY])
        backend = load_backend(stored[BACKEND_SESSION_KEY])
    except (KeyError, ImportError, ValueError):
        return anonymous
    fresh = backend.get_user(user_pk)
    if fresh is None or fresh.pk != user.pk or not getattr(fresh, "is_active", True):
        return anonymous
    if hasattr(fresh, "get_session_auth_hash"):
        if not constant_time_compare(stored.get(HASH_SESSION_KEY, ""), fresh.get_session_auth_hash()):
            return anonymous
    return fresh


@database_sync_to_async
def _visible_snapshot(user, run_id: int) -> dict | None:
    run = selectors.run_get_visible(user=user, run_id=run_id)
    return run_snapshot(run) if run is not None else None


@database_sync_to_async
def _access_now(scope) -> RunAccess:
    """The access facts of the socket's user as the database has them now."""
    return RunAccess.of(current_user(scope))


class _LiveConsumer(AsyncJsonWebsocketConsumer):
    """What both consumers share: the user's access group and the access facts (see module doc)."""

    groups_joined: tuple[str, ...] = ()
    access = RunAccess(None)
    checked_at = 0.0
    subprotocol: str | None = None  # selected in the handshake's answer

    async def dispatch(self, message):
        """Hand ``message`` to its handler (a type without one goes to Channels, which raises ``ValueError``),
    without closing stale database connections first as Channels' own does (docs/design.md#live-pushes)."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            await super().dispatch(message)
            return
        await handler(message)

    async def join(self, *groups: str) -> None:
        """Join ``groups`` and the user's access group, then accept the socket."""
        await self.subscribe(*groups)
        await self.accept(self.subprotocol)

    async def subscribe(self, *groups: str) -> None:
        """Join ``groups`` and the user's access group, without accepting the socket yet (``leave`` undoes it)."""
        self.groups_joined = (*groups, user_group(self.scope["user"].pk))
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)

    async def leave(self) -> None:
        """Leave the groups joined (``subscribe``), each once."""
        joined, self.groups_joined = self.groups_joined, ()
        for group in joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def reject(self) -> None:
        """Leave the groups joined, close the socket before the handshake completes and stop the consumer:
        what reached its groups meanwhile is dropped, never handled (raises ``StopConsumer``)."""
        await self.leave()
        await self.close()
        raise StopConsumer()

    async def disconnect(self, code):
        await self.leave()

    async def receive_json(self, content, **kwargs):
        """Clients have nothing to say; incoming messages are ignored."""

    async def check_access(self) -> None:
        self.access = await _access_now(self.scope)
        self.checked_at = time.monotonic()

    def may_see(self, requested_by: int) -> bool:
        """Whether the access facts let the user see a run requested by user ``requested_by``."""
        return self.access.sees(requested_by)

    async def still_allowed(self, requested_by: int) -> bool:
        """``may_see`` after a re-check when the facts are stale; closes the socket (4403) when not."""
        if time.monotonic() - self.checked_at > settings.TOLLGATE["LIVE_ACCESS_RECHECK_S"]:
            await self.check_access()
        if self.may_see(requested_by):
            return True
        await self.close(code=ACCESS_LOST)
        return False

    async def access_changed(self, event):
        """The user's access may have changed: a logout of this very session closes at once, else re-check."""
        session = self.scope.get("session")
        if event.get("ended_session") and session is not None and session.session_key == event["ended_session"]:
            self.access = RunAccess(None)
        else:
            await self.check_access()
        await self.on_access_changed()

    async def on_access_changed(self) -> None:
        """Close the socket if the user may no longer use it at all."""
        if self.access.user_id is None:
            await self.close(code=ACCESS_LOST)


class RunConsumer(_LiveConsumer):
    """Live updates of one run (see module doc)."""

    requested_by = None
    first_seq = 0  # the seq of the snapshot sent on connect

    def groups_of(self, run_id: int) -> tuple[str, ...]:
        """The groups a socket of run ``run_id`` joins (besides the user's)."""
        return (run_group(run_id),)

    async def connect(self):
        """Join the run's groups, then read its snapshot: a change committed after the read is pushed to the
        socket (one committed before it is in the snapshot). Refused when the user may not see the run."""
        user = self.scope.get("user")
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if user is None or not user.is_authenticated:
            await self.close()
            return
        await self.subscribe(*self.groups_of(run_id))
        try:
            snapshot = await _visible_snapshot(user, run_id)
            if snapshot is not None:
                self.requested_by, self.first_seq = snapshot["requested_by"], snapshot["seq"]
                await self.check_access()
                await self.accept(self.subprotocol)
        except BaseException:
            await self.leave()
            raise
        if snapshot is None:
            await self.reject()
        await self.send_json({"type": "run.update", "run": snapshot})

    async def on_access_changed(self) -> None:
        if not self.may_see(self.requested_by):
            await self.close(code=ACCESS_LOST)

    async def run_update(self, event):
        """A snapshot, sent on unless it is older than the one sent on connect (published before that read)."""
        if event["run"]["seq"] >= self.first_seq and await self.still_allowed(self.requested_by):
            await self._forward_update(event)

    async def _forward_update(self, event):
        """Send the snapshot of ``event`` on (the caller checked that the user may still see the run). Its leading
        underscore keeps Channels from dispatching a message type to it, unchecked."""
        await self.send_json({"type": "run.update", "run": event["run"]})

    async def run_delta(self, event):
        if await self.still_allowed(self.requested_by):
            await self.send_json({"type": "run.delta", "kind": event.get("kind"), "data": event.get("data")})


class RunListConsumer(_LiveConsumer):
    """``run.update`` of every run the user may see (see module doc)."""

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        await self.check_access()
        await self.join(RUNS_GROUP)

    async def run_update(self, event):
        await self._forward_visible([event["run"]])

    async def runs_update(self, event):
        """Several runs' snapshots published together (``runs.live._folded``): each sent on as a ``run.update``."""
        await self._forward_visible(event["runs"])

    async def _forward_visible(self, runs: list[dict]):
        if not await self.still_allowed(self.scope["user"].pk):  # closes once the user is logged out
            return
        for run in runs:
            if self.may_see(run["requested_by"]):
                await self.send_json({"type": "run.update", "run": run})


@database_sync_to_async
def _events_after(run_id: int, seq: int) -> list[dict]:
    """Up to ``EVENTS_PER_READ`` events of run ``run_id`` with ``seq`` above ``seq``, in order, as the API shows them."""
    events = selectors.run_events_after(run_id=run_id, seq=seq)[:EVENTS_PER_READ]
    return RunEventSerializer(events, many=True).data


def _after_seq(scope) -> int | None:
    """The handshake's ``after_seq`` (0 when absent), or None when it is not one whole number from 0 to
    ``MAX_SEQ``."""
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("after_seq", ["0"])
    raw = values[-1]
    if len(values) != 1 or not (raw.isascii() and raw.isdigit() and len(raw) <= 10) or int(raw) > MAX_SEQ:
        return None
    return int(raw)


class RunEventsConsumer(RunConsumer):
    """One run for integrators: snapshots, deltas and the event log from ``after_seq`` on (see module doc)."""

    run_id = 0
    last_seq = 0  # the highest seq sent

    def groups_of(self, run_id: int) -> tuple[str, ...]:
        return (*super().groups_of(run_id), run_events_group(run_id))

    async def connect(self):
        if SUBPROTOCOL in (self.scope.get("subprotocols") or ()):
            self.subprotocol = SUBPROTOCOL
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        await super().connect()
        if not self.groups_joined:  # refused
            return
        after = _after_seq(self.scope)
        if after is None:
            await self.close(code=BAD_REQUEST)
            return
        self.last_seq = after
        await self.send_new_events()

    async def send_new_events(self) -> None:
        """Send every event after ``last_seq`` from the log, in order, moving ``last_seq``."""
        while True:
            events = await _events_after(self.run_id, self.last_seq)
            for event in events:
                await self.send_json({"type": "run.event", "event": event})
                self.last_seq = event["seq"]
            if len(events) < EVENTS_PER_READ:
                return

    async def _forward_update(self, event):
        """A snapshot, sent on; its ``seq`` says how far the log reached (``runs.live``: no notice goes with it)."""
        await super()._forward_update(event)
        if event["run"]["seq"] > self.last_seq:
            await self.send_new_events()

    async def run_event(self, event):
        """The log reached ``event["seq"]``: send what this socket has not sent yet."""
        if event["seq"] > self.last_seq and await self.still_allowed(self.requested_by):
            await self.send_new_events()
