"""English: datetimes as ``2026-11-30 21:20:33`` (Django's default drops the seconds)."""

DATETIME_FORMAT = "Y-m-d H:i:s"
