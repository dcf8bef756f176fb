from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = _("Runs")

    def ready(self):
        from runs.web import access_signals
        from runs.base.masking import install_log_masking
        from runs.tracing import configure_from_environment

        access_signals.connect()
        install_log_masking()  # every log line of every process (server, workers, sweeper) is masked
        configure_from_environment()  # OpenTelemetry traces, if OTEL_* asks for them (runs.tracing)
