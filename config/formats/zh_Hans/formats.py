"""Simplified Chinese: datetimes as ``2026年11月30日 21:20:33`` (Django's default drops the seconds)."""

DATETIME_FORMAT = "Y年n月j日 H:i:s"
