"""The hook through which installed apps start their own services with ``manage.py serve``.

``serve_starting`` is sent once, before the server listens, with
``stdout`` (the command's output, for a line saying what was started).
A receiver starts what its app needs beside the server (the demo app: its
payment gateway) and returns a callable that stops it, or None when it
started nothing. ``serve`` calls those callables, last started first, when
it stops; ``serve --no-services`` sends nothing.
"""

from django.dispatch import Signal

serve_starting = Signal()


def start_services(sender, stdout) -> list:
    """Send ``serve_starting``; return the stop callables its receivers gave back, in start order."""
    return [stop for _receiver, stop in serve_starting.send(sender=sender, stdout=stdout) if stop is not None]
