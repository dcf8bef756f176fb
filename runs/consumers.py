"""WebSocket consumers: live run snapshots for browsers and integrators.

* ``RunConsumer`` at ``ws/runs/<id>/``: one run. Sends the current
  snapshot on connect, then every ``run.update`` and ``run.delta`` that
  ``runs.live`` publishes to the run's group.
* ``RunListConsumer`` at ``ws/runs/``: ``run.update`` of every run the user
  may see (the inbox and run list refresh on them).

Only authenticated users who may see the run (``runs.selectors``) are
accepted; anyone else is closed before the handshake completes. The
consumers are thin: load, check, forward. They never change a run.
"""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from runs import selectors
from runs.live import RUNS_GROUP, run_group, run_snapshot


@database_sync_to_async
def _visible_snapshot(user, run_id: int) -> dict | None:
    run = selectors.run_get_visible(user=user, run_id=run_id)
    return run_snapshot(run) if run is not None else None


@database_sync_to_async
def _sees_all(user) -> bool:
    return selectors.user_sees_all_runs(user=user)


class RunConsumer(AsyncJsonWebsocketConsumer):
    """Live updates of one run (see module doc)."""

    group = None

    async def connect(self):
        user = self.scope.get("user")
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        snapshot = await _visible_snapshot(user, run_id) if user is not None else None
        if snapshot is None:
            await self.close()
            return
        self.group = run_group(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "run.update", "run": snapshot})

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        """Clients have nothing to say; incoming messages are ignored."""

    async def run_update(self, event):
        await self.send_json({"type": "run.update", "run": event["run"]})

    async def run_delta(self, event):
        await self.send_json({"type": "run.delta", "kind": event.get("kind"), "data": event.get("data")})


class RunListConsumer(AsyncJsonWebsocketConsumer):
    """``run.update`` of every run the user may see (see module doc)."""

    joined = False
    sees_all = False

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        self.sees_all = await _sees_all(user)
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
        if not self.sees_all and run["requested_by"] != self.scope["user"].pk:
            return
        await self.send_json({"type": "run.update", "run": run})
