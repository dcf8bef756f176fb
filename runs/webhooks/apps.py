from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class WebhooksConfig(AppConfig):
    name = "runs.webhooks"
    label = "webhooks"
    verbose_name = _("Webhooks")

    def ready(self):
        # Connecting the outbox to the event log, and declaring the actors
        # for every worker (in-process or rundramatiq), are import side effects.
        from runs.webhooks import actors, outbox  # noqa: F401
