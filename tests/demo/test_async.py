"""The demo tools that wait on the payment gateway are async handlers, over the gateway's async client."""

import asyncio
import dataclasses
import inspect
import threading
import time
from decimal import Decimal

import pytest

from runs.base import tracing
from runs.base.awaiting import abandoned_threads
from runs.engine.lifecycle import start_run
from runs.models import RunStatus, WaitingReason
from tests.demo.support import refund_turns
from tests.engine.test_ops_traces import _attribute, _http_client_spans, instrumented  # noqa: F401  (a fixture)
from tests.support.durability import make_agent
from tools import registry
from tools.demo import conf, gateway
from tools.models import ToolCall, ToolCallStatus


@pytest.mark.parametrize("name", ["query_order", "refund", "find_refundable_order"])
def test_the_handlers_that_wait_on_the_gateway_are_coroutine_functions(name):
    assert inspect.iscoroutinefunction(registry.get_tool(name).handler)


def test_the_refunds_precondition_waits_on_the_gateway_as_a_coroutine_too():
    assert inspect.iscoroutinefunction(registry.get_tool("refund").precondition)


def test_a_gateway_that_does_not_answer_within_the_refunds_timeout_leaves_it_unknown(
        demo, worker, payment_gateway, monkeypatch):
    # No reconcile hook: the unknown call stays unknown, for a person to settle.
    monkeypatch.setitem(registry._TOOLS, "refund", dataclasses.replace(registry.get_tool("refund"), timeout_s=0.5,
                                                                       reconcile=None))
    payment_gateway.faults(script=["error_before_commit"], latency_s=3.0)  # a 503, nothing charged, 3 s late
    agent = make_agent("refund-30", refund_turns(30), tools=["query_order", "refund"], check="refund")
    run = start_run(agent=agent, user=demo["requester"], input="refund order 123")

    worker.drain()

    run.refresh_from_db()
    call = ToolCall.objects.get(run=run, name="refund")
    assert (call.status, call.attempts) == (ToolCallStatus.UNKNOWN, 1)
    assert "ToolTimeout" in call.error
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
    assert abandoned_threads() == 0, "the async handler was cancelled, not left running in a thread"
    assert payment_gateway.ledger()["refunds"] == []


def test_two_event_loops_in_turn_each_get_a_working_async_session(payment_gateway):
    async def refund_then_total(key: str) -> tuple[Decimal, object, int]:
        """Refund 5.00 on order 7 under ``key``; (its refunded total, the client used, clients of closed loops)."""
        await gateway.arefund(order_number=7, amount=Decimal("5.00"), idempotency_key=key, timeout_s=5)
        total = await gateway.arefunded_total(7)
        stale = sum(1 for loop, _url in gateway._async_sessions if loop.is_closed())
        return total, gateway._async_session(conf.gateway_url()), stale

    first_total, first_client, _ = asyncio.run(refund_then_total("first-loop"))
    second_total, second_client, stale = asyncio.run(refund_then_total("second-loop"))  # the first loop is closed

    assert (first_total, second_total) == (Decimal("5.00"), Decimal("10.00"))
    assert first_client is not second_client
    assert stale == 0, "the closed loop's session is dropped when the next loop makes its own"


def test_the_async_side_maps_the_gateways_answers_and_failures_as_the_sync_side_does(payment_gateway, settings):
    async def refund(key: str) -> dict:
        return await gateway.arefund(order_number=7, amount=Decimal("5.00"), idempotency_key=key, timeout_s=5)

    first = asyncio.run(refund("mapped"))
    again = asyncio.run(refund("mapped"))  # the same key: the first refund, not a second one
    assert again == first and first["amount"] == "5.00"
    assert asyncio.run(gateway.arefunded_total(7)) == Decimal("5.00")
    assert [r["amount"] for r in gateway.ledger()["refunds"]] == ["5.00"]  # the sync side reads the same ledger

    payment_gateway.faults(script=["error_before_commit"])
    with pytest.raises(registry.ToolUnavailable, match="error 503"):
        asyncio.run(refund("after-503"))
    assert asyncio.run(refund("after-503"))["amount"] == "5.00"  # nothing was charged: the resend pays once

    settings.GATEWAY_URL = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(registry.ToolUnavailable, match="unreachable"):
        asyncio.run(refund("refused"))
    with pytest.raises(registry.ToolUnavailable, match="unreachable"):
        gateway.lookup("refused")  # the sync side maps a refused connection the same way


def test_a_connection_dropped_after_the_gateway_charged_is_not_a_refusal(payment_gateway):
    # The gateway dies after committing: the answer never comes. The handler raises ToolUnavailable, never a
    # result or a refusal (a sent side effect that raised goes to reconciliation: tests/demo/test_reconcile.py).
    payment_gateway.faults(script=["crash_after_commit"])

    async def refund() -> dict:
        return await gateway.arefund(order_number=7, amount=Decimal("5.00"), idempotency_key="dropped", timeout_s=5)

    with pytest.raises(registry.ToolUnavailable, match="unreachable"):
        asyncio.run(refund())
    payment_gateway.process.wait(timeout=10)
    payment_gateway.ensure_running()
    assert [r["idempotency_key"] for r in payment_gateway.ledger()["refunds"]] == ["dropped"]


