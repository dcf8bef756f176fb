from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ToolsConfig(AppConfig):
    """The tools services: registry, approval rules and tool calls, and the built-in waiting tools.

    Other tools come from installed plug-in apps, which register them from
    their own ``AppConfig.ready`` (the demo shop: ``tools.demo``).
    """

    name = "tools"
    verbose_name = _("Tools")

    def ready(self):
        # The core's own waiting tools register themselves on import.
        from tools import builtin  # noqa: F401
