from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class WebhooksConfig(AppConfig):
    name = "runs.webhooks"
    label = "webhooks"
    verbose_name = _("Webhooks")

    def ready(self):
        # Connecting the outbox to the event log, and declaring the actors
        # for every worker (in-process or rundramatiq), are import side effects.
        from runs.sweeping import register_sweep_job
        from runs.webhooks import actors, outbox  # noqa: F401
        from runs.webhooks.services import sweep_webhooks

        register_sweep_job("sweep_webhooks", sweep_webhooks, order=900)  # the backstop, after the runs' jobs
