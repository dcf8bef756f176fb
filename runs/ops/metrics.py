"""Prometheus metrics at ``/metrics``: the database's figures, computed when scraped, and the processes' own
(``runs.base.process_metrics``); closed unless configured.

``DatabaseCollector`` makes each metric family from one aggregate query
at scrape time (``GROUP BY`` over an indexed column where there is one),
so every server process answers the same figures and nothing of them is
kept in the processes. What only a process knows (latencies, queue lag,
sweeper passes, Dramatiq's message counts) is merged from every process
of the host that writes to ``PROMETHEUS_MULTIPROC_DIR``
(``runs.base.process_metrics.exposition_collector``). The database's families
(docs/operating.md says what each means and what to alert on):

* ``tollgate_runs{status, waiting_reason}``: runs by status (every status
  is present, 0 included) and, for waiting runs, why they wait; from the
  same query, ``tollgate_run_tokens{direction}`` and
  ``tollgate_run_cost_usd`` over every run;
* ``tollgate_inbox_pending{kind}`` and
  ``tollgate_inbox_oldest_pending_age_seconds{kind}``: pending inbox items
  (``approval``, ``input``, ``reconciliation``) and the age of the oldest;
* ``tollgate_tool_calls{status}`` (``unknown``: an outcome nobody knows
  yet, to be reconciled) and
  ``tollgate_tool_calls_oldest_unknown_age_seconds``;
* ``tollgate_webhook_deliveries{status}`` and
  ``tollgate_webhook_oldest_pending_age_seconds``;
* ``tollgate_workers{state}`` (``live``/``stale``) and, per worker
  (``runs.ops.models.WorkerHeartbeat``),
  ``tollgate_worker_runs_in_flight``, ``tollgate_worker_abandoned_tool_threads``
  and ``tollgate_worker_last_seen_age_seconds``.

Access (``access``): with no ``TOLLGATE["METRICS_TOKEN"]`` the endpoint
does not exist (404); with one, a request must bring
``Authorization: Bearer <token>`` (else 401).
"""

import hmac

from django.conf import settings
from django.db.models import Count, Min, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from runs.base import process_metrics
from runs.models import Run, RunStatus, WaitingReason
from runs.ops.models import WorkerHeartbeat, stale_after
from runs.webhooks.models import DeliveryStatus, WebhookDelivery
from tools.models import ToolCall, ToolCallStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST


def _age_s(now, then) -> float:
    return max(0.0, (now - then).total_seconds()) if then is not None else 0.0


def runs_by_status() -> list[GaugeMetricFamily]:
    """``tollgate_runs{status, waiting_reason}`` (every status, waiting once per reason, 0 where none), and from
    the same query ``tollgate_run_tokens{direction}`` and ``tollgate_run_cost_usd``, summed over every run."""
    family = GaugeMetricFamily("tollgate_runs", "Runs by status, and for waiting runs by waiting reason.",
                               labels=["status", "waiting_reason"])
    counts = {(status, ""): 0 for status in RunStatus.values if status != RunStatus.WAITING}
    counts.update({(RunStatus.WAITING.value, reason): 0 for reason in WaitingReason.values})
    tokens_in = tokens_out = cost = 0
    for status, reason, number, used_in, used_out, spent in (
            Run.objects.order_by().values_list("status", "waiting_reason")
            .annotate(number=Count("pk"), used_in=Sum("input_tokens"), used_out=Sum("output_tokens"),
                      spent=Sum("cost_usd"))
            .values_list("status", "waiting_reason", "number", "used_in", "used_out", "spent")):
        key = (status, reason if status == RunStatus.WAITING else "")
        counts[key] = counts.get(key, 0) + number
        tokens_in, tokens_out, cost = tokens_in + (used_in or 0), tokens_out + (used_out or 0), cost + (spent or 0)
    for (status, reason), number in sorted(counts.items()):
        family.add_metric([status, reason], number)
    tokens = GaugeMetricFamily("tollgate_run_tokens", "Model tokens used by every run in the database, by "
                               "direction (input, output).", labels=["direction"])
    tokens.add_metric(["input"], tokens_in)
    tokens.add_metric(["output"], tokens_out)
    spend = GaugeMetricFamily("tollgate_run_cost_usd", "Model cost of every run in the database, in US dollars "
                              "(TOLLGATE['MODEL_PRICES']).", value=float(cost))
    return [family, tokens, spend]


def pending_inbox(now) -> list[GaugeMetricFamily]:
    """``tollgate_inbox_pending{kind}`` and ``tollgate_inbox_oldest_pending_age_seconds{kind}`` (0: none)."""
    pending = GaugeMetricFamily("tollgate_inbox_pending", "Pending inbox items (approvals, questions, "
                                "reconciliations) by kind.", labels=["kind"])
    oldest = GaugeMetricFamily("tollgate_inbox_oldest_pending_age_seconds",
                               "Age of the oldest pending inbox item of each kind, in seconds (0: none pending).",
                               labels=["kind"])
    found = {kind: (number, first) for kind, number, first in (
        Interrupt.objects.filter(status=InterruptStatus.PENDING).order_by().values_list("kind")
        .annotate(number=Count("pk"), first=Min("created_at")).values_list("kind", "number", "first"))}
    for kind in InterruptKind.values:
        number, first = found.get(kind, (0, None))
        pending.add_metric([kind], number)
        oldest.add_metric([kind], _age_s(now, first))
    return [pending, oldest]


