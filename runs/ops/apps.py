from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class OpsConfig(AppConfig):
    """What operators watch: health and readiness probes, worker heartbeats, Prometheus metrics (docs/operating.md)."""

    name = "runs.ops"
    label = "ops"
    verbose_name = _("Operations")