def test_a_refund_in_flight_gets_its_answer_when_many_other_loops_ask_the_gateway(payment_gateway):
    # A process with the engine's loop (a refund waiting on the gateway) and many open loops that ask it
    # meanwhile (``drive``'s loop of each request thread checking an approver's
    # edit with the refund's async precondition, in ``serve``'s embedded shape): the refund already sent still
    # gets the gateway's answer, not an error of its own client's making (ToolUnavailable: a retry, or unknown).
    payment_gateway.faults(latency_s=1.5)  # POST /refunds answers after 1.5 s
    outcome = {}

    def engine_loop():
        try:
            outcome["refund"] = asyncio.run(gateway.arefund(order_number=7, amount=Decimal("5.00"),
                                                            idempotency_key="in-flight", timeout_s=10))
        except Exception as exc:  # noqa: BLE001 - reported below
            outcome["refund"] = exc

    engine = threading.Thread(target=engine_loop)
    engine.start()
    deadline = time.monotonic() + 5
    while "in-flight" not in payment_gateway.ledger()["requests_per_key"]:  # the POST reached the gateway
        assert time.monotonic() < deadline
        time.sleep(0.02)
    loops = [asyncio.new_event_loop() for _ in range(12)]
    try:
        for other in loops:  # each stays open after its call, as a request thread's ``drive`` loop does
            assert other.run_until_complete(gateway.arefunded_total(8)) == Decimal("0")
        engine.join(10)
    finally:
        for other in loops:
            other.close()
    assert not isinstance(outcome["refund"], Exception), f"the refund in flight failed: {outcome['refund']!r}"
    assert outcome["refund"]["idempotency_key"] == "in-flight"


def test_a_refund_runs_requests_to_the_gateway_are_spans_in_its_trace(demo, worker, payment_gateway, instrumented):
    # docs/operating.md, "Traces": a span per request of a tool (HTTP tools, the demo's gateway, ...), in the
    # run's trace under the tool's span, as the sync side's requests (the reconcile hook's lookup) still are.
    gateway._drop_all()  # aiohttp's instrumentation covers the sessions made once it is on
    agent = make_agent("refund-traced", refund_turns(30), tools=["query_order", "refund"], check="refund")
    run = start_run(agent=agent, user=demo["requester"], input="refund order 123")
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert [r["idempotency_key"] for r in payment_gateway.ledger()["refunds"]] != []

    finished = instrumented.get_finished_spans()
    trace_id, _root = tracing.run_ids(run.pk, run.created_at)
    tools = {span.attributes["gen_ai.tool.name"]: span for span in finished if span.name.startswith("execute_tool")}
    to_gateway = [span for span in _http_client_spans(finished)
                  if _attribute(span, "url.full", "http.url").startswith(payment_gateway.url)]
    refunds = [span for span in to_gateway if _attribute(span, "url.full", "http.url").endswith("/refunds")
               and _attribute(span, "http.request.method", "http.method") == "POST"]
    assert len(refunds) == 1, f"the refund's POST is not traced (gateway spans: {[s.name for s in to_gateway]})"
    assert refunds[0].context.trace_id == trace_id
    assert refunds[0].parent.span_id == tools["refund"].context.span_id


def test_an_idle_loops_session_is_kept_with_its_connections_whatever_other_threads_do(payment_gateway):
    # ``gateway._async_session``: a session is kept as long as its loop is open, so a thread's ``drive`` loop
    # between two calls keeps its pooled connections (none closed under it by another thread making sessions),
    # and its next call reuses them; the session is dropped once its loop is closed.
    idle = asyncio.new_event_loop()
    others = []
    try:
        assert idle.run_until_complete(gateway.arefunded_total(8)) == Decimal("0")
        session = gateway._async_sessions[(idle, conf.gateway_url())]
        sockets = [proto.transport.get_extra_info("socket")
                   for conns in session.connector._conns.values() for proto, _ in conns]
        assert sockets, "the request's connection is kept alive in the session's pool"

        def more_loops():  # each stays open after its call, as a request thread's ``drive`` loop does
            for _ in range(12):
                others.append(asyncio.new_event_loop())
                assert others[-1].run_until_complete(gateway.arefunded_total(8)) == Decimal("0")

        thread = threading.Thread(target=more_loops)
        thread.start()
        thread.join(10)
        assert gateway._async_sessions[(idle, conf.gateway_url())] is session and not session.closed
        assert all(s.fileno() != -1 for s in sockets), "the idle loop's connections stay open for its next call"
        assert idle.run_until_complete(gateway.arefunded_total(8)) == Decimal("0")
    finally:
        for loop in [idle, *others]:
            loop.close()
    assert asyncio.run(gateway.arefunded_total(8)) == Decimal("0")  # a new loop's session: the closed ones go
    assert not [key for key in gateway._async_sessions if key[0] is idle or key[0] in others]
    assert session.closed
