"""Throttles under a burst: requests sent at once get no more than the rate through; and every way in counts.

Found by attacking the API: with the throttle counters in Redis (the
production shape, ``CACHE_URL``), 40 ``POST /api/runs/`` sent at once with
a rate of 10 a minute started 17 runs: DRF's throttle reads the history,
decides and writes it back, so simultaneous requests all saw room. The
throttles of ``config.throttles`` decide one request per key at a time.
In the PostgreSQL + Redis pass the counters are in that Redis.

Also found (issue 26): the Start a run page ignored ``THROTTLE_RUNS`` (40
of 40 runs started right after the API's limit was hit), and requests
without credentials or with a bad token were never counted (DRF answers
401 before its throttles run), so ``THROTTLE_ANON`` protected nothing.
"""

import os
from collections import Counter

import httpx
import pytest
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from runs.models import Run
from tests.support.api import all_at_once, error_of
from tests.support.core import asking_agent, serving_core

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


def test_a_burst_of_run_starts_gets_exactly_the_rate_through(people, api, monkeypatch, shared_counters):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES,
                                                               "runs": f"{RATE}/min"})
    agent = asking_agent().slug
    clients = [api(people["requester"]) for _ in range(BURST)]

    answers = all_at_once(BURST, lambda n: clients[n].post("/api/runs/", {"agent": agent, "input": "Send it."},
                                                           format="json"))

    _refused_as_throttled(answers, 201)
    assert Run.objects.count() == RATE


def test_a_burst_of_reads_gets_exactly_the_user_rate_through(people, api, monkeypatch, shared_counters):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES,
                                                               "user": f"{RATE}/min"})
    clients = [api(people["requester"]) for _ in range(BURST)]

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


def test_the_start_form_shares_the_api_runs_rate(people, api, monkeypatch, shared_counters):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {**SimpleRateThrottle.THROTTLE_RATES, "runs": "3/min"})
    agent = asking_agent().slug
    started = [api(people["requester"]).post("/api/runs/", {"agent": agent, "input": "Send it."},
                                           format="json").status_code for _ in range(3)]
    page = Client()
    page.force_login(people["requester"])

    refused = page.post("/runs/new/", {"agent": agent, "input": "Send 80 to acme."})

    assert started == [201] * 3
    assert refused.status_code == 429 and 0 < int(refused["Retry-After"]) <= 60
    assert b"Too many runs started" in refused.content
    assert b"Send 80 to acme." in refused.content  # the form again, with what was typed: nothing is lost
    assert Run.objects.count() == 3
    # And the other way round: runs the page started count for the API.
    other = Client()
    other.force_login(people["approver"])
    pages = [other.post("/runs/new/", {"agent": agent, "input": "Send it."}).status_code for _ in range(3)]
    api_after = api(people["approver"]).post("/api/runs/", {"agent": agent, "input": "Send it."}, format="json")
    assert pages == [302] * 3 and error_of(api_after, 429)["code"] == "throttled"
    assert Run.objects.count() == 6


def test_requests_without_credentials_or_with_a_bad_token_count_against_the_anonymous_rate(
        people, tmp_path):
    # Over real HTTP, a served Daphne with an anonymous rate of 5 a minute.
    agent = asking_agent().slug
    with serving_core(people, tmp_path, THROTTLE_ANON="5/min") as (base, _):
        bad_token = [httpx.post(f"{base}/api/runs/", json={"agent": agent, "input": "x"},
                                headers={"Authorization": "Token not-a-token"}, timeout=10) for _ in range(5)]
        no_credentials = httpx.get(f"{base}/api/runs/", timeout=10)
        wait_endpoint = httpx.get(f"{base}/api/runs/1/wait/?timeout=1", timeout=10)
        token = Token.objects.get_or_create(user=people["requester"])[0].key
        with_a_token = httpx.get(f"{base}/api/runs/", headers={"Authorization": f"Token {token}"}, timeout=10)

    assert [answer.status_code for answer in bad_token] == [401] * 5
    for answer in (no_credentials, wait_endpoint):
        assert answer.status_code == 429 and answer.json()["error"]["code"] == "throttled"
        assert 0 < int(answer.headers["Retry-After"]) <= 60
    assert with_a_token.status_code == 200, "a user's requests have the user rate"
    assert Run.objects.count() == 0
