from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ToolsConfig(AppConfig):
    """The tools services: registry, approval rules and tool calls, and the built-in waiting tools.

    Other tools come from installed plug-in apps, which register them from
    their own ``AppConfig.ready`` (the demo shop: ``tools.demo``), and from
    ``TOLLGATE["HTTP_TOOLS"]`` (``tools.http``) and the MCP servers of
    ``TOLLGATE["MCP_SERVERS"]`` (``tools.mcp``), checked here: a mistake
    there stops the start with ``ImproperlyConfigured``.
    """

    name = "tools"
    verbose_name = _("Tools")

    def ready(self):
        # The core's own waiting tools register themselves on import.
        from tools import builtin  # noqa: F401
        from tools.http import check_endpoints, tools_from_settings
        from tools.mcp.source import SOURCE
        from tools.mcp.startup import check_servers
        from tools.registry import add_source, register

        check_endpoints()
        for tool in tools_from_settings():
            register(tool)
        # The tools of the MCP servers in TOLLGATE_MCP_SERVERS; a profile that cannot be used stops the start.
        check_servers()
        add_source(SOURCE)
