from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DemoConfig(AppConfig):
    """The demo shop plug-in: registers its tools, completion checks and ``serve`` hook when Django starts."""

    name = "tools.demo"
    label = "demo"
    verbose_name = _("Demo shop")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from runs.engine.completion import register_check
        from runs.serving import serve_starting
        from tools.demo.checks import CHECKS
        from tools.demo.server import start_gateway_with_server
        from tools.demo.tools import DEMO_TOOLS
        from tools.registry import register

        for tool in DEMO_TOOLS:
            register(tool)
        for name, check in CHECKS.items():
            register_check(name)(check)
        serve_starting.connect(start_gateway_with_server, dispatch_uid="tools.demo.gateway")
