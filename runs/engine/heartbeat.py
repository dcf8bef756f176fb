"""Worker heartbeats: each Dramatiq worker process says every few seconds that it is alive and how busy it is.

``runs.engine.worker_middleware.HeartbeatMiddleware`` (in the broker's
middleware, ``config.settings``) starts one thread per process when its first worker boots
(``rundramatiq``'s worker processes, ``serve``'s in-process workers, a
test's worker) and stops it when the last one shuts down. Every
``TOLLGATE["WORKER_HEARTBEAT_S"]`` seconds the thread writes the process's
row (``runs.ops.models.WorkerHeartbeat``: ``runs.lease.WORKER_ID``, host,
pid, the queues its workers consume, when it started, now, the runs its
engine has in flight and the abandoned tool threads) and deletes the rows
of workers silent for ``TOLLGATE["WORKER_PRUNE_AFTER_S"]``. A clean stop
deletes the process's own row, so a row that goes stale is a worker that
died or hangs. Operators see the rows in the admin and in ``/metrics``.
"""

import logging
import os
import socket
import threading
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone
from dramatiq.common import q_name

from runs.base.awaiting import abandoned_threads
from runs.engine.runtime import running_engine
from runs.lease import WORKER_ID
from runs.ops.models import WorkerHeartbeat

log = logging.getLogger(__name__)


def beat(*, worker_id: str, queues: str, started_at, runs_in_flight: int, abandoned: int) -> None:
    """Write the heartbeat row of ``worker_id`` (one UPDATE; an INSERT the first time) and delete the rows
    silent for ``WORKER_PRUNE_AFTER_S`` seconds. ``started_at``: an aware datetime. Raises ``DatabaseError``."""
    now = timezone.now()
    fields = {"last_seen": now, "queues": queues, "runs_in_flight": runs_in_flight, "abandoned_threads": abandoned}
    if not WorkerHeartbeat.objects.filter(worker_id=worker_id).update(**fields):
        WorkerHeartbeat.objects.create(worker_id=worker_id, host=socket.gethostname(), pid=os.getpid(),
                                       started_at=started_at, **fields)
    prune_before = now - timedelta(seconds=settings.TOLLGATE["WORKER_PRUNE_AFTER_S"])
    WorkerHeartbeat.objects.filter(last_seen__lt=prune_before).delete()


class Heartbeat:
    """This process's heartbeat thread, running while at least one of its workers runs (see the module doc)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._workers: dict[int, frozenset[str]] = {}  # id(worker) -> the queues it consumes
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self, worker_key: int, queues) -> None:
        """A worker (``worker_key``: any id unique in the process) consuming ``queues`` (names) booted."""
        with self._lock:
            self._workers[worker_key] = frozenset(q_name(name) for name in queues)
            if self._thread is None:
                self._stopped = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stopped, timezone.now()),
                                                name="tollgate-heartbeat", daemon=True)
                self._thread.start()

    def stop(self, worker_key: int) -> None:
        """The worker ``worker_key`` shuts down; the last one stops the thread, which deletes the row (waits for
        that, up to 10 s). A key that never started is ignored."""
        with self._lock:
            if self._workers.pop(worker_key, None) is None or self._workers:
                return
            thread, self._thread = self._thread, None
            self._stopped.set()
        thread.join(timeout=10)

    def _queues(self) -> str:
        with self._lock:
            return ",".join(sorted(set().union(*self._workers.values())))

    def _run(self, stopped: threading.Event, started_at) -> None:
        try:
            while True:
                engine = running_engine()
                try:
                    beat(worker_id=WORKER_ID, queues=self._queues(), started_at=started_at,
                         runs_in_flight=engine.in_flight if engine is not None else 0, abandoned=abandoned_threads())
                except DatabaseError:  # a blip: the next beat tries again; missed beats show as stale
                    log.warning("heartbeat: writing the worker's row failed", exc_info=True)
                    connection.close()
                if stopped.wait(settings.TOLLGATE["WORKER_HEARTBEAT_S"]):
                    break
            try:
                WorkerHeartbeat.objects.filter(worker_id=WORKER_ID).delete()
            except DatabaseError:  # the row goes stale, then is pruned
                log.warning("heartbeat: deleting the worker's row failed", exc_info=True)
        finally:
            connection.close()


heartbeat = Heartbeat()
