"""``runs.base.brokers.NotifyingRedisBroker`` against the real Redis: prompt wake-ups, and tokens that may
disagree with messages without any message being lost or handled twice.

Each test uses a broker of its own (a fresh namespace, removed afterwards)
with its own actor, and real Dramatiq ``Worker`` threads; the consumers'
``idle_wait_ms`` is long (10 s) wherever the test is about the doorbell, so
only a token can explain a message picked up within a second or two.
"""

import os
import threading
import time
import uuid

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker

from runs.base.brokers import MAX_TOKENS, NotifyingRedisBroker

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (REDIS_URL)")

QUEUE = "doorbell"
POLL_MS = 20  # the worker timeout, as DRAMATIQ_POLL_MS


class Seen:
    """What the test actor was called with, and when (monotonic seconds)."""

    def __init__(self):
        self.calls: list[tuple[int, float]] = []
        self.lock = threading.Lock()

    def __call__(self, number: int) -> None:
        with self.lock:
            self.calls.append((number, time.monotonic()))

    def numbers(self) -> list[int]:
        with self.lock:
            return sorted(number for number, _ in self.calls)

    def wait_for(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.numbers()) < count and time.monotonic() < deadline:
            time.sleep(0.005)


@pytest.fixture
def namespace():
    name = f"tollgate-test-doorbell-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    keys = list(client.scan_iter(f"{name}*"))
    if keys:
        client.delete(*keys)


@pytest.fixture
def make_worker(namespace):
    """``make_worker(broker_class, idle_wait_ms)`` -> (broker, started Worker); all stopped at the end."""
    started = []
    seen = Seen()

    def make(broker_class=NotifyingRedisBroker, idle_wait_ms=10_000, start=True):
        options = {"idle_wait_ms": idle_wait_ms} if broker_class is NotifyingRedisBroker else {}
        broker = broker_class(url=os.environ["REDIS_URL"], namespace=namespace, middleware=[], **options)
        actor = dramatiq.actor(seen, broker=broker, actor_name="record", queue_name=QUEUE)
        worker = Worker(broker, worker_threads=2, worker_timeout=POLL_MS)
        if start:
            worker.start()
            started.append(worker)
        return broker, actor, worker

    make.seen = seen
    yield make
    for worker in started:
        worker.stop()


def _idle(broker, seconds: float = 0.3) -> None:
    """Let the consumers find the queue empty and settle into their wait."""
    time.sleep(seconds)


def test_an_idle_worker_picks_a_message_up_at_once_and_idles_with_few_fetches(make_worker, monkeypatch):
    broker, actor, _ = make_worker()
    _idle(broker)
    fetches = []
    fetch = broker.do_fetch  # Dramatiq's fetch script, as the consumers call it
    monkeypatch.setattr(broker, "do_fetch", lambda *args: fetches.append(args) or fetch(*args), raising=False)
    time.sleep(1.0)
    # Dramatiq's plain consumer would have fetched every 10-20 ms: about 60 times, per queue.
    assert len(fetches) <= 4, fetches

    delays = []
    for number in range(5):
        sent = time.monotonic()
        actor.send(number)
        make_worker.seen.wait_for(number + 1, timeout_s=5)
        delays.append(make_worker.seen.calls[-1][1] - sent)
        _idle(broker)
    assert make_worker.seen.numbers() == list(range(5))
    # The consumers wait up to 10 s between looks of their own: only the doorbell explains this.
    assert max(delays) < 2.0, delays


def test_tokens_without_messages_cost_nothing_and_the_next_message_runs_once(make_worker):
    broker, actor, _ = make_worker(start=False)
    client = broker.client
    client.lpush(broker.notify_key(QUEUE), *([1] * 10))  # tokens whose messages never came
    _, _, worker = make_worker()  # a second broker on the same queue, consuming
    _idle(broker, 0.5)
    assert make_worker.seen.numbers() == []
    assert client.llen(broker.notify_key(QUEUE)) == 0  # taken, each with a fetch that found nothing

    sent = time.monotonic()
    actor.send(1)
    make_worker.seen.wait_for(1, timeout_s=5)
    assert make_worker.seen.numbers() == [1]
    assert make_worker.seen.calls[0][1] - sent < 2.0
    time.sleep(0.3)
    assert make_worker.seen.numbers() == [1]


def test_a_message_without_a_token_is_fetched_at_the_next_look(make_worker):
    plain, plain_actor, _ = make_worker(broker_class=RedisBroker, start=False)
    broker, _, _ = make_worker(idle_wait_ms=300)
    _idle(broker)
    plain_actor.send(7)  # Dramatiq's own broker: no token
    assert broker.client.llen(broker.notify_key(QUEUE)) == 0
    make_worker.seen.wait_for(1, timeout_s=10)
    assert make_worker.seen.numbers() == [7]


def test_a_burst_to_two_workers_runs_every_message_exactly_once(make_worker):
    first, actor, _ = make_worker(idle_wait_ms=300)
    make_worker(idle_wait_ms=300)
    _idle(first)
    count = MAX_TOKENS * 2  # more messages than tokens kept: some arrive without one
    for number in range(count):
        actor.send(number)
    assert first.client.llen(first.notify_key(QUEUE)) <= MAX_TOKENS
    make_worker.seen.wait_for(count, timeout_s=30)
    time.sleep(0.5)  # anything handled twice would show by now
    assert make_worker.seen.numbers() == list(range(count))


def test_delayed_messages_go_through_the_delay_queue_on_time(make_worker):
    broker, actor, _ = make_worker()
    _idle(broker)
    sent = time.monotonic()
    actor.send_with_options(args=(3,), delay=300)
    make_worker.seen.wait_for(1, timeout_s=10)
    assert make_worker.seen.numbers() == [3]
    waited = make_worker.seen.calls[0][1] - sent
    # Not before its time; and not an idle wait (10 s) late: the delay consumer holds it, so it looks every 20 ms.
    assert 0.3 <= waited < 3.0, waited


def test_flush_drops_the_tokens_with_the_messages(make_worker):
    broker, actor, _ = make_worker(start=False)
    actor.send(1)
    actor.send_with_options(args=(2,), delay=60_000)
    assert broker.client.llen(broker.notify_key(QUEUE)) == 1
    broker.flush(QUEUE)
    assert broker.client.llen(broker.notify_key(QUEUE)) == 0
    assert broker.client.llen(broker.notify_key(f"{QUEUE}.DQ")) == 0


def test_stopping_a_worker_is_not_held_up_by_its_consumers_long_wait(make_worker):
    broker, _, worker = make_worker(start=False)
    worker.start()
    _idle(broker)  # both consumers now wait up to 10 s
    began = time.monotonic()
    worker.stop()
    assert time.monotonic() - began < 3.0
