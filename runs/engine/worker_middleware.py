"""Dramatiq middleware of Tollgate's workers, named in ``config.settings`` (``DRAMATIQ_BROKER["MIDDLEWARE"]``).

The broker, and so this module, is loaded while Django loads its apps,
before any model can be imported: what needs models is imported when a
worker boots.
"""

import dramatiq


class HeartbeatMiddleware(dramatiq.Middleware):
    """The process's heartbeat (``runs.engine.heartbeat``) runs while its workers do."""

    def after_worker_boot(self, broker, worker):
        from runs.engine.heartbeat import heartbeat

        heartbeat.start(id(worker), worker.consumer_whitelist or broker.get_declared_queues())

    def before_worker_shutdown(self, broker, worker):
        from runs.engine.heartbeat import heartbeat

        heartbeat.stop(id(worker))
