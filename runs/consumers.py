"""WebSocket consumers: live run snapshots for browsers and integrators.

* ``RunConsumer`` at ``ws/runs/<id>/``: one run. Sends the current
  snapshot on connect, then every ``run.update`` and ``run.delta`` that
  ``runs.live`` publishes to the run's group.
* ``RunListConsumer`` at ``ws/runs/``: ``run.update`` of every run the user
  may see (the inbox and run list refresh on them).

Only authenticated users who may see the run
(``Run.objects.visible_to``, ``runs.access``) are accepted; anyone else
is closed before the handshake completes. Access is then kept per socket
as the rule's facts (``runs.access.RunAccess``: who the user is, if
still logged in, and whether they see every run) and checked again
against the user as stored now (``current_user``) whenever
``runs.access_signals`` says the user's access may have changed (a
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

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.models import AnonymousUser
from django.utils.crypto import constant_time_compare

from runs import selectors
from runs.access import RunAccess
from runs.live import RUNS_GROUP, run_group, run_snapshot, user_group

ACCESS_LOST = 4403  # close code: the user may no longer see this


def current_user(scope):
    """The user of the socket's ``scope`` as the database has them now, or ``AnonymousUser``.

    With a session (browsers): the session is read again from its store,
    so a logout (session deleted), a login as someone else or a password
    change (session hash) counts. Without one (tests, other
    authentication): the scope's user reloaded by id. Inactive users are
    anonymous. Synchronous: call through ``database_sync_to_async``.
    """
    anonymous = AnonymousUser()
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return anonymous
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

    async def join(self, *groups: str) -> None:
        """Join ``groups`` and the user's access group, then accept the socket."""
        self.groups_joined = (*groups, user_group(self.scope["user"].pk))
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

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

    async def connect(self):
        user = self.scope.get("user")
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        snapshot = await _visible_snapshot(user, run_id) if user is not None else None
        if snapshot is None:
            await self.close()
            return
        self.requested_by = snapshot["requested_by"]
        await self.check_access()
        await self.join(run_group(run_id))
        await self.send_json({"type": "run.update", "run": snapshot})

    async def on_access_changed(self) -> None:
        if not self.may_see(self.requested_by):
            await self.close(code=ACCESS_LOST)

    async def run_update(self, event):
        if await self.still_allowed(self.requested_by):
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
        run = event["run"]
        if not await self.still_allowed(self.scope["user"].pk):  # closes once the user is logged out
            return
        if self.may_see(run["requested_by"]):
            await self.send_json({"type": "run.update", "run": run})
