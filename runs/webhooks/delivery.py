"""Sending deliveries: one run's events to one subscription, in order, signed, retried on a schedule.

A *chain* is the pending deliveries of one run for one subscription,
ordered by the event's ``seq``. Only its head is ever sent, and only when
no earlier event of the run is still in the outbox, so an endpoint gets a
run's events in the order they happened; the next one waits until the head
is delivered or given up.

An attempt claims the head with one conditional UPDATE (``claim_token``
grows, ``claimed_until`` = now + 3 × ``WEBHOOK_TIMEOUT_S``), posts it
outside any transaction, then records the answer only if the token is
still its own. A worker killed mid-attempt leaves the claim to expire;
the sweeper then wakes the chain and the event is sent again (at least
once: receivers drop repeats by ``webhook-id``).

Signing follows Standard Webhooks: ``webhook-id`` (``evt_<event id>``,
the same on every attempt), ``webhook-timestamp`` (Unix seconds) and
``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``,
keyed with the base64-decoded part of the ``whsec_`` secret (the
``standardwebhooks`` reference library computes it).

After a failed attempt ``n`` (no answer, or not 2xx; redirects count as
failures) the next comes ``TOLLGATE["WEBHOOK_RETRY_SCHEDULE_S"][n-1]``
seconds later; when the schedule is used up the delivery is ``failed``.

One owner's endpoints hold at most ``TOLLGATE["WEBHOOK_MAX_IN_FLIGHT_PER_USER"]``
attempts at once, counted in the database (the owner's deliveries with a
live claim), so the cap holds across worker processes: the count and the
claim are made in one transaction holding the owner's row lock, so two
workers cannot both take the last place. A chain whose owner is at the cap
sends nothing and looks again ``AT_CAP_RETRY_S`` to twice that later; a
slow subscriber therefore holds at most that many webhook worker threads,
and other owners' deliveries go out on the rest.
"""

import base64
import json
import logging
import random
import secrets
import threading
import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F, Min
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from runs.models import Run
from runs.webhooks.models import DeliveryStatus, OutboxEntry, WebhookDelivery, WebhookSubscription
from runs.webhooks.nudges import wake_chain
from runs.webhooks.urlguard import UnsafeURL, guarded_client

log = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"
RESPONSE_EXCERPT_CHARS = 1000
# Deliveries sent per actor message before the chain is handed back to the queue.
CHAIN_BATCH = 20
# Retries further off than this are not held in the broker; the sweeper wakes them when due.
BROKER_DELAY_MAX_S = 300
# Seconds (jittered up to twice this) before a chain whose owner is at the in-flight cap looks again.
AT_CAP_RETRY_S = 1.0
USER_AGENT = "Tollgate-Webhooks/1"

_client: httpx.Client | None = None
_client_lock = threading.Lock()


