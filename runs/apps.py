from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = _("Runs")

    def ready(self):
        from runs import access_signals

        access_signals.connect()
