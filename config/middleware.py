"""Request middleware: bodies without a length, languages and time zones (README "Languages and time zones").

* ``LengthRequiredMiddleware``: a request whose body is framed by
  ``Transfer-Encoding`` (chunked) instead of ``Content-Length`` is a 411.

* ``ApiInEnglishMiddleware``: the REST API answers in English whatever the
  client's ``Accept-Language`` (after Django's ``LocaleMiddleware``, which
  picks the pages' language).
* ``BrowserTimeZoneMiddleware``: pages show times in the zone the browser
  reports in the ``tollgate_tz`` cookie (set by ``static/js/timezone.js``
  from ``Intl.DateTimeFormat().resolvedOptions().timeZone``), UTC without a
  valid one. Only names of the IANA time zone database are accepted.
"""

import functools
import zoneinfo

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.utils import timezone, translation

from config.api import API_PREFIX, error_body

TIME_ZONE_COOKIE = "tollgate_tz"


class LengthRequiredMiddleware:
    """Answer 411 to a request that carries ``Transfer-Encoding`` (e.g. a chunked body).

    Django reads a body only as far as its ``Content-Length`` says, and
    takes a missing one as 0: a chunked body would be read as empty, so an
    approval sent with edited arguments would approve the model's own
    arguments, and a comment or answer would be lost. Refusing is the
    safe choice (RFC 9110's 411 Length Required); a request with both
    headers is refused too (RFC 9112 6.1: such framing is ambiguous). Under
    ``/api/`` the body is the API's error object, code ``length_required``.
    """

    MESSAGE = "Send the request body with a Content-Length header; Transfer-Encoding (chunked) is not accepted."

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "HTTP_TRANSFER_ENCODING" not in request.META:
            return self.get_response(request)
        if request.path_info.startswith(API_PREFIX):
            return JsonResponse(error_body("length_required", self.MESSAGE), status=411)
        return HttpResponse(self.MESSAGE, status=411, content_type="text/plain; charset=utf-8")


class ApiInEnglishMiddleware:
    """Turn the language back to ``LANGUAGE_CODE`` for ``/api/`` requests.

    Programs read the API's ``code`` fields; its messages stay in one
    language, so DRF's own messages (which it would otherwise translate)
    match Tollgate's English ones. Must follow ``LocaleMiddleware``.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path_info.startswith(API_PREFIX):
            translation.activate(settings.LANGUAGE_CODE)
            request.LANGUAGE_CODE = translation.get_language()
        return self.get_response(request)


@functools.cache
def _known_zone_names() -> frozenset[str]:
    """The IANA zone names this machine knows (system tz database or the ``tzdata`` package), read once."""
    return frozenset(zoneinfo.available_timezones())


def zone_named(name: str | None) -> zoneinfo.ZoneInfo | None:
    """The time zone called ``name`` (``"Asia/Shanghai"``), or None: the untrusted cookie value is looked up among the known
    zone names before ``ZoneInfo`` sees it.
    """
    if not name or name not in _known_zone_names():
        return None
    return zoneinfo.ZoneInfo(name)


class BrowserTimeZoneMiddleware:
    """Activate the browser's time zone for the request; UTC (``TIME_ZONE``) when it sent none or an unknown one.

    Templates then render aware datetimes in that zone (Django's template
    localtime) and ``{{ TIME_ZONE }}`` (the ``tz`` context processor) names
    it for the labels.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        zone = zone_named(request.COOKIES.get(TIME_ZONE_COOKIE))
        if zone is None:
            timezone.deactivate()
        else:
            timezone.activate(zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
