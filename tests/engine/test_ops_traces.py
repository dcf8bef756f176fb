"""Traces (issue 25): one approved run gives one trace, with model-call spans carrying the GenAI attributes and
token counts, tool spans and the approval wait; nothing is recorded unless a tracer provider is installed.

The SDK's in-memory exporter stands in for a collector. The worker runs
in this process; the trace id is derived from the run's row alone
(``runs.base.tracing.run_ids``), which is what puts another process's spans in
the same trace.
"""

import json
import logging
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals.services import decide_interrupt
from runs.base import tracing
from runs.engine.lifecycle import start_run
from runs.models import Run, RunStatus
from runs.engine.sweep_jobs import start_scheduled_runs
from tests.support.api import pending_interrupts
from tests.support.bookings import (book_room, book_room_env, booking_agent, booking_run, find_rooms,
                                    service)  # noqa: F401  (service: a fixture)
from tests.support.api import start_run as start_run_by_api
from tests.support.core import asking_agent, refused_agent
from tests.support.processes import database_url_for_subprocess
from tests.engine.test_reconciliation import wire_transfer  # noqa: F401  (a fixture)
from tests.engine.test_retries_and_sweeper import flaky_lookup  # noqa: F401  (a fixture)
from tests.support.waits import sweep_later, waiting_agent

pytestmark = pytest.mark.django_db(transaction=True)


def _forget_provider() -> None:
    # OpenTelemetry lets a process set its provider once; its own tests reset these globals the same way.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _forget_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        _forget_provider()


