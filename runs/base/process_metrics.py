"""Prometheus metrics that only a process knows: how long steps and model calls take, how late messages start,
what the sweeper did, what a worker holds now, and Dramatiq's own message counts.

``runs.ops.metrics`` reads everything else from the database at scrape
time; these are counted where they happen (prometheus-client), so every
process keeps its own. Multi-process collection is prometheus-client's
(its docs, "Multiprocess Mode"): with ``PROMETHEUS_MULTIPROC_DIR`` set in
the environment of every process of a host before it starts (the same
empty directory for the servers, the workers and the sweeper of that
host, emptied at each deployment), each process writes its values to
files there, and ``/metrics`` on any server of the host merges them
(``exposition_collector``). Without it (the embedded shape: one process)
``/metrics`` shows this process's own values.

The families (docs/operating.md says what each means and what to alert on):

* ``tollgate_step_duration_seconds``: one pass of the agent loop
  (``timed_step``: a model turn, a tool call, a reconciliation, a wait);
* ``tollgate_model_call_duration_seconds{provider, outcome}``: one model
  call, from its request to its answer (``timed_model_call``; outcome
  ``ok``, ``error`` or ``cancelled``: its timeout, the run's deadline or cancel);
* ``tollgate_queue_lag_seconds{queue_name, actor_name}``: from a message's
  enqueue (or, for a delayed message, the time it was due) to its actor's start;
* ``tollgate_sweeper_passes_total{job, result}`` and
  ``tollgate_sweeper_actions_total{job, action}``: sweeper passes (``job``:
  a registered sweep job's name, ``runs.sweeping``; ``result`` ``ok`` or
  ``failed``) and what each did (the counts it returns, e.g. ``reenqueued``);
* ``tollgate_process_runs_in_flight``: runs the process's engine is
  advancing now (per process: ``pid`` label in multi-process mode);
* ``tollgate_tool_threads_abandoned_total`` and
  ``tollgate_process_abandoned_tool_threads``: sync tool handler threads
  left running a call that timed out, ever and now;
* Dramatiq's own, under the names of its ``Prometheus`` middleware
  (``dramatiq.middleware.prometheus``, the same meaning):
  ``dramatiq_messages_total``, ``dramatiq_message_errors_total``,
  ``dramatiq_messages_inprogress`` and
  ``dramatiq_message_duration_milliseconds``, each by ``queue_name`` and
  ``actor_name`` (``runs.engine.worker_middleware.MetricsMiddleware``
  counts them).
"""

import asyncio
import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import multiprocess

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
MESSAGE_LABELS = ("queue_name", "actor_name")

# This process's values; exposed as they are only without PROMETHEUS_MULTIPROC_DIR (then each metric also
# writes its value to that directory, whatever registry holds it).
registry = CollectorRegistry()

STEP_SECONDS = Histogram(
    "tollgate_step_duration_seconds", "Duration of one pass of the agent loop (a model turn, a tool call, a "
    "reconciliation, a wait), in seconds.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=registry)
MODEL_CALL_SECONDS = Histogram(
    "tollgate_model_call_duration_seconds", "Duration of one model call, from its request to its answer, in "
    "seconds, by provider and outcome (ok, error, cancelled).", ["provider", "outcome"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600), registry=registry)
QUEUE_LAG_SECONDS = Histogram(
    "tollgate_queue_lag_seconds", "Seconds from a broker message's enqueue (a delayed one: the time it was due) "
    "to its actor's start.", MESSAGE_LABELS,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900), registry=registry)
SWEEPER_PASSES = Counter(
    "tollgate_sweeper_passes", "Sweeper passes, by registered sweep job and result (ok, failed).",
    ["job", "result"], registry=registry)
SWEEPER_ACTIONS = Counter(
    "tollgate_sweeper_actions", "What sweeper passes did, by job and action (the counts a pass returns: "
    "reenqueued, started, woken, expired, past_deadline, expiry_warnings, reconciled, webhook_events, "
    "webhook_chains_woken).", ["job", "action"],
    registry=registry)
RUNS_IN_FLIGHT = Gauge(
    "tollgate_process_runs_in_flight", "Runs this process's engine is advancing now.",
    multiprocess_mode="liveall", registry=registry)
TOOL_THREADS_ABANDONED = Counter(
    "tollgate_tool_threads_abandoned", "Sync tool handler threads left running a call that timed out.",
    registry=registry)
ABANDONED_TOOL_THREADS = Gauge(
    "tollgate_process_abandoned_tool_threads", "Sync tool handler threads of this process still running a call "
    "that timed out.", multiprocess_mode="liveall", registry=registry)
