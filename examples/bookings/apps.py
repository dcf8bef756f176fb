from django.apps import AppConfig


class BookingsConfig(AppConfig):
    """Registers the bookings tools and completion check when Django starts."""

    name = "examples.bookings"
    label = "bookings"

    def ready(self):
        from examples.bookings.checks import trip_booked
        from examples.bookings.tools import TOOLS
        from runs.engine.completion import register_check
        from tools.registry import register

        for tool in TOOLS:
            register(tool)
        register_check("trip_booked")(trip_booked)
