from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = "Tools"

    def ready(self):
        # Registering the built-in waiting tools and the demo shop's tools
        # and completion checks is an import side effect of these modules.
        from tools import builtin, demo  # noqa: F401