MESSAGES = Counter("dramatiq_messages", "The total number of messages processed.", MESSAGE_LABELS,
                   registry=registry)
MESSAGE_ERRORS = Counter("dramatiq_message_errors", "The total number of errored messages.", MESSAGE_LABELS,
                         registry=registry)
MESSAGES_IN_PROGRESS = Gauge("dramatiq_messages_inprogress", "The number of messages in progress.", MESSAGE_LABELS,
                             multiprocess_mode="livesum", registry=registry)
MESSAGE_MILLISECONDS = Histogram(
    "dramatiq_message_duration_milliseconds", "The time spent processing messages.", MESSAGE_LABELS,
    buckets=(5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000, 30000, 60000, 600000, 900000),
    registry=registry)


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set (multi-process collection), else None."""
    return os.environ.get(MULTIPROCESS_ENV) or None


def exposition_collector(scrape: CollectorRegistry) -> None:
    """Add to ``scrape`` (a registry made for one scrape) the values of every process of this host that writes
    to ``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's ``MultiProcessCollector``), or, without it, this
    process's own."""
    path = multiprocess_dir()
    if path:
        multiprocess.MultiProcessCollector(scrape, path=path)
    else:
        scrape.register(registry)


def process_ended() -> None:
    """This process stops (its Dramatiq workers shut down): its live gauges leave ``PROMETHEUS_MULTIPROC_DIR``
    (prometheus-client's ``mark_process_dead``). Nothing without that directory."""
    path = multiprocess_dir()
    if path:
        multiprocess.mark_process_dead(os.getpid(), path)


def timed_step(steps):
    """Run the step generator ``steps`` (``runs.base.awaiting.Steps``) as ``yield from`` would, and observe its
    wall time in ``tollgate_step_duration_seconds`` however it ends; returns its result."""
    started = time.perf_counter()
    try:
        return (yield from steps)
    finally:
        STEP_SECONDS.observe(time.perf_counter() - started)


async def timed_model_call(call, model_config: dict):
    """Await the model call ``call`` (an awaitable) of an agent with ``model_config`` (``{"provider", ...}``)
    and observe its duration in ``tollgate_model_call_duration_seconds``; returns or raises what it does."""
    started, outcome = time.perf_counter(), "error"
    try:
        answer = await call
        outcome = "ok"
        return answer
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        MODEL_CALL_SECONDS.labels(str(model_config.get("provider", "")), outcome).observe(
            time.perf_counter() - started)


def run_in_flight():
    """A context manager: a run is in flight in this process's engine within it (``tollgate_process_runs_in_flight``)."""
    return RUNS_IN_FLIGHT.track_inprogress()


def tool_thread_abandoned() -> None:
    """A sync tool handler thread was left running a call that timed out."""
    TOOL_THREADS_ABANDONED.inc()
    ABANDONED_TOOL_THREADS.inc()


def tool_thread_settled() -> None:
    """An abandoned tool handler thread finished its call."""
    ABANDONED_TOOL_THREADS.dec()


def sweeper_pass(job: str, done: dict | None) -> None:
    """One pass of sweep job ``job`` (its registered name) ended: ``done`` the counts it returned (``{action:
    n}``), or None when it failed."""
    SWEEPER_PASSES.labels(job, "failed" if done is None else "ok").inc()
    for action, number in (done or {}).items():
        SWEEPER_ACTIONS.labels(job, action).inc(number)


def message_started(queue_name: str, actor_name: str, *, lag_s: float) -> None:
    """A broker message's actor starts, ``lag_s`` seconds after the message was enqueued (or due)."""
    QUEUE_LAG_SECONDS.labels(queue_name, actor_name).observe(max(0.0, lag_s))
    MESSAGES_IN_PROGRESS.labels(queue_name, actor_name).inc()


def message_skipped(queue_name: str, actor_name: str) -> None:
    """A broker message was skipped before its actor started (counted as processed, as Dramatiq does)."""
    MESSAGES.labels(queue_name, actor_name).inc()


def message_ended(queue_name: str, actor_name: str, *, duration_ms: float, failed: bool) -> None:
    """A broker message's actor ended (``failed``: it raised), ``duration_ms`` after ``message_started``."""
    MESSAGES_IN_PROGRESS.labels(queue_name, actor_name).dec()
    MESSAGE_MILLISECONDS.labels(queue_name, actor_name).observe(duration_ms)
    MESSAGES.labels(queue_name, actor_name).inc()
    if failed:
        MESSAGE_ERRORS.labels(queue_name, actor_name).inc()
