"""Throttles under a burst: requests sent at once get no more than the rate through.

Found by attacking the API: with the throttle counters in Redis (the
production shape, ``CACHE_URL``), 40 ``POST /api/runs/`` sent at once with
a rate of 10 a minute started 17 runs: DRF's throttle reads the history,
decides and writes it back, so simultaneous requests all saw room. The
throttles of ``config.throttles`` decide one request per key at a time.
In the PostgreSQL + Redis pass the counters are in that Redis.
"""

import os
from collections import Counter

import pytest
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from runs.models import Run
from tests.api_helpers import all_at_once, error_of

pytestmark = pytest.mark.django_db(transaction=True)

BURST = 40
RATE = 10


@pytest.fixture
def shared_counters(settings):
    """The throttle counters in Redis when the tests have one (as with CACHE_URL in production), else in process."""
    redis_url = os.environ.get("REDIS_URL")
    if redis_url:
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                       "LOCATION": redis_url.rsplit("/", 1)[0] + "/3"}}
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


def _refused_as_throttled(answers, allowed_status: int) -> None:
    assert Counter(a.status_code for a in answers) == {allowed_status: RATE, 429: BURST - RATE}
    for answer in answers:
        if answer.status_code == 429:
            error = error_of(answer, 429)
            assert error["code"] == "throttled"
            assert 0 < int(answer["Retry-After"]) <= 60 and error["details"]["retry_after"] == int(answer["Retry-After"])


def test_a_burst_of_run_starts_gets_exactly_the_rate_through(demo, api, monkeypatch, shared_counters):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES,
                                                               "runs": f"{RATE}/min"})
    clients = [api(demo["requester"]) for _ in range(BURST)]

    answers = all_at_once(BURST, lambda n: clients[n].post("/api/runs/", {"agent": "refund-order", "input": "Refund."},
                                                           format="json"))

    _refused_as_throttled(answers, 201)
    assert Run.objects.count() == RATE


def test_a_burst_of_reads_gets_exactly_the_user_rate_through(demo, api, monkeypatch, shared_counters):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES,
                                                               "user": f"{RATE}/min"})
    clients = [api(demo["requester"]) for _ in range(BURST)]

    answers = all_at_once(BURST, lambda n: clients[n].get("/api/agents/"))

    _refused_as_throttled(answers, 200)


class _OpenView(APIView):
    """An endpoint anyone may call, with the settings' throttles (every API endpoint of the product needs a login,
    and DRF checks that before the throttles)."""

    permission_classes = [AllowAny]

    def get(self, request):
        return Response({"ok": True})


def _anonymous_statuses(addresses) -> Counter:
    """Status codes of one anonymous GET per ``(REMOTE_ADDR, X-Forwarded-For)`` in ``addresses``."""
    view, factory = _OpenView.as_view(), APIRequestFactory()
    return Counter(view(factory.get("/open/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)).status_code
                   for remote, forwarded in addresses)


def test_a_made_up_x_forwarded_for_per_request_does_not_escape_the_anonymous_throttle(monkeypatch, shared_counters):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES,
                                                               "anon": f"{RATE}/min"})

    rotating = _anonymous_statuses(("198.51.100.7", f"203.0.113.{n}") for n in range(BURST))

    assert rotating == {200: RATE, 429: BURST - RATE}
    assert _anonymous_statuses([("198.51.100.8", "203.0.113.1")]) == {200: 1}  # another connection: its own count


def test_behind_trusted_proxies_the_entry_they_appended_counts_not_the_clients_own(monkeypatch, settings,
                                                                                    shared_counters):
    """``TOLLGATE_TRUSTED_PROXIES=1``: the last X-Forwarded-For entry (written by our proxy) is the client."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES,
                                                               "anon": f"{RATE}/min"})
    proxy = "10.0.0.1"

    rotating = _anonymous_statuses((proxy, f"203.0.113.{n}, 192.0.2.5") for n in range(BURST))

    assert rotating == {200: RATE, 429: BURST - RATE}
    assert _anonymous_statuses([(proxy, "203.0.113.1, 192.0.2.6")]) == {200: 1}  # another client behind the proxy
