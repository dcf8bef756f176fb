"""The REST API's throttles: DRF's per-user, per-address and scoped rates, counted one request at a time.

DRF's ``SimpleRateThrottle`` reads a key's request history from the cache,
decides, and writes the history back: two requests that read it at the
same moment both see room for one more, so a burst sent at once (from
several server processes sharing ``CACHE_URL``) got far more than the
rate through. ``SerializedRateThrottle`` makes that read-decide-write
one step per key with a short lock in the same cache (``cache.add``, an
atomic set-if-absent in Redis and in the in-process cache), the approach
of a lock around a read-modify-write; the rates, the sliding window and
``Retry-After`` stay DRF's. A request may count as several (``weight``: a
batch of runs counts one per run), all or none, in the same window.

A request that cannot take the lock within ``LOCK_WAIT_S`` (the key is
that busy, or a process died holding it: the lock expires after
``LOCK_TIMEOUT_S``) is throttled with a wait of one second. Waiters poll
with a capped exponential backoff and full jitter, so a burst of them
does not starve the holder of the CPU (and the cache) it needs to finish:
with a fixed 2 ms poll, 40 simultaneous requests on two cores kept the
holder waiting past a second, and requests with room were throttled.

The same counts outside DRF's views: ``check_run_start_rate`` (the start
form shares the API's ``runs`` rate), ``count_failed_authentication``
(requests that fail authentication or bring none count against the
``anon`` rate: DRF answers them 401 before its throttles run), and
``client_address``, the one notion of a client's address (django-axes
locks out by it too).
"""

import math
import random
import time
import uuid
from types import SimpleNamespace

from django.contrib.auth.models import AnonymousUser
from django.utils.translation import gettext
from rest_framework import throttling

from runs.base.errors import InvalidInput, Throttled


class SerializedRateThrottle(throttling.SimpleRateThrottle):
    """DRF's ``SimpleRateThrottle``, but one request of a key decides at a time (module doc).

    Listed after DRF's own class in a throttle's bases, so that class's
    ``allow_request`` (e.g. the scoped one choosing its rate) runs first
    and reaches this one through ``super()``.
    """

    LOCK_TIMEOUT_S = 5
    LOCK_WAIT_S = 5.0
    LOCK_POLL_S = 0.002  # the first wait; doubled after each miss, up to LOCK_POLL_MAX_S
    LOCK_POLL_MAX_S = 0.05
    contended = False
    weight = 1  # requests this one counts as: a batch of runs counts one per run (check_run_start_rate)

    def allow_request(self, request, view):
        """DRF's decision, taken while holding the key's lock; False (wait 1 s) if the lock stays taken."""
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        lock, token = f"{key}:lock", uuid.uuid4().hex
        deadline, poll = time.monotonic() + self.LOCK_WAIT_S, self.LOCK_POLL_S
        while not self.cache.add(lock, token, self.LOCK_TIMEOUT_S):
            if time.monotonic() >= deadline:
                self.contended = True
                return False
            time.sleep(random.uniform(0, poll))  # full jitter (AWS Architecture Blog, 2015)
            poll = min(poll * 2, self.LOCK_POLL_MAX_S)
        try:
            return super().allow_request(request, view) if self.weight == 1 else self._allow_weighted(key)
        finally:
            if self.cache.get(lock) == token:  # not a lock that expired and was taken meanwhile
                self.cache.delete(lock)

    def _allow_weighted(self, key: str) -> bool:
        """DRF's decision (sliding window, history newest first) for ``weight`` requests at once: all or none."""
        self.key, self.now = key, self.timer()
        self.history = self.cache.get(key, [])
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()
        if len(self.history) + self.weight > self.num_requests:
            return self.throttle_failure()
        self.history[:0] = [self.now] * self.weight
        self.cache.set(key, self.history, self.duration)
        return True

    def wait(self):
        """Seconds until the next request may pass: DRF's estimate, or 1 when the lock was not to be had; for a
        ``weight`` over 1, until enough of the window's oldest requests have left it."""
        if self.contended:
            return 1.0
        if self.weight > 1:
            leaving = len(self.history) + self.weight - self.num_requests  # the oldest that must leave the window
            return max(0.0, self.history[len(self.history) - leaving] + self.duration - self.now)
        return super().wait()


class AnonRateThrottle(throttling.AnonRateThrottle, SerializedRateThrottle):
    """Anonymous requests, per client address (rate ``anon``): ``REMOTE_ADDR``, or with
    ``NUM_PROXIES`` (``TOLLGATE_TRUSTED_PROXIES``) above 0 the X-Forwarded-For entry that many places
    from its end (DRF's ``get_ident``); a client's own X-Forwarded-For never counts."""


class UserRateThrottle(throttling.UserRateThrottle, SerializedRateThrottle):
    """Every request of a user or their token (rate ``user``)."""


class ScopedRateThrottle(throttling.ScopedRateThrottle, SerializedRateThrottle):
    """Views with a ``throttle_scope`` (starting runs: ``runs``)."""


def client_address(request) -> str:
    """The address a request (Django's or DRF's) comes from, as every throttle and the login lockout count it.

    ``REMOTE_ADDR``, or with ``NUM_PROXIES`` (``TOLLGATE_TRUSTED_PROXIES``) > 0 the X-Forwarded-For entry that many places
    from its end (DRF's ``get_ident``); a client's own X-Forwarded-For never counts.
    """
    return throttling.BaseThrottle().get_ident(request)


def count_failed_authentication(request) -> float | None:
    """Count a request (Django's or DRF's) with no or bad credentials against its address's ``anon`` rate.

    Returns None within the rate, else the seconds until the next may pass (the caller answers 429, not 401).
    """
    throttle = AnonRateThrottle()
    anonymous = SimpleNamespace(user=AnonymousUser(), META=request.META, headers=request.headers)
    if throttle.allow_request(anonymous, None):
        return None
    return throttle.wait() or 1.0


def check_run_start_rate(request, count: int = 1) -> None:
    """Count ``count`` run starts by ``request.user`` against the per-user ``runs`` rate of ``POST /api/runs/`` (DRF's
    ``ScopedRateThrottle``), all or none.

    Raises ``Throttled`` (429, ``details.retry_after`` in whole seconds) when the rate has no room for them now,
    ``InvalidInput`` (400, field ``inputs``) when ``count`` is over the whole rate (they could never pass together).
    """
    throttle = ScopedRateThrottle()
    throttle.weight = count
    if not throttle.allow_request(request, SimpleNamespace(throttle_scope="runs")):
        if count > throttle.num_requests:
            raise InvalidInput.for_fields({"inputs": gettext(
                "At most %(count)s runs can be started at once (the runs rate).") % {"count": throttle.num_requests}})
        wait = max(1, math.ceil(throttle.wait() or 1))
        raise Throttled(gettext("Too many runs started; try again in %(seconds)s seconds.") % {"seconds": wait},
                        details={"retry_after": wait})
