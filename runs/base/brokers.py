"""A Dramatiq Redis broker whose idle consumers wake when a message is enqueued, not at their next poll.

Dramatiq's ``RedisBroker`` has no blocking fetch: its consumers take
messages with a Lua script (which also beats the worker's heartbeat and,
now and then, returns the messages of dead workers), and one that finds
nothing sleeps (backing off up to the worker timeout, ``DRAMATIQ_POLL_MS``)
before it looks again. A message sent to an idle worker therefore waits
for the end of that sleep (about half the timeout, the whole of it at
worst), and an idle worker runs the script dozens of times a second.

``NotifyingRedisBroker`` adds a doorbell beside each queue, the Redis list
``<namespace>:<queue>.notify``: ``enqueue`` pushes a token onto it once
the message is stored (keeping at most ``MAX_TOKENS``, so tokens that
nobody waits for do not pile up), and a consumer whose fetch found nothing
waits on it with ``BLPOP`` instead of sleeping, then fetches again as soon
as a token arrives or the wait ends. A token carries nothing; messages are
still taken only by Dramatiq's own fetch, so tokens and messages may
disagree without harm:

* a token without a message (another consumer fetched the message first,
  or the token outlived a flushed queue) costs one fetch that finds
  nothing, then the consumer waits again;
* a message without a token (its token was trimmed under a backlog, or a
  plain ``RedisBroker`` sent it) is fetched at the consumer's next look,
  at most ``idle_wait_ms`` later, as if this class were not there.

How long a consumer waits: while it holds no message, up to
``idle_wait_ms`` (few Redis calls when idle); while it holds some (a
worker thread still on one, or a delayed message whose time has not come,
which the worker moves to its queue between two looks), up to the
worker timeout, as Dramatiq would sleep. A consumer with no room for more
messages does not wait on the doorbell (it would take a token it cannot
act on): it sleeps the worker timeout, as Dramatiq does.
"""

import time

import redis
from dramatiq import Middleware
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import dq_name
from dramatiq.errors import ConnectionClosed

# Tokens kept per queue at most: enough to wake every idle consumer of a burst.
MAX_TOKENS = 64
# Seconds the shutdown tokens of a stopped worker are kept (they are meant for it alone).
SHUTDOWN_TOKENS_TTL_S = 60


class NotifyingRedisBroker(RedisBroker):
    """``RedisBroker`` whose idle consumers block on a per-queue token list (see the module doc).

    ``idle_wait_ms``: longest ``BLPOP`` of a consumer that holds no
    message, in milliseconds (positive; the worker timeout if that is
    longer; the settings check ``DRAMATIQ_IDLE_WAIT_MS``); other
    parameters as ``RedisBroker``. When its worker shuts down, the
    broker's own consumers are woken through a list of this broker's
    (``<namespace>:__doorbell__:<broker id>``) and wait no longer than the
    worker timeout from then on, so stopping is not held up by a long wait.
    """

    def __init__(self, *, idle_wait_ms: int = 1000, **parameters):
        super().__init__(**parameters)
        self.idle_wait_ms = idle_wait_ms
        self.closing = False
        self.add_middleware(_WakeConsumersOnShutdown())

    def notify_key(self, queue_name: str) -> str:
        """The Redis list of wake-up tokens of ``queue_name`` (a queue or its delay queue)."""
        return f"{self.namespace}:{queue_name}.notify"

    @property
    def _own_key(self) -> str:
        return f"{self.namespace}:__doorbell__:{self.broker_id}"

    @property
    def consumer_class(self):
        return _NotifiedConsumer

    def enqueue(self, message, *, delay=None):
        """Store the message as ``RedisBroker`` does, then push one token for its queue (one round trip)."""
        message = super().enqueue(message, delay=delay)
        key = self.notify_key(message.queue_name)
        pipe = self.client.pipeline(transaction=False)
        pipe.lpush(key, 1)
        pipe.ltrim(key, 0, MAX_TOKENS - 1)
        pipe.execute()
        return message

    def flush(self, queue_name: str) -> None:
        """Drop the queue's messages (``RedisBroker.flush``) and its tokens."""
        super().flush(queue_name)
        self.client.delete(self.notify_key(queue_name), self.notify_key(dq_name(queue_name)))

    def wait_for_enqueue(self, queue_name: str, timeout_s: float) -> bool:
        """Take a token of ``queue_name`` (or of this broker's shutdown), waiting at most ``timeout_s`` seconds; whether one came.
        Raises Dramatiq's ``ConnectionClosed`` when Redis cannot be reached.
        """
        try:
            return self.client.blpop([self.notify_key(queue_name), self._own_key], timeout=timeout_s) is not None
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    def wake_own_consumers(self) -> None:
        """From now on wait no longer than the worker timeout, and end the waits going on (worker shutdown)."""
        self.closing = True
        waiting = 2 * len(self.queues)  # one consumer per queue and one per delay queue
        if waiting:
            pipe = self.client.pipeline(transaction=False)
            pipe.lpush(self._own_key, *([1] * waiting))
            pipe.expire(self._own_key, SHUTDOWN_TOKENS_TTL_S)
            pipe.execute()


class _WakeConsumersOnShutdown(Middleware):
    """Tells the broker when its worker begins to shut down (Dramatiq stops the consumers last)."""

    def before_worker_shutdown(self, broker, worker):
        try:
            broker.wake_own_consumers()
        except redis.RedisError:  # Redis is gone: the waits end with their timeout
            pass


class _NotifiedConsumer(_RedisConsumer):
    """Dramatiq's Redis consumer, waiting on its queue's tokens where Dramatiq would sleep."""

    def __init__(self, broker, queue_name, prefetch, timeout):
        # Dramatiq's consumer sleeps up to ``timeout`` ms after an empty fetch; given 1 ms,
        # its sleep rounds down to nothing, and the wait happens in ``__next__`` below.
        super().__init__(broker, queue_name, prefetch, 1)
        self.poll_s = timeout / 1000
        self.idle_wait_s = max(timeout, broker.idle_wait_ms) / 1000

    def __next__(self):
        message = super().__next__()
        if message is None:  # the fetch found nothing, or there was no room to fetch
            held = self.outstanding_message_count
            if held >= self.prefetch:
                time.sleep(self.poll_s)
            else:
                idle = held == 0 and not self.broker.closing
                self.broker.wait_for_enqueue(self.queue_name, self.idle_wait_s if idle else self.poll_s)
        return message
