"""The hook through which installed apps start their own services with ``manage.py serve`` (not with ``--no-services``).

``serve_starting`` is sent once before the server listens, with ``stdout``; a receiver returns a callable that stops
what it started, or None. ``serve`` calls them last started first when it stops.
"""

from django.dispatch import Signal

serve_starting = Signal()


def start_services(sender, stdout) -> list:
    """Send ``serve_starting``; return the stop callables its receivers gave back, in start order."""
    return [stop for _receiver, stop in serve_starting.send(sender=sender, stdout=stdout) if stop is not None]
