from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = "Tools"

    def ready(self):
        # Registering the demo shop's tools and completion checks is an
        # import side effect of these modules.
        from tools import demo  # noqa: F401