def _by_status(now, rows, statuses, counted: tuple[str, str], oldest: tuple[str, str, str]) -> list[GaugeMetricFamily]:
    """``counted`` = (name, help): ``rows`` (a queryset with ``status`` and ``created_at``) counted by status, every
    one of ``statuses`` present (0 included); ``oldest`` = (name, help, status): seconds since the oldest row of
    that status was created (0: none). One aggregate query."""
    by_status = GaugeMetricFamily(*counted, labels=["status"])
    found = {status: (number, first) for status, number, first in (
        rows.order_by().values_list("status").annotate(number=Count("pk"), first=Min("created_at"))
        .values_list("status", "number", "first"))}
    for status in statuses:
        by_status.add_metric([status], found.get(status, (0, None))[0])
    name, documentation, status = oldest
    return [by_status, GaugeMetricFamily(name, documentation, value=_age_s(now, found.get(status, (0, None))[1]))]


def tool_calls(now) -> list[GaugeMetricFamily]:
    """``tollgate_tool_calls{status}`` (every status, 0 included) and
    ``tollgate_tool_calls_oldest_unknown_age_seconds`` (since the oldest unknown call was proposed)."""
    return _by_status(now, ToolCall.objects, ToolCallStatus.values, (
        "tollgate_tool_calls", "Tool calls by status (unknown: outcome not known yet, to be reconciled)."), (
        "tollgate_tool_calls_oldest_unknown_age_seconds",
        "Age of the oldest tool call whose outcome is unknown, in seconds (0: none).", ToolCallStatus.UNKNOWN.value))


def webhook_deliveries(now) -> list[GaugeMetricFamily]:
    """``tollgate_webhook_deliveries{status}`` and ``tollgate_webhook_oldest_pending_age_seconds``."""
    return _by_status(now, WebhookDelivery.objects, DeliveryStatus.values, (
        "tollgate_webhook_deliveries", "Webhook deliveries by status (failed: the retry schedule was used up)."), (
        "tollgate_webhook_oldest_pending_age_seconds",
        "Age of the oldest webhook delivery not delivered yet, in seconds (0: none).", DeliveryStatus.PENDING.value))


def workers(now) -> list[GaugeMetricFamily]:
    """``tollgate_workers{state}`` and, per worker id, its runs in flight, abandoned tool threads and the
    seconds since its last heartbeat (``runs.ops.models.WorkerHeartbeat``)."""
    states = GaugeMetricFamily("tollgate_workers", "Worker processes by heartbeat state (stale: three beats "
                               "missed).", labels=["state"])
    in_flight = GaugeMetricFamily("tollgate_worker_runs_in_flight", "Runs in flight in each worker process.",
                                  labels=["worker"])
    abandoned = GaugeMetricFamily("tollgate_worker_abandoned_tool_threads", "Sync tool handler threads of each "
                                  "worker still running a call that timed out.", labels=["worker"])
    silent = GaugeMetricFamily("tollgate_worker_last_seen_age_seconds", "Seconds since each worker's last "
                               "heartbeat.", labels=["worker"])
    live = stale = 0
    for worker_id, last_seen, running, left in WorkerHeartbeat.objects.order_by("worker_id").values_list(
            "worker_id", "last_seen", "runs_in_flight", "abandoned_threads"):
        if now - last_seen > stale_after():
            stale += 1
        else:
            live += 1
        in_flight.add_metric([worker_id], running)
        abandoned.add_metric([worker_id], left)
        silent.add_metric([worker_id], _age_s(now, last_seen))
    states.add_metric(["live"], live)
    states.add_metric(["stale"], stale)
    return [states, in_flight, abandoned, silent]


class DatabaseCollector(Collector):
    """prometheus-client collector: the families above, read from the database at each scrape."""

    def collect(self):
        now = timezone.now()
        yield from runs_by_status()
        yield from pending_inbox(now)
        yield from tool_calls(now)
        yield from webhook_deliveries(now)
        yield from workers(now)


def exposition() -> bytes:
    """The metrics in Prometheus's text format: the database's (one query per family) and the processes'
    (``runs.base.process_metrics``). Raises ``DatabaseError``."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(DatabaseCollector())
    process_metrics.exposition_collector(scrape)
    return generate_latest(scrape)


def access(authorization: str) -> str:
    """Whether a request with the ``Authorization`` header value ``authorization`` may read the metrics:
    ``"closed"`` (no ``TOLLGATE["METRICS_TOKEN"]`` set), ``"refused"`` (not ``Bearer <that token>``) or
    ``"allowed"``. The token is compared in constant time."""
    token = settings.TOLLGATE["METRICS_TOKEN"]
    if not token:
        return "closed"
    scheme, _, offered = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(offered.strip().encode(), token.encode()):
        return "refused"
    return "allowed"
