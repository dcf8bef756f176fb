"""Dramatiq middleware of Tollgate's workers, named in ``config.settings`` (``DRAMATIQ_BROKER["MIDDLEWARE"]``).

The broker, and so this module, is loaded while Django loads its apps,
before any model can be imported: what needs models is imported when a
worker boots.
"""

import threading

import dramatiq
from dramatiq.common import current_millis

from runs.base import process_metrics


class ConnectionsMiddleware(dramatiq.Middleware):
    """A broker thread keeps its database connection from one message to the next; one left unusable is closed.

    Around each message it closes only a connection that an error left unusable
    or that is not back in autocommit (a transaction left open), as Django's
    ``close_if_unusable_or_obsolete`` would (``runs.base.awaiting.close_if_unusable``),
    but not one merely past its age: with
    PostgreSQL's pool every connection is "past its age" at once, and handing it
    back after each message would have the thread's next message (a lease, a run's
    row) served by the connection the pool used least recently, whose statements
    are not prepared yet. A worker has ``--threads`` broker threads, so it holds
    as many connections (``docs/operating.md``). Every connection is closed when
    a thread or the worker stops, as django_dramatiq's ``DbConnectionsMiddleware``
    (which this replaces) does. Its worker threads are marked at boot
    (``runs.base.awaiting.keep_connection_in_this_thread``), so ``Engine.submit``
    leaves their connection with them; any other thread's is handed back.
    """

    @staticmethod
    def _close_unusable(*args, **kwargs):
        from django.db import connections

        from runs.base.awaiting import close_if_unusable

        for connection in connections.all(initialized_only=True):
            close_if_unusable(connection)

    @staticmethod
    def _close_all(*args, **kwargs):
        from django.db import connections

        connections.close_all()

    @staticmethod
    def after_worker_thread_boot(*args, **kwargs):
        from runs.base.awaiting import keep_connection_in_this_thread

        keep_connection_in_this_thread()  # it closes its connections when it stops (below)

    before_process_message = after_process_message = _close_unusable
    before_consumer_thread_shutdown = before_worker_thread_shutdown = before_worker_shutdown = _close_all


class HeartbeatMiddleware(dramatiq.Middleware):
    """The process's heartbeat (``runs.engine.heartbeat``) runs while its workers do."""

    def after_worker_boot(self, broker, worker):
        from runs.engine.heartbeat import heartbeat

        heartbeat.start(id(worker), worker.consumer_whitelist or broker.get_declared_queues())

    def before_worker_shutdown(self, broker, worker):
        from runs.engine.heartbeat import heartbeat

        heartbeat.stop(id(worker))


class CollectorMiddleware(dramatiq.Middleware):
    """A worker process settles its garbage collector once its workers have booted (``runs.base.collector``)."""

    def after_worker_boot(self, broker, worker):
        from runs.base import collector

        collector.settle()


class FlightRecorderMiddleware(dramatiq.Middleware):
    """A worker process that stops removes its flight recorder's box (``runs.base.flight_recorder``): a
    process Dramatiq forked leaves through ``os._exit``, so its ``atexit`` hooks never run, and a box left
    behind would blame whatever the process ran as it stopped."""

    def after_worker_shutdown(self, broker, worker):
        from runs.base import flight_recorder

        flight_recorder.close_box()


class MetricsMiddleware(dramatiq.Middleware):
    """Counts every message a worker of this process handles (``runs.base.process_metrics``): the queue lag, from
    its enqueue (``message_timestamp``, ms) or, for a delayed message, from when it was due (its ``eta``) to
    its actor's start, and Dramatiq's own message metrics, under the names of Dramatiq's ``Prometheus``
    middleware. A process's live gauges go when its last worker shuts down."""

    def __init__(self):
        self._started: dict[str, int] = {}  # message id -> when its actor started (ms)
        self._workers = 0
        self._lock = threading.Lock()

    def after_worker_boot(self, broker, worker):
        with self._lock:
            self._workers += 1

    def after_worker_shutdown(self, broker, worker):
        with self._lock:
            self._workers -= 1
            last = self._workers == 0
        if last:
            process_metrics.process_ended()

    def before_process_message(self, broker, message):
        now = current_millis()
        due = max(message.message_timestamp, message.options.get("eta") or 0)
        self._started[message.message_id] = now
        process_metrics.message_started(message.queue_name, message.actor_name, lag_s=(now - due) / 1000)

    def after_process_message(self, broker, message, *, result=None, exception=None):
        started = self._started.pop(message.message_id, None)
        if started is None:  # skipped by an earlier middleware before its actor started: counted, not timed
            process_metrics.message_skipped(message.queue_name, message.actor_name)
            return
        process_metrics.message_ended(message.queue_name, message.actor_name, duration_ms=current_millis() - started,
                                      failed=exception is not None)

    after_skip_message = after_process_message
