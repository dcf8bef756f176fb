"""An in-memory channel layer that threads with their own event loops can use.

Channels' ``InMemoryChannelLayer`` keeps ``asyncio.Queue`` objects that
belong to the ASGI server's event loop. The embedded default runs the
Dramatiq worker in threads of the same process; ``runs.live`` publishes
from them with ``async_to_sync``, i.e. from a *different* event loop. With
the stock layer that wakes the server's consumers from a foreign thread,
which asyncio does not support: the message is only noticed whenever the
server loop happens to wake up next, and the queues may be corrupted.

``LoopSafeInMemoryChannelLayer`` binds to the first loop that receives
from it (the server's) and runs every send / group operation issued from
any other loop on that loop (``asyncio.run_coroutine_threadsafe``).
Within one loop it behaves exactly like the stock layer, so tests that use
it from a single loop see no difference. The embedded shape's
``CHANNEL_LAYERS`` uses it (config/settings.py).
"""

import asyncio

from channels.layers import InMemoryChannelLayer

# Longest a publisher in another thread waits for the server loop (seconds).
CROSS_LOOP_TIMEOUT_S = 5.0


class LoopSafeInMemoryChannelLayer(InMemoryChannelLayer):
    """``InMemoryChannelLayer`` whose operations all run on the receiving loop (see module doc)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._home_loop = None

    async def _at_home(self, make_coro):
        loop = asyncio.get_running_loop()
        home = self._home_loop
        if home is None or home is loop or home.is_closed() or not home.is_running():
            return await make_coro()
        future = asyncio.run_coroutine_threadsafe(make_coro(), home)
        return await asyncio.wait_for(asyncio.wrap_future(future), CROSS_LOOP_TIMEOUT_S)

    async def receive(self, channel):
        if self._home_loop is None or self._home_loop.is_closed():
            self._home_loop = asyncio.get_running_loop()
        return await super().receive(channel)

    async def send(self, channel, message):
        parent = super()
        return await self._at_home(lambda: parent.send(channel, message))

    async def group_add(self, group, channel):
        parent = super()
        return await self._at_home(lambda: parent.group_add(group, channel))

    async def group_discard(self, group, channel):
        parent = super()
        return await self._at_home(lambda: parent.group_discard(group, channel))

    async def group_send(self, group, message):
        parent = super()
        return await self._at_home(lambda: parent.group_send(group, message))

    async def flush(self):
        parent = super()
        return await self._at_home(lambda: parent.flush())
