from django.apps import AppConfig


class ToolsConfig(AppConfig):
    """The tools services: registry, approval rules and tool calls; no tools of its own.

    Tools come from installed plug-in apps, which register them from their
    own ``AppConfig.ready`` (the demo shop: ``tools.demo``).
    """

    name = "tools"
    verbose_name = "Tools"
