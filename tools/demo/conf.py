"""The demo app's settings and their defaults (the core settings know nothing of them).

Each value is the Django setting of that name when the settings module
sets one (tests override them so), else the environment variable of that
name (``.env`` included, as for every setting), else the default:

* ``GATEWAY_URL``: where the demo payment gateway answers
  (default ``http://127.0.0.1:8765``);
* ``GATEWAY_TIMEOUT_S``: seconds the refund tool waits for the gateway
  before its call is ``unknown`` (default 5);
* ``GATEWAY_LEDGER``: the ledger file of the gateway that ``serve``
  starts (default ``var/gateway-ledger.sqlite3``); nothing else writes it.

They are read when asked, so an override applies to the next call.
"""

import os
from pathlib import Path

from django.conf import settings

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8765"
DEFAULT_GATEWAY_TIMEOUT_S = 5.0
DEFAULT_GATEWAY_LEDGER = Path(settings.BASE_DIR) / "var" / "gateway-ledger.sqlite3"


def _read(name: str, default):
    """The Django setting ``name``, else the environment variable ``name``, else ``default``."""
    value = getattr(settings, name, None)
    if value is None or value == "":
        value = os.environ.get(name) or default
    return value


def gateway_url() -> str:
    """The payment gateway's base URL, without a trailing slash."""
    return str(_read("GATEWAY_URL", DEFAULT_GATEWAY_URL)).rstrip("/")


def gateway_timeout_s() -> float:
    """Seconds a refund may wait for the gateway.

    Raises ``ValueError`` for a value that is not a number; the refund tool
    reads it when the app registers it, so a bad value stops the start-up.
    """
    return float(_read("GATEWAY_TIMEOUT_S", DEFAULT_GATEWAY_TIMEOUT_S))


def gateway_ledger() -> Path:
    """The ledger file of the gateway that ``serve`` starts."""
    return Path(_read("GATEWAY_LEDGER", DEFAULT_GATEWAY_LEDGER))
