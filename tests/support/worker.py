"""A real Dramatiq worker in the test process (``RunWorker``), consuming the configured broker."""

import time

from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker

from runs.engine import runtime
from runs.engine.actors import advance_run


class RunWorker:
    """A started Dramatiq worker; ``drain()`` waits until every queued message is processed and the
    engine it hands runs to (``runs.engine.runtime``) has none in flight."""

    def __init__(self, broker):
        self.broker = broker
        self.worker = Worker(broker, worker_timeout=20, worker_threads=1)

    def drain(self, timeout_s: float = 30) -> None:
        """Wait (up to ``timeout_s`` seconds) until the queue is empty and no run is in flight.

        Raises ``TimeoutError`` when runs are still in flight at the deadline.
        """
        deadline = time.monotonic() + timeout_s
        engine = runtime.engine()
        while True:  # a slice that ends may send its run to the queue again
            self._join(deadline)
            handed_over = engine.submitted
            if not engine.wait_idle(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{engine.in_flight} runs still in flight after {timeout_s} s")
            self._join(deadline)
            if engine.submitted == handed_over and engine.in_flight == 0:
                return

    def _join(self, deadline: float) -> None:
        self.broker.join(advance_run.queue_name, timeout=max(1, int((deadline - time.monotonic()) * 1000)))
        self.worker.join()


def forget_taken_messages(broker) -> None:
    """Zero the in-memory queues' count of messages taken but never acknowledged.

    A stopped worker drops what it had prefetched without acknowledging it,
    so Python's ``Queue`` would count those messages as unfinished for good
    and the next test's ``drain()`` would wait on them until it timed out.
    Only the StubBroker (no ``REDIS_URL``) has such queues; Redis keeps its
    own state and is flushed by the caller.
    """
    if not isinstance(broker, StubBroker):
        return
    for queue in broker.queues.values():
        with queue.all_tasks_done:
            queue.unfinished_tasks = 0
            queue.all_tasks_done.notify_all()