def new_secret() -> str:
    """A new signing secret: ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signed_headers(*, secret: str, webhook_id: str, body: str, timestamp: int) -> dict:
    """The Standard Webhooks headers for ``body`` (the exact text sent) at ``timestamp`` (Unix seconds)."""
    moment = datetime.fromtimestamp(timestamp, tz=dt_timezone.utc)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": Webhook(secret).sign(webhook_id, moment, body),
    }


def body_text(payload: dict) -> str:
    """The body sent for ``payload``: compact JSON, ASCII only, so the signed text and the bytes sent agree."""
    return json.dumps(payload, separators=(",", ":"))


def http_client() -> httpx.Client:
    """The process's pooled client: no redirects, no proxies from the environment, every connection opened by
    ``urlguard.GuardedBackend``, which checks the resolved addresses at connection time (``urlguard.guarded_client``).
    """
    global _client
    with _client_lock:
        if _client is None:
            _client = guarded_client(headers={"user-agent": USER_AGENT})
    return _client


def deliver_chain(subscription_id: int, run_id: int, *, batch: int = CHAIN_BATCH) -> int:
    """Send the due head of the chain (subscription, run), then the next, up to ``batch``; returns how many ended.

    Ends early when the head is not due, is claimed by another worker, waits
    for an earlier event still in the outbox, or failed and waits for its
    next attempt (a delayed wake-up is sent when that is near); also when
    the owner already has ``WEBHOOK_MAX_IN_FLIGHT_PER_USER`` attempts under
    way, with a delayed wake-up ``AT_CAP_RETRY_S`` to twice that later. Does
    nothing for an inactive subscription or owner. When the owner may no
    longer see the run, its deliveries are given up unsent (no place under
    the cap is needed for that).
    """
    subscription = (WebhookSubscription.objects.select_related("owner")
                    .filter(pk=subscription_id, active=True, owner__is_active=True).first())
    if subscription is None:
        return 0
    visible = Run.objects.visible_to(subscription.owner).filter(pk=run_id).exists()
    ended = 0
    for _ in range(batch):
        delivery, at_cap = _claim_head(subscription, run_id, capped=visible)
        if at_cap:
            wake_chain(subscription_id, run_id, delay_s=AT_CAP_RETRY_S * (1 + random.random()))
            return ended
        if delivery is None:
            return ended
        if not visible:
            _record(delivery, status_code=None, excerpt="", error="Not sent: the subscription's owner may no "
                                                                  "longer see this run (or it was deleted).",
                    give_up=True)
            ended += 1
            continue
        status = _record(delivery, *_post(delivery, subscription))
        if status == DeliveryStatus.PENDING:
            delay_s = (delivery.next_attempt_at - timezone.now()).total_seconds()
            if delay_s <= BROKER_DELAY_MAX_S:
                wake_chain(subscription_id, run_id, delay_s=delay_s)
            return ended
        ended += 1
    wake_chain(subscription_id, run_id)  # more may be left: let other chains have a turn first
    return ended


def _claim_head(subscription: WebhookSubscription, run_id: int, *,
                capped: bool) -> tuple[WebhookDelivery | None, bool]:
    """Claim the chain's first pending delivery if it is due and free: ``(delivery or None, at cap)``.

    With ``capped``, the claim is made only while the owner has fewer than
    ``WEBHOOK_MAX_IN_FLIGHT_PER_USER`` live claims (``(None, True)`` otherwise).
    """
    subscription_id = subscription.pk
    now = timezone.now()
    # The outbox first: an entry leaves it in the transaction that creates its
    # deliveries, so reading it before the chain never misses an earlier event.
    unfanned = OutboxEntry.objects.filter(event__run_id=run_id).aggregate(first=Min("event__seq"))["first"]
    head = (WebhookDelivery.objects.filter(subscription_id=subscription_id, run_id=run_id,
                                           status=DeliveryStatus.PENDING).order_by("event_seq").first())
    if head is None or head.next_attempt_at > now or (head.claimed_until and head.claimed_until > now):
        return None, False
    if unfanned is not None and unfanned < head.event_seq:
        return None, False  # an earlier event is being fanned out; its dispatch wakes this chain again
    timeout_s = settings.TOLLGATE["WEBHOOK_TIMEOUT_S"]
    cap, owner_id = settings.TOLLGATE["WEBHOOK_MAX_IN_FLIGHT_PER_USER"], subscription.owner_id
    if capped and _in_flight(owner_id, now) >= cap:
        return None, True  # a chain polling at the cap takes no lock and no write transaction
    with transaction.atomic():
        if capped:
            # The owner's claims are made one at a time (their row is locked, as
            # services.create_subscription does), so this count stays true until the claim.
            list(get_user_model().objects.select_for_update().filter(pk=owner_id).values_list("pk"))
            if _in_flight(owner_id, now) >= cap:
                return None, True
        claimed = WebhookDelivery.objects.filter(
            pk=head.pk, status=DeliveryStatus.PENDING, claim_token=head.claim_token,
        ).update(claim_token=F("claim_token") + 1, claimed_until=now + timedelta(seconds=3 * timeout_s),
                 attempt_count=F("attempt_count") + 1, last_attempt_at=now, updated_at=now)
    if not claimed:
        return None, False
    head.claim_token += 1
    head.attempt_count += 1
    return head, False


def _in_flight(owner_id: int, now: datetime) -> int:
    """How many deliveries of ``owner_id``'s subscriptions are being sent: pending, with a claim that has not expired.

    A claim whose worker died counts until it expires (3 × ``WEBHOOK_TIMEOUT_S``).
    """
    return WebhookDelivery.objects.filter(subscription__owner_id=owner_id, status=DeliveryStatus.PENDING,
                                          claimed_until__gt=now).count()


def _post(delivery: WebhookDelivery, subscription: WebhookSubscription) -> tuple[int | None, str, str]:
    """POST the delivery; returns ``(status code or None, start of the answer, error)``."""
    body = body_text(delivery.payload)
    headers = {"content-type": "application/json", "accept-encoding": "identity",
               **signed_headers(secret=subscription.secret, webhook_id=delivery.webhook_id, body=body,
                                timestamp=int(time.time()))}
    timeout_s = settings.TOLLGATE["WEBHOOK_TIMEOUT_S"]
    try:
        with http_client().stream("POST", subscription.url, content=body.encode(), headers=headers,
                                  timeout=httpx.Timeout(timeout_s)) as response:
            return response.status_code, _excerpt(response, deadline=time.monotonic() + timeout_s), ""
    except UnsafeURL as exc:
        return None, "", exc.message
    except httpx.HTTPError as exc:
        return None, "", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _excerpt(response: httpx.Response, *, deadline: float) -> str:
    """The start of the answer's body as text (``RESPONSE_EXCERPT_CHARS`` at most, NULs removed), read until ``deadline``.

    Read raw, never decompressed, so a compressed answer cannot swell in memory.
    """
    chunks, size = [], 0
    try:
        for chunk in response.iter_raw(chunk_size=1024):
            chunks.append(chunk)
            size += len(chunk)
            if size >= 4 * RESPONSE_EXCERPT_CHARS or time.monotonic() > deadline:
                break
    except httpx.HTTPError:  # the status line came; a body cut short does not change it
        pass
    text = b"".join(chunks).decode("utf-8", errors="replace").replace("\x00", "")
    return text[:RESPONSE_EXCERPT_CHARS]


def _record(delivery: WebhookDelivery, status_code: int | None, excerpt: str, error: str, *,
            give_up: bool = False) -> str:
    """Store an attempt's result if the claim is still ours; returns the delivery's status afterwards.

    2xx -> ``delivered``; otherwise the next attempt is scheduled, or the
    delivery is ``failed`` once the schedule is used up (or ``give_up``).
    """
    now = timezone.now()
    fields = {"last_status_code": status_code, "last_response": excerpt, "last_error": error,
              "claimed_until": None, "updated_at": now}
    schedule = settings.TOLLGATE["WEBHOOK_RETRY_SCHEDULE_S"]
    if status_code is not None and 200 <= status_code < 300:
        fields.update(status=DeliveryStatus.DELIVERED, delivered_at=now)
    elif give_up or delivery.attempt_count > len(schedule):
        fields.update(status=DeliveryStatus.FAILED)
    else:
        delivery.next_attempt_at = now + timedelta(seconds=schedule[delivery.attempt_count - 1])
        fields.update(next_attempt_at=delivery.next_attempt_at)
    if not WebhookDelivery.objects.filter(pk=delivery.pk, claim_token=delivery.claim_token).update(**fields):
        log.warning("delivery %s: claim lost during the attempt; its result is not recorded", delivery.pk)
        return DeliveryStatus.PENDING
    return fields.get("status", DeliveryStatus.PENDING)
