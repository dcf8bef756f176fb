"""Whether this process may serve: a server needs a ``SECRET_KEY``, a data command does not.

``config.settings`` leaves ``SECRET_KEY`` empty when ``DEBUG`` is off and
none is set, so commands that sign nothing (``migrate``, ``manage.py demo``)
run from any shell, while Django refuses to sign anything (sessions, CSRF
tokens, password-reset links) with an empty key. Whatever serves calls
``require_secret_key()`` before it listens: ``manage.py serve`` and the ASGI
application (``config.asgi``, which every ASGI server loads).
"""

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

MISSING_KEY = ("SECRET_KEY must be set (a long random string) to serve Tollgate when DEBUG is off; "
               "for a local try-out set DEBUG=true or generate a key (see README).")


def require_secret_key() -> None:
    """Raise ``ImproperlyConfigured`` (saying what to do) unless ``SECRET_KEY`` is set."""
    try:
        configured = bool(settings.SECRET_KEY)  # Django raises on reading an empty key
    except ImproperlyConfigured:
        configured = False
    if not configured:
        raise ImproperlyConfigured(MISSING_KEY)
