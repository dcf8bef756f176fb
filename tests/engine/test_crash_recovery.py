"""kill -9 of a worker in each phase: after the sweeper, the run ends as the rules say.

Each test advances a run in a separate worker process that SIGKILLs itself
at a failpoint (or is killed from outside), lets its lease expire, runs the
sweeper, and lets a fresh worker finish the run. The payment gateway is a
real separate process; its ledger shows whether anything happened twice.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from approvals.services import decide_interrupt, reconcile_interrupt
from runs.models import DeathBlame, Run, RunStatus, Step, WaitingReason
from runs.engine.recovery import BLAME_MARGIN
from runs.sweeping import sweep
from runs.engine.lifecycle import start_run
from tests.support.core import asking_agent
from tests.support.durability import make_agent, refund_turns, wait_for_lease_expiry
from tools.models import ToolCall, ToolCallStatus

KILLED = -9


def _start(demo, agent):
    return start_run(agent=agent, user=demo["requester"], input="please refund order 123")


def _recover(run, worker):
    wait_for_lease_expiry(run.pk)
    assert sweep()["reenqueued"] >= 1
    worker.drain()
    run.refresh_from_db()
    return run


def _charges(gateway, order_id=123):
    return [r for r in gateway.ledger()["refunds"] if r["order_id"] == order_id]


@pytest.mark.parametrize(
    "point", ["model_call_started", "tool_call_ready:refund", "tool_call_started:refund", "tool_call_returned:refund",
              "model_call_returned:stop"]
)
def test_refund_killed_at_each_failpoint_completes_with_one_charge(
    point, demo, idle_worker, worker_process, payment_gateway
):
    agent = make_agent("refund-30", refund_turns(30), tools=["query_order", "refund"], check="refund")
    run = _start(demo, agent)
    assert worker_process(run.pk, failpoint=point) == KILLED
    idle_worker.worker.start()
    run = _recover(run, idle_worker)

    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    charges = _charges(payment_gateway)
    assert len(charges) == 1
    refund_call = ToolCall.objects.get(run=run, name="refund")
    assert charges[0]["idempotency_key"] == refund_call.idempotency_key
    assert refund_call.status == ToolCallStatus.SUCCEEDED
    if point == "model_call_returned:stop":  # the stored final answer is judged, not asked for again
        assert run.steps.count() == 3 and run.model_calls == 3
    if point == "model_call_started":
        assert run.steps.filter(status=Step.Status.DISCARDED).count() == 1
        assert run.events.filter(type="model_call", reason__startswith="discarded").exists()
    if point in ("tool_call_started:refund", "tool_call_returned:refund"):
        assert run.events.filter(type="tool_call", reason="retrying after a worker crash").exists()
    if point == "tool_call_started:refund":  # never reached the gateway: looked up, not found, checked, sent
        assert refund_call.attempts == 2
    if point == "tool_call_returned:refund":  # paid before the kill: found by its key, not sent again
        assert refund_call.attempts == 1
        assert payment_gateway.ledger()["requests_per_key"][refund_call.idempotency_key] == 1
        assert run.events.filter(type="tool_call", reason="found at the external system before sending again",
                                 to_status="succeeded").exists()


def test_worker_killed_while_the_gateway_is_charging_ends_with_one_charge(
    demo, idle_worker, worker_process, payment_gateway
):
    """kill -9 from outside while the refund request is in flight (the gateway is slow)."""
    payment_gateway.faults(latency_s=1.0)
    agent = make_agent("refund-30", refund_turns(30), tools=["query_order", "refund"], check="refund")
    run = _start(demo, agent)

    def refund_in_flight():
        return ToolCall.objects.filter(run=run, name="refund", status=ToolCallStatus.RUNNING).exists()

    assert worker_process(run.pk, kill_when=refund_in_flight) == KILLED
    idle_worker.worker.start()
    run = _recover(run, idle_worker)

    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    refund_call = ToolCall.objects.get(run=run, name="refund")
    assert [c["idempotency_key"] for c in _charges(payment_gateway)] == [refund_call.idempotency_key]


def _email_agent():
    text = "Contract attached."
    return make_agent("email-default", [
        {"tool_calls": [{"name": "legal_check", "arguments": {"text": text}}]},
        {"tool_calls": [{"name": "send_email", "arguments": {"to": "c@example.com", "subject": "Contract",
                                                               "body": text}}]},
        {"content": "Sent."},
    ], tools=["legal_check", "send_email"], check="send_email")


@pytest.mark.parametrize("point", ["tool_call_started:send_email", "tool_call_returned:send_email"])
def test_side_effect_without_hook_killed_mid_call_goes_to_a_person(point, demo, idle_worker, worker_process):
    run = _start(demo, _email_agent())
    assert worker_process(run.pk) == 0
    run.refresh_from_db()
    assert run.waiting_reason == WaitingReason.APPROVAL
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=demo["approver"], decision="approved")

    assert worker_process(run.pk, failpoint=point) == KILLED
    idle_worker.worker.start()
    run = _recover(run, idle_worker)

    send_call = ToolCall.objects.get(run=run, name="send_email")
    assert send_call.status == ToolCallStatus.UNKNOWN
    assert send_call.attempts == 1  # never sent again blindly
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION, status=InterruptStatus.PENDING)

    reconcile_interrupt(interrupt=item, user=demo["approver"], succeeded=True,
                        result={"sent_to": "c@example.com"}, evidence="mail server log shows delivery at 10:02")
    idle_worker.drain()
    run.refresh_from_db()
    send_call.refresh_from_db()
    assert send_call.status == ToolCallStatus.SUCCEEDED
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    resolved = run.events.get(type="interrupt", to_status=InterruptStatus.RESOLVED, payload__kind="reconciliation")
    assert resolved.actor == "user:approver"
    assert "mail server log" in resolved.payload["comment"]


def test_waiting_run_keeps_waiting_through_a_sweep(people, worker):
    run = start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme.")
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    counts = sweep()
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.APPROVAL)
    assert set(counts.values()) == {0}, counts  # no job of the pass did anything


def _neighbour_blamed_for(run, neighbour):
    """``neighbour`` died in ``run``'s worker too, its step started ``BLAME_MARGIN`` after ``run``'s refund: the
    sweeper will blame the neighbour and count ``run`` a bystander."""
    owner = Run.objects.values_list("lease_owner", flat=True).get(pk=run.pk)
    call_started = ToolCall.objects.values_list("started_at", flat=True).get(run=run, name="refund")
    Run.objects.filter(pk=neighbour.pk).update(status=RunStatus.RUNNING, lease_owner=owner,
                                               lease_expires_at=timezone.now() - timedelta(seconds=1))
    step = Step.objects.create(run=neighbour, index=neighbour.steps.count())
    Step.objects.filter(pk=step.pk).update(started_at=call_started + BLAME_MARGIN)


def test_sends_a_bystander_lost_to_a_neighbours_crashes_leave_its_retries_whole(
    demo, idle_worker, worker_process, payment_gateway
):
    # The chaos run's flake: twice a refund had just started (running, not yet sent) in a worker that a
    # neighbour's step killed; as a bystander it was sent again each time, but those two cut-off sends
    # still counted against max_attempts (3), so the gateway's first answer, a 503 that is retried
    # otherwise, left it unknown; the gateway had no trace, a person settled it failed, the run failed.
    agent = make_agent("refund-30", refund_turns(30), tools=["query_order", "refund"], check="refund")
    run = _start(demo, agent)
    neighbour = _start(demo, make_agent("neighbour", [{"content": "Done."}], tools=[]))
    for attempt in (1, 2):  # worker_process: the real actor in a process that SIGKILLs itself at the failpoint
        assert worker_process(run.pk, failpoint="tool_call_started:refund") == KILLED
        _neighbour_blamed_for(run, neighbour)
        wait_for_lease_expiry(run.pk)
        sweep()
        assert Run.objects.values_list("death_blame", flat=True).get(pk=run.pk) == DeathBlame.BYSTANDER
    assert payment_gateway.ledger()["requests_per_key"] == {}  # neither send left the worker

    payment_gateway.faults(script=["error_before_commit"])
    idle_worker.worker.start()
    idle_worker.drain()
    run.refresh_from_db()

    call = ToolCall.objects.get(run=run, name="refund")
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert (call.status, call.attempts) == (ToolCallStatus.SUCCEEDED, 4)
    assert [e.payload["blamed"] for e in run.events.filter(type="recovery")] == [False, False]
    assert [r["idempotency_key"] for r in _charges(payment_gateway)] == [call.idempotency_key]
    assert payment_gateway.ledger()["requests_per_key"] == {call.idempotency_key: 2}


def _refund_whose_earlier_send_lands_late(monkeypatch, gateway, order_id: int, amount: str, hidden_lookups: int):
    """Replace the refund tool's ``reconcile`` hook: the first time it is asked, the refund's earlier send
    (still on its way when its worker died) lands at the gateway just after the lookup; the first
    ``hidden_lookups`` lookups answer ``not_found`` (the gateway's view lagging behind)."""
    import dataclasses

    import httpx

    from tools import registry
    from tools.registry import Reconciliation

    real = registry.get_tool("refund")
    asked = []

    def late(key):
        asked.append(key)
        found = real.reconcile(key) if len(asked) > hidden_lookups else Reconciliation("not_found")
        if len(asked) == 1:
            httpx.post(f"{gateway.url}/refunds", json={"order_id": order_id, "amount": amount},
                       headers={"Idempotency-Key": key}, timeout=5).raise_for_status()
        return found

    monkeypatch.setitem(registry._TOOLS, "refund", dataclasses.replace(real, reconcile=late))
    return asked


def _refund_of_most_of_a_small_order(demo, order_id: int):
    from tools.demo.models import Order

    Order.objects.create(number=order_id, owner=demo["requester"], total=40)
    turns = refund_turns(30)
    for turn in turns[:2]:
        turn["tool_calls"][0]["arguments"]["order_id"] = order_id
    agent = make_agent(f"refund-{order_id}", turns, tools=["query_order", "refund"], check="refund")
    return start_run(agent=agent, user=demo["requester"], input=f"refund order {order_id}")


def test_an_earlier_send_landing_after_the_lookup_is_found_not_denied_by_its_own_refund(
    demo, idle_worker, worker_process, payment_gateway, monkeypatch
):
    """The worker dies with the refund (30 of 40) sent; the next worker looks its key up (not there yet),
    then the earlier send lands, so the precondition sees the call's own refund and says no room is left.
    The gateway paid it: the call ends ``succeeded`` (looked up again), never ``denied``; one charge."""
    run = _refund_of_most_of_a_small_order(demo, 700)
    assert worker_process(run.pk, failpoint="tool_call_started:refund") == KILLED
    asked = _refund_whose_earlier_send_lands_late(monkeypatch, payment_gateway, 700, "30.00", hidden_lookups=1)
    idle_worker.worker.start()
    run = _recover(run, idle_worker)

    call = ToolCall.objects.get(run=run, name="refund")
    assert len(asked) == 2
    assert (call.status, run.status, run.outcome) == (ToolCallStatus.SUCCEEDED, RunStatus.COMPLETED, "achieved")
    assert [c["idempotency_key"] for c in _charges(payment_gateway, 700)] == [call.idempotency_key]
    assert not run.events.filter(type="tool_call", to_status="denied").exists()


def test_an_earlier_send_the_lookup_cannot_see_is_unknown_when_its_precondition_says_no(
    demo, idle_worker, worker_process, payment_gateway, monkeypatch
):
    """Same, but the gateway's lookups never show the landed refund: the precondition's "no" may be the
    call's own refund, so the call is ``unknown``, and after ``RECONCILE_MAX_TRIES`` looks a person
    reconciles it; never ``denied``, never sent again."""
    run = _refund_of_most_of_a_small_order(demo, 701)
    assert worker_process(run.pk, failpoint="tool_call_started:refund") == KILLED
    _refund_whose_earlier_send_lands_late(monkeypatch, payment_gateway, 701, "30.00", hidden_lookups=10**6)
    idle_worker.worker.start()
    run = _recover(run, idle_worker)

    call = ToolCall.objects.get(run=run, name="refund")
    assert call.status == ToolCallStatus.UNKNOWN
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
    assert Interrupt.objects.filter(run=run, kind=InterruptKind.RECONCILIATION,
                                    status=InterruptStatus.PENDING).exists()
    assert len(_charges(payment_gateway, 701)) == 1
    assert call.attempts == 1
    assert not run.events.filter(type="tool_call", to_status="denied").exists()


def test_a_run_taken_over_from_a_dead_worker_before_the_sweeper_is_advanced_alone(demo, worker_process):
    from runs.engine import runtime

    agent = make_agent("refund-30", refund_turns(30), tools=["query_order", "refund"], check="refund")
    run = _start(demo, agent)
    assert worker_process(run.pk, failpoint="tool_call_started:refund") == KILLED
    wait_for_lease_expiry(run.pk)  # no sweep: the next message for the run finds the dead worker's lease

    engine = runtime.Engine(runs_in_flight=10, db_threads=1)
    try:
        assert engine.submit(run.pk) is not None
        assert engine.wait_idle(60)
    finally:
        engine.close_connections()

    recovery = Run.objects.get(pk=run.pk).events.get(type="recovery")
    assert recovery.payload["blamed"] and recovery.payload["crash_streak"] == 1  # its death was counted...
    assert engine.isolated == 1  # ...so it is a suspect, advanced alone
