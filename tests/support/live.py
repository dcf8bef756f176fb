"""Helpers for tests that listen to live pushes (``runs.live``) on the configured channel layer.

A commit hands its push to the process's sender thread and goes on without
waiting (docs/design.md#live-pushes), so a push made before a test starts
listening (by a fixture, or earlier in the test) may still reach the layer
after it: a channel that joins a group must first let those go out.
"""

import asyncio

from runs import live


def pushes_sent(timeout_s: float = 10.0) -> None:
    """Wait until every live push this process handed over so far reached the channel layer (or was given
    up); raises ``TimeoutError`` after ``timeout_s`` seconds."""
    live._sender.flush(timeout_s=timeout_s)


async def listening(layer, *groups: str) -> str:
    """A new channel of ``layer`` in ``groups``, joined once the pushes made so far went out: it receives
    only what is pushed from now on."""
    await asyncio.to_thread(pushes_sent)
    channel = await layer.new_channel()
    for group in groups:
        await layer.group_add(group, channel)
    return channel
