"""WebSocket consumers: live run snapshots for browsers and integrators.

* ``RunConsumer`` at ``ws/runs/<id>/``: one run. Sends the current
  snapshot on connect, then every ``run.update`` and ``run.delta`` that
  ``runs.live`` publishes to the run's group.
* ``RunListConsumer`` at ``ws/runs/``: ``run.update`` of every run the user
  may see (the inbox and run list refresh on them).

Only authenticated users who may see the run (``runs.selectors``) are
accepted; anyone else is closed before the handshake completes. Access
is checked again before every event is forwarded, against the user as
stored now (``current_user``): after a logout, a password change, a
deactivation or the loss of the permission the socket is closed (code
4403) instead. The consumers are thin: load, check, forward. They never
change a run.
"""

from importlib import import_module

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model, load_backend
from django.contrib.auth.models import AnonymousUser
from django.utils.crypto import constant_time_compare

from runs import selectors
from runs.live import RUNS_GROUP, run_group, run_snapshot

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
def _may_see_run(scope, run_id: int) -> bool:
    return selectors.run_get_visible(user=current_user(scope), run_id=run_id) is not None


@database_sync_to_async
def _list_access(scope) -> tuple[bool, bool]:
    """(still logged in, sees every run) for the socket's user as of now."""
    user = current_user(scope)
    return user.is_authenticated, selectors.user_sees_all_runs(user=user)


class RunConsumer(AsyncJsonWebsocketConsumer):
    """Live updates of one run (see module doc)."""

    group = None
    run_id = None

    async def connect(self):
        user = self.scope.get("user")
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        snapshot = await _visible_snapshot(user, run_id) if user is not None else None
        if snapshot is None:
            await self.close()
            return
        self.run_id = run_id
        self.group = run_group(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "run.update", "run": snapshot})

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        """Clients have nothing to say; incoming messages are ignored."""

    async def _allowed(self) -> bool:
        """Whether the user may still see the run; closes the socket when not."""
        if await _may_see_run(self.scope, self.run_id):
            return True
        await self.close(code=ACCESS_LOST)
        return False

    async def run_update(self, event):
        if await self._allowed():
            await self.send_json({"type": "run.update", "run": event["run"]})

    async def run_delta(self, event):
        if await self._allowed():
            await self.send_json({"type": "run.delta", "kind": event.get("kind"), "data": event.get("data")})


class RunListConsumer(AsyncJsonWebsocketConsumer):
    """``run.update`` of every run the user may see (see module doc)."""

    joined = False

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        await self.channel_layer.group_add(RUNS_GROUP, self.channel_name)
        self.joined = True
        await self.accept()

    async def disconnect(self, code):
        if self.joined:
            await self.channel_layer.group_discard(RUNS_GROUP, self.channel_name)

    async def receive_json(self, content, **kwargs):
        """Clients have nothing to say; incoming messages are ignored."""

    async def run_update(self, event):
        run = event["run"]
        logged_in, sees_all = await _list_access(self.scope)
        if not logged_in:
            await self.close(code=ACCESS_LOST)
            return
        if not sees_all and run["requested_by"] != self.scope["user"].pk:
            return
        await self.send_json({"type": "run.update", "run": run})
