from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = _("Runs")

    def ready(self):
        from runs.web import access_signals
        from runs.engine.sweep_jobs import JOBS
        from runs.base.masking import install_log_masking
        from runs.sweeping import register_sweep_job
        from runs.base.tracing import configure_from_environment

        access_signals.connect()
        install_log_masking()  # every log line of every process (server, workers, sweeper) is masked
        configure_from_environment()  # OpenTelemetry traces, if OTEL_* asks for them (runs.base.tracing)
        for order, job in JOBS:  # the engine's sweep jobs (runs.engine.sweep_jobs)
            register_sweep_job(job.__name__, job, order=order)
