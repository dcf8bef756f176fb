"""Registers one read-only tool of its own when Django starts."""

from django.apps import AppConfig


class ExtraAppConfig(AppConfig):
    name = "tests.support.extra_app"
    label = "tollgate_test_extra_app"

    def ready(self):
        from tools.registry import Tool, register

        register(Tool(name="extra_echo", description="Echo the text back.", handler=lambda ctx, args: args,
                      parameters={"type": "object", "properties": {"text": {"type": "string"}},
                                  "required": ["text"], "additionalProperties": False}))
