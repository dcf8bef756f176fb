"""Date formats that differ from Django's own, per language (``FORMAT_MODULE_PATH``).

Only what is set here changes; everything else comes from Django's locale
formats. Datetimes shown without an explicit format (the Django admin's
fields and columns) keep their seconds, in the request's time zone
(``config.middleware.BrowserTimeZoneMiddleware``).
"""
