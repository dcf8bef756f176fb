"""Traces (issue 25): one approved refund run gives one trace, with model-call spans carrying the GenAI attributes and
token counts, tool spans and the approval wait; nothing is recorded unless a tracer provider is installed.

The SDK's in-memory exporter stands in for a collector. The worker runs
in this process; the trace id is derived from the run's row alone
(``runs.tracing.run_ids``), which is what puts another process's spans in
the same trace.
"""

import json
import logging
import os
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from approvals.services import decide_interrupt
from runs import tracing
from runs.engine.lifecycle import start_run
from runs.models import Agent, RunStatus
from tests.conftest import database_url_for_subprocess

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


def _approved_refund(demo, worker):
    run = start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"], input="refund please")
    worker.drain()
    run.refresh_from_db()
    decide_interrupt(interrupt=run.interrupts.get(), user=demo["approver"], decision="approved")
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    return run


def test_an_approved_refund_run_is_one_trace_of_model_calls_tool_calls_and_the_approval_wait(spans, demo, worker):
    run = _approved_refund(demo, worker)
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
    refund = run.tool_calls.get(name="refund")
    assert set(tools) == set(run.tool_calls.values_list("name", flat=True))
    assert dict(tools["refund"].attributes).items() >= {
        "gen_ai.tool.call.id": refund.provider_call_id, "tollgate.tool_call.id": refund.pk,
        "tollgate.tool.side_effect": True, "tollgate.tool.attempts": 1, "tollgate.tool.outcome": "succeeded"}.items()

    (wait,), (decision,) = by_name["approval"], by_name["decision"]
    item = run.interrupts.get()
    assert (wait.start_time, wait.end_time) == (int(item.created_at.timestamp() * 1e9),
                                                int(item.resolved_at.timestamp() * 1e9))
    assert decision.parent.span_id == wait.context.span_id and decision.attributes["tollgate.decision"] == "approved"
    assert wait.start_time < tools["refund"].start_time  # the refund ran once approved

    texts = " ".join(str(value) for span in finished for value in span.attributes.values())
    assert "refund please" not in texts and "order_id" not in texts  # no prompt, arguments or results


def test_nothing_is_recorded_without_a_tracer_provider(demo, worker):
    assert not tracing.recording()
    assert not tracing.configure_from_environment()  # no OTEL_* variable in the tests' environment
    _approved_refund(demo, worker)  # runs as before, and no span is made
    assert not tracing.recording()


def test_a_worker_in_another_process_puts_its_spans_in_the_same_trace(spans, demo, idle_worker, payment_gateway,
                                                                      settings):
    idle_worker.worker.start()
    run = start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"], input="refund please")
    idle_worker.drain()
    idle_worker.worker.stop()  # the rest of the run is another process's
    run.refresh_from_db()
    decide_interrupt(interrupt=run.interrupts.get(), user=demo["approver"], decision="approved")

    code = ("import django; django.setup(); from runs.engine.actors import advance_run; "
            "from runs.engine.runtime import engine; "
            f"advance_run({run.pk}); engine().wait_idle(60)")
    other = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "DATABASE_URL": database_url_for_subprocess(),
                                             "GATEWAY_URL": payment_gateway.url, "REDIS_URL": "",
                                             "DJANGO_SETTINGS_MODULE": "config.settings",
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
    trace_id = f"0x{tracing.run_ids(run.pk, run.created_at)[0]:032x}"
    assert {span["context"]["trace_id"] for span in theirs} == {f"0x{s.context.trace_id:032x}" for s in ours} == {
        trace_id}
    # Here: the first two model calls, the order lookup, the approval; there: the refund and the last model call.
    assert sorted(span.name for span in ours) == ["approval wait", "chat scripted", "chat scripted", "decision",
                                                  "execute_tool query_order"]
    assert sorted(span["name"] for span in theirs) == ["chat scripted", "execute_tool refund"]


def test_prompt_and_completion_text_are_recorded_only_when_turned_on_with_credentials_masked(
        spans, demo, worker, settings, monkeypatch):
    key = "sk-test-" + "k" * 40
    monkeypatch.setenv("EXAMPLE_PROVIDER_API_KEY", key)
    settings.TOLLGATE = {**settings.TOLLGATE, "TRACE_CONTENT": True}
    run = start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"],
                    input=f"refund please, my key is {key}")
    worker.drain()

    first = next(span for span in spans.get_finished_spans() if span.name.startswith("chat"))
    sent = json.loads(first.attributes["gen_ai.input.messages"])
    assert any("refund please, my key is ***" in str(message.get("content")) for message in sent)
    assert key not in first.attributes["gen_ai.input.messages"]
    assert first.attributes["gen_ai.system_instructions"] == json.dumps(run.agent.instructions, ensure_ascii=False)
    answered, = json.loads(first.attributes["gen_ai.output.messages"])
    assert answered["role"] == "assistant" and answered["tool_calls"][0]["name"] == "query_order"


def test_a_runs_log_lines_carry_its_trace_id_while_traces_are_recorded(spans, demo, worker):
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
        run = _approved_refund(demo, worker)
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)

    trace_id = f"{tracing.run_ids(run.pk, run.created_at)[0]:032x}"
    assert seen and {line[:2] for line in seen} == {(run.pk, trace_id)}
    assert {f"0x{span.context.trace_id:032x}" for span in spans.get_finished_spans()} == {f"0x{trace_id}"}
    assert all(f"trace {trace_id}" in line[2] for line in seen)
