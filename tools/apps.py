from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ToolsConfig(AppConfig):
    """The tools services: registry, approval rules and tool calls, and the built-in waiting tools.

    Other tools come from installed plug-in apps, which register them from
    their own ``AppConfig.ready`` (the demo shop: ``tools.demo``), and from
    ``TOLLGATE["HTTP_TOOLS"]`` (``tools.http``), checked here: a mistake
    there stops the start with ``ImproperlyConfigured``.
    """

    name = "tools"
    verbose_name = _("Tools")

    def ready(self):
        # The core's own waiting tools register themselves on import.
        from tools import builtin  # noqa: F401
        from tools.http import check_endpoints, tools_from_settings
        from tools.registry import register

        check_endpoints()
        for tool in tools_from_settings():
            register(tool)
