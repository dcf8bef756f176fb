"""Date formats that differ from Django's own, per language (``FORMAT_MODULE_PATH``); the rest is Django's.

Datetimes keep their seconds, in the request's time zone (``config.middleware.BrowserTimeZoneMiddleware``;
docs/design.md#surfaces).
"""
