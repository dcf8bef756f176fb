"""Registers the ``delivery`` kind of wait and its tool when Django starts."""

from django.apps import AppConfig


class CourierConfig(AppConfig):
    name = "tests.support.courier_app"
    label = "courier_app"

    def ready(self):
        from tests.support.courier_app import deliveries  # noqa: F401