@pytest.fixture
def instrumented(monkeypatch):
    """Spans of the run and of the instrumented libraries (Django, psycopg, httpx, aiohttp), exported to memory through
    the same filter as in production (``WithoutLoneQueries``); the instrumentations are turned off after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(tracing.WithoutLoneQueries(SimpleSpanProcessor(exporter)))
    _forget_provider()
    trace.set_tracer_provider(provider)
    position = "OTEL_PYTHON_DJANGO_MIDDLEWARE_POSITION"
    monkeypatch.setenv(position, "")  # restored after; instrument_libraries sets it only where unset
    monkeypatch.delenv(position)
    instrumentors = tracing.instrument_libraries()
    assert len(instrumentors) == 4
    try:
        yield exporter
    finally:
        for instrumentor in instrumentors:
            instrumentor.uninstrument()
        _forget_provider()


def _approved_transfer(people, worker):
    run = start_run(agent=asking_agent(), user=people["requester"], input="send please")
    worker.drain()
    run.refresh_from_db()
    decide_interrupt(interrupt=run.interrupts.get(), user=people["approver"], decision="approved")
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    return run


def test_an_approved_transfer_run_is_one_trace_of_model_calls_tool_calls_and_the_approval_wait(spans, people,
                                                                                              worker):
    run = _approved_transfer(people, worker)
    finished = spans.get_finished_spans()

    trace_id, root_id = tracing.run_ids(run.pk, run.created_at)
    assert {span.context.trace_id for span in finished} == {trace_id}
    by_name = {}
    for span in finished:
        by_name.setdefault(span.name.split(" ")[0], []).append(span)
    assert sorted(by_name) == ["approval", "chat", "decision", "execute_tool"]

    model_calls = by_name["chat"]
    assert len(model_calls) == run.model_calls == 3
    assert sum(s.attributes["gen_ai.usage.input_tokens"] for s in model_calls) == run.input_tokens > 0
    assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in model_calls) == run.output_tokens > 0
    for span in model_calls:
        assert span.parent.span_id == root_id
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.provider.name"] == run.agent.model["provider"]
        assert span.attributes["gen_ai.conversation.id"] == str(run.session_id)
        assert span.attributes["gen_ai.response.finish_reasons"]

    tools = {span.attributes["gen_ai.tool.name"]: span for span in by_name["execute_tool"]}
    sent = run.tool_calls.get(name="fake_transfer")
    assert set(tools) == set(run.tool_calls.values_list("name", flat=True))
    assert dict(tools["fake_transfer"].attributes).items() >= {
        "gen_ai.tool.call.id": sent.provider_call_id, "tollgate.tool_call.id": sent.pk,
        "tollgate.tool.side_effect": True, "tollgate.tool.attempts": 1, "tollgate.tool.outcome": "succeeded"}.items()

    (wait,), (decision,) = by_name["approval"], by_name["decision"]
    item = run.interrupts.get()
    assert (wait.start_time, wait.end_time) == (int(item.created_at.timestamp() * 1e9),
                                                int(item.resolved_at.timestamp() * 1e9))
    assert decision.parent.span_id == wait.context.span_id and decision.attributes["tollgate.decision"] == "approved"
    assert wait.start_time < tools["fake_transfer"].start_time  # the transfer ran once approved

    texts = " ".join(str(value) for span in finished for value in span.attributes.values())
    assert "send please" not in texts and "account" not in texts  # no prompt, arguments or results


def _attribute(span, name: str, old_name: str):
    """An attribute by its name in the current semantic conventions, or in the older ones."""
    return span.attributes.get(name, span.attributes.get(old_name))


def _http_client_spans(finished):
    return [span for span in finished if span.kind == trace.SpanKind.CLIENT and (
        "http.request.method" in span.attributes or "http.method" in span.attributes)]


def test_an_api_request_is_a_server_span_and_a_tools_http_requests_are_in_the_runs_trace(service, instrumented,
                                                                                          people, worker, api,
                                                                                          monkeypatch):
    find_rooms(monkeypatch)
    book_room(monkeypatch)
    created = start_run_by_api(api(people["requester"]), booking_agent().slug, "Book me a room.")
    worker.drain()
    run = Run.objects.get(pk=created["id"])
    decide_interrupt(interrupt=run.interrupts.get(), user=people["approver"], decision="approved")
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    finished = instrumented.get_finished_spans()

    servers = [span for span in finished if span.kind == trace.SpanKind.SERVER]
    assert [(span.name, span.attributes["http.route"]) for span in servers] == [("POST api/runs/$", "api/runs/$")]  # the router's regex
    (server,) = servers
    assert _attribute(server, "http.response.status_code", "http.status_code") == 201

    trace_id, root_id = tracing.run_ids(run.pk, run.created_at)
    tools = {span.attributes["gen_ai.tool.name"]: span for span in finished if span.name.startswith("execute_tool")}
    requests = _http_client_spans(finished)  # to the bookings service: the rooms found, the booking
    assert len(requests) >= 2 and {span.context.trace_id for span in requests} == {trace_id}
    assert all(_attribute(span, "url.full", "http.url").startswith(service.base_url) for span in requests)
    (booking_request,) = [span for span in requests if _attribute(span, "url.full", "http.url").endswith("/tools/book")]
    assert _attribute(booking_request, "http.request.method", "http.method") == "POST"
    assert booking_request.parent.span_id == tools["book_room"].context.span_id
    assert tools["book_room"].start_time <= booking_request.start_time <= booking_request.end_time <= \
        tools["book_room"].end_time
    assert {span.parent.span_id for span in requests} <= {root_id, tools["book_room"].context.span_id,
                                                          tools["find_rooms"].context.span_id}
    queries = [span for span in finished if span.instrumentation_scope.name == tracing.PSYCOPG_SCOPE]
    assert all(span.parent is not None for span in queries)  # lone queries (heartbeat, lease keeper) are not kept
    assert {span.context.trace_id for span in finished if span not in queries} == {trace_id, server.context.trace_id}


def test_probes_are_not_traced_and_still_answer_any_host(instrumented, people):
    client = Client(HTTP_HOST="10.0.3.7:8000")
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert not [span for span in instrumented.get_finished_spans() if span.kind == trace.SpanKind.SERVER]


def test_nothing_is_recorded_without_a_tracer_provider(people, worker):
    assert not tracing.recording()
    assert not tracing.configure_from_environment()  # no OTEL_* variable in the tests' environment
    _approved_transfer(people, worker)  # runs as before, and no span is made
    assert not tracing.recording()


def test_a_worker_in_another_process_puts_its_spans_in_the_same_trace(spans, people, idle_worker, service,
                                                                      settings, monkeypatch):
    find_rooms(monkeypatch)
    book_room(monkeypatch)
    idle_worker.worker.start()
    run = booking_run(people)
    idle_worker.drain()
    idle_worker.worker.stop()  # the rest of the run is another process's
    run.refresh_from_db()
    decide_interrupt(interrupt=run.interrupts.get(), user=people["approver"], decision="approved")

    code = ("import django; django.setup(); from runs.engine.actors import advance_run; "
            "from runs.engine.runtime import engine; "
            f"advance_run({run.pk}); engine().wait_idle(60)")
    other = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "DATABASE_URL": database_url_for_subprocess(),
                                             "REDIS_URL": "", "DJANGO_SETTINGS_MODULE": "config.settings",
                                             **book_room_env(settings, approval="always"),  # its HTTP tool
                                             "OTEL_TRACES_EXPORTER": "console"})  # the SDK's own exporter: stdout
    assert other.returncode == 0, other.stderr
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED

    theirs, decoder, text = [], json.JSONDecoder(), other.stdout.strip()
    while text:
        span, end = decoder.raw_decode(text)
        theirs.append(span)
        text = text[end:].strip()
    ours = spans.get_finished_spans()
    trace_id, root_id = tracing.run_ids(run.pk, run.created_at)
    assert {span["context"]["trace_id"] for span in theirs} == {f"0x{s.context.trace_id:032x}" for s in ours} == {
        f"0x{trace_id:032x}"}
    # Here: the first two model calls, the rooms found, the approval; there: the booking and the last model call,
    # with the libraries' spans (traces configured from OTEL_*, as in production): the booking's request to the
    # bookings service (httpx) and, on PostgreSQL, the queries (psycopg).
    assert sorted(span.name for span in ours) == ["approval wait", "chat scripted", "chat scripted", "decision",
                                                  "execute_tool find_rooms"]
    queries = [span for span in theirs if span["attributes"].get("db.system", span["attributes"].get(
        "db.system.name")) == "postgresql"]
    requests = [span for span in theirs if "http.request.method" in span["attributes"]
                or "http.method" in span["attributes"]]
    assert sorted(span["name"] for span in theirs if span not in queries and span not in requests) == [
        "chat scripted", "execute_tool book_room"]
    (booking,) = [span for span in theirs if span["name"] == "execute_tool book_room"]
    (booking_request,) = [span for span in requests if span["name"] == "POST"]
    assert booking_request["parent_id"] == booking["context"]["span_id"]
    if connection.vendor == "postgresql":
        parents = {span["parent_id"] for span in queries}
        assert booking["context"]["span_id"] in parents  # the booking's writes (running, its outcome)
        assert f"0x{root_id:016x}" in parents  # the slice's other reads and writes, under the run
    else:
        assert not queries


def test_prompt_and_completion_text_are_recorded_only_when_turned_on_with_credentials_masked(
        spans, people, worker, settings, monkeypatch):
    key = "sk-test-" + "k" * 40
    monkeypatch.setenv("EXAMPLE_PROVIDER_API_KEY", key)
    settings.TOLLGATE = {**settings.TOLLGATE, "TRACE_CONTENT": True}
    run = start_run(agent=asking_agent(), user=people["requester"], input=f"send please, my key is {key}")
    worker.drain()

    first = next(span for span in spans.get_finished_spans() if span.name.startswith("chat"))
    sent = json.loads(first.attributes["gen_ai.input.messages"])
    assert any("send please, my key is ***" in str(message.get("content")) for message in sent)
    assert key not in first.attributes["gen_ai.input.messages"]
    assert first.attributes["gen_ai.system_instructions"] == json.dumps(run.agent.instructions, ensure_ascii=False)
    answered, = json.loads(first.attributes["gen_ai.output.messages"])
    assert answered["role"] == "assistant" and answered["tool_calls"][0]["name"] == "fake_lookup"


def test_a_runs_log_lines_carry_its_trace_id_while_traces_are_recorded(spans, people, worker):
    from runs.base.log_context import RunContextFilter

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            if getattr(record, "run_id", None) is not None:
                seen.append((record.run_id, record.trace_id, record.run_context))

    handler = Keep(level=logging.DEBUG)
    handler.addFilter(RunContextFilter())
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        run = _approved_transfer(people, worker)
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)

    trace_id = f"{tracing.run_ids(run.pk, run.created_at)[0]:032x}"
    assert seen and {line[:2] for line in seen} == {(run.pk, trace_id)}
    assert {f"0x{span.context.trace_id:032x}" for span in spans.get_finished_spans()} == {f"0x{trace_id}"}
    assert all(f"trace {trace_id}" in line[2] for line in seen)


def _waits(exporter) -> dict[int, list]:
    """``{run id: [(reason, status it went on in, start ns, end ns)]}`` of the ``<reason> wait`` spans."""
    found = {}
    for span in exporter.get_finished_spans():
        if span.name.endswith(" wait") and span.name != "approval wait":
            found.setdefault(span.attributes["tollgate.run.id"], []).append(
                (span.attributes["tollgate.wait.reason"], span.attributes["tollgate.run.status"], span.start_time,
                 span.end_time))
            assert span.name == f"{span.attributes['tollgate.wait.reason']} wait"
            run = Run.objects.get(pk=span.attributes["tollgate.run.id"])
            assert (span.context.trace_id, span.parent.span_id) == tracing.run_ids(run.pk, run.created_at)
    return found


def _went_to_wait_ns(run_id: int) -> int:
    moment = Run.objects.get(pk=run_id).events.filter(type="transition", to_status="waiting").get().created_at
    return int(moment.timestamp() * 1e9)


def test_every_other_wait_of_a_run_is_a_span_from_its_start_to_its_end(spans, people, worker, api, flaky_lookup,
                                                                       wire_transfer, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "INLINE_BACKOFF_MAX_S": 0.0}
    admin, requester = api(people["admin"]), api(people["requester"])
    naps = waiting_agent(admin, "naps", {"name": "wait_until", "arguments": {"seconds": 3600}})
    asks = waiting_agent(admin, "asks", {"name": "ask_user", "arguments": {"question": "A or B?",
                                                                           "options": ["A", "B"]}})
    listens = waiting_agent(admin, "listens", {"name": "wait_for_event", "arguments": {
        "event_type": "payment.settled", "correlation_key": "K-1", "timeout_s": 7200}})
    retries = waiting_agent(admin, "retries", {"name": "stock_lookup", "arguments": {"sku": "A-1"}})
    flaky_lookup[0] = 1  # fails once: a backoff the sweeper ends
    wires = waiting_agent(admin, "wires", {"name": "wire_transfer", "arguments": {"amount": 10}})  # unknown outcome
    napping, asking, listening, retrying, wiring = (start_run_by_api(requester, slug, "go")["id"]
                                                    for slug in (naps, asks, listens, retries, wires))
    cancelled = start_run_by_api(requester, asks, "go")["id"]
    worker.drain()
    assert _waits(spans) == {}  # nothing ended yet
    went_to_wait = {run_id: _went_to_wait_ns(run_id)
                    for run_id in (napping, asking, listening, retrying, wiring, cancelled)}

    item = next(i for i in pending_interrupts(requester, asking) if i["kind"] == "input")
    assert requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": "B"}, format="json").status_code == 200
    assert requester.post("/api/events/", {"type": "payment.settled", "key": "K-1", "payload": {}},
                          format="json").status_code == 201
    assert requester.post(f"/api/runs/{cancelled}/cancel/", format="json").status_code in (200, 202)
    (unknown,) = pending_interrupts(api(people["approver"]), wiring)
    assert api(people["approver"]).post(f"/api/interrupts/{unknown['id']}/reconcile/", {
        "succeeded": False, "evidence": "bank: no such transfer"}, format="json").status_code == 200
    worker.drain()  # before the sweeper looks an hour ahead: a lease held then would look expired to it
    assert sweep_later(3601)["woken"] == 2  # the nap and the backoff
    worker.drain()

    waits = _waits(spans)
    assert {run_id: [(reason, then) for reason, then, _, _ in found] for run_id, found in waits.items()} == {
        napping: [("scheduled", "running")], asking: [("input", "running")],
        listening: [("external_event", "running")], retrying: [("retry_backoff", "running")],
        wiring: [("reconciliation", "running")], cancelled: [("input", "cancelled")]}
    for run_id, [(_, _, start, end)] in waits.items():
        assert start == went_to_wait[run_id] < end
    assert set(Run.objects.filter(pk__in=[napping, asking, listening, retrying, wiring]).values_list(
        "status", flat=True)) == {RunStatus.COMPLETED}


def test_a_run_started_later_has_a_scheduled_wait_from_its_creation(spans, people, idle_worker):
    later = timezone.now() + timedelta(hours=1)
    run = start_run(agent=refused_agent(), user=people["requester"], input="x", start_at=later)
    assert start_scheduled_runs(now=later + timedelta(seconds=1)) == {"started": 1}
    (wait,) = [span for span in spans.get_finished_spans() if span.name == "scheduled wait"]
    assert (wait.start_time, wait.end_time) == (int(run.created_at.timestamp() * 1e9),
                                                int((later + timedelta(seconds=1)).timestamp() * 1e9))
    assert (wait.attributes["tollgate.run.status"], wait.context.trace_id) == (
        "queued", tracing.run_ids(run.pk, run.created_at)[0])
