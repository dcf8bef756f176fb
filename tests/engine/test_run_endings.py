"""Every way a run ends keeps the truth: results delivered, nothing left in flight, input and cancels honoured."""

import asyncio
import dataclasses
from decimal import Decimal
import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from runs.models import DeathBlame, Message, Run, RunStatus, WaitingReason
from runs.providers.scripted import ScriptedClient
from runs.sweeping import sweep
from runs.engine.lifecycle import cancel_run, start_run
from tests.support.core import lookup, transfer, transfer_turns
from tests.support.durability import make_agent
from tests.support.fake_tools import FAKE_TRANSFER, time_out_after_commit, transfer_requests, transfers
from tools import registry
from tools.models import ToolCall, ToolCallStatus
from tools.registry import Reconciliation, Tool

S = ToolCallStatus


def charges(account):
    """The transfers ``fake_transfer`` made to ``account``."""
    return [t for t in transfers() if t["account"] == account]


def tool_message(call: ToolCall) -> dict:
    return json.loads(Message.objects.get(role="tool", tool_call_id=call.provider_call_id).content)


def end_by_cancel(run):
    cancel_run(run=run, actor="user:requester")


def end_by_expiry(run):
    Interrupt.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep()["expired"] == 1


@pytest.mark.parametrize("end", [end_by_cancel, end_by_expiry], ids=["cancel", "approval expiry"])
def test_a_transfer_done_before_the_run_ended_is_known_to_the_next_run_and_not_done_twice(people, worker, end):
    # One turn: transfer 5 to acct-123 (no approval) and 60 to acct-109 (approval).
    agent = make_agent("e-and-f", [
        {"tool_calls": [transfer("acct-123", 5), transfer("acct-109", 60)]},
        {"tool_calls": [transfer("acct-123", 5)]},  # the follow-up run's model sends to acct-123 again
        {"content": "Done."},
    ], tools=["fake_lookup", "fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="Send 5 to acct-123 and 60 to acct-109.")
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.APPROVAL)
    e_call, f_call = ToolCall.objects.filter(run=run).order_by("id")
    assert e_call.status == S.SUCCEEDED and len(charges("acct-123")) == 1

    end(run)
    run.refresh_from_db()
    assert run.is_terminal
    assert tool_message(e_call) == {"status": "succeeded", "result": e_call.result}
    f_call.refresh_from_db()
    assert tool_message(f_call)["status"] in ("cancelled", "expired")
    ending = run.events.get(type="transition", to_status=run.status)
    assert ending.payload["effects"] == [{"tool_call": e_call.pk, "name": "fake_transfer", "status": "succeeded",
                                          "reused": False, "duplicate_of": None}]

    with transaction.atomic():  # the worker is woken on commit, when the run already starts at the second turn
        follow_up = start_run(agent=agent, user=people["requester"], input="Did you send to acct-123?",
                              session=run.session)
        Run.objects.filter(pk=follow_up.pk).update(model_calls=1)  # its model starts at the script's second turn
    worker.drain()
    follow_up.refresh_from_db()
    repeat = ToolCall.objects.get(run=follow_up)
    assert repeat.duplicate_of_id == e_call.pk and repeat.status == S.SUCCEEDED
    assert len(charges("acct-123")) == 1, "acct-123 got one transfer"
    assert follow_up.status == RunStatus.COMPLETED
    # Reused, everywhere: what the model was told, the outcome's reason, the effects of the ending.
    told = tool_message(repeat)
    assert told["reused"]["tool_call"] == e_call.pk and told["reused"]["run"] == run.pk
    assert "was not done again" in told["reused"]["note"] and told["result"] == e_call.result
    assert follow_up.outcome_reason == f"reused: fake_transfer #{repeat.pk} (result of #{e_call.pk})"
    ending = follow_up.events.get(type="transition", to_status=RunStatus.COMPLETED)
    assert ending.payload["effects"] == [{"tool_call": repeat.pk, "name": "fake_transfer", "status": "succeeded",
                                          "reused": True, "duplicate_of": e_call.pk}]
    settled = follow_up.events.get(type="tool_call", to_status=S.SUCCEEDED)
    assert (settled.payload["reused"], settled.payload["duplicate_of"]) == (True, e_call.pk)


@pytest.fixture
def decimal_tool():
    """A side-effecting tool that makes a transfer (``fake_transfer``'s), then returns a value JSON cannot hold."""

    def handler(ctx, args):
        FAKE_TRANSFER.handler(ctx, {"account": args["account"], "amount": 5})
        return {"charged": Decimal("5.00")}

    tool = registry.register(Tool(
        name="charge_with_decimal", description="test tool", handler=handler, side_effect=True,
        parameters={"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"]}))
    yield tool
    registry._TOOLS.pop(tool.name)


def test_an_effect_whose_result_cannot_be_stored_is_unknown_with_an_open_item_not_a_crash(people, worker,
                                                                                            decimal_tool):
    agent = make_agent("decimal", [{"tool_calls": [{"name": decimal_tool.name, "arguments": {"account": "acct-123"}}]},
                                   {"content": "Charged."}], tools=[decimal_tool.name])
    run = start_run(agent=agent, user=people["requester"], input="charge it")
    worker.drain()
    run.refresh_from_db()

    call = ToolCall.objects.get(run=run)
    assert call.status == S.UNKNOWN and "cannot be stored" in call.error
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
    assert Interrupt.objects.filter(tool_call=call, kind=InterruptKind.RECONCILIATION,
                                    status=InterruptStatus.PENDING).count() == 1
    assert len(charges("acct-123")) == 1


def test_a_run_failing_with_a_call_in_flight_leaves_it_unknown_with_an_item(people, worker, decimal_tool):
    from runs.engine.runtime import settle_failure

    agent = make_agent("in-flight", [{"content": "x"}], tools=[decimal_tool.name])
    run = start_run(agent=agent, user=people["requester"], input="x")
    worker.drain()
    run = Run.objects.create(session=run.session, agent=agent, requested_by=people["requester"], input="again")
    from runs.models import Step

    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    step = Step.objects.create(run=run, index=0)
    call = ToolCall.objects.create(run=run, step=step, index=0, provider_call_id="c1", name=decimal_tool.name,
                                   arguments={"account": "acct-123"}, side_effect=True)
    ToolCall.objects.filter(pk=call.pk).update(status=S.RUNNING, attempts=1, idempotency_key="k1")

    settle_failure(run.pk, RuntimeError("boom"))  # what the engine does after an unexpected error

    run.refresh_from_db()
    call.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "internal_error")
    assert call.status == S.UNKNOWN
    assert Interrupt.objects.filter(tool_call=call, kind=InterruptKind.RECONCILIATION,
                                    status=InterruptStatus.PENDING).exists()


def test_an_unknown_transfer_of_a_cancelled_run_is_still_looked_up_and_settled(people, worker, monkeypatch,
                                                                            settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_BACKOFF_S": 60.0}
    lookups = []
    tool = registry.get_tool("fake_transfer")

    def slow_to_answer(key):  # the bank's record is not visible at first
        lookups.append(key)
        return Reconciliation("not_found") if len(lookups) == 1 else tool.reconcile(key)

    # One attempt: a call with attempts left that the hook cannot find is sent again instead (same key).
    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(
        tool, reconcile=slow_to_answer, max_attempts=1))
    time_out_after_commit()
    agent = make_agent("unknown-then-cancel", [{"tool_calls": [transfer("acct-123", 5)]}, {"content": "ok"}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send 5")
    worker.drain()
    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert call.status == S.UNKNOWN and run.waiting_reason == WaitingReason.RECONCILIATION

    cancel_run(run=run, actor="user:requester")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert sweep()["reconciled"] == 1

    call.refresh_from_db()
    assert call.status == S.SUCCEEDED
    assert len(charges("acct-123")) == 1 and len(lookups) == 2
    effects = run.events.get(type="transition", to_status="cancelled").payload["effects"]
    assert effects == [{"tool_call": call.pk, "name": "fake_transfer", "status": "unknown", "reused": False,
                        "duplicate_of": None}]


def test_a_step_that_kills_its_worker_every_time_ends_in_a_crash_loop_within_max_attempts(
        people, idle_worker, worker_process, settings):
    from tests.support.durability import wait_for_lease_expiry

    agent = make_agent("always-crashes", transfer_turns(), tools=["fake_lookup", "fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="transfer")
    exits = []
    for _ in range(8):
        exits.append(worker_process(run.pk, failpoint="tool_call_started:fake_transfer"))
        run.refresh_from_db()
        if run.is_terminal:
            break
        wait_for_lease_expiry(run.pk)

    limit = settings.TOLLGATE["MAX_CRASHES_PER_STEP"]
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "crash_loop")
    assert exits == [-9] * limit + [0]
    transfer_call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert transfer_call.attempts <= registry.get_tool("fake_transfer").max_attempts
    assert transfer_call.status == S.UNKNOWN  # in flight when the run ended: reconciliation takes over
    assert transfer_call.reconcile_after is not None
    assert run.lost_leases == limit
    assert transfers() == [] and transfer_requests() == {}  # the bank transferred nothing, nothing reached it


def test_a_model_call_that_kills_its_worker_every_time_ends_in_a_crash_loop(people, idle_worker, worker_process,
                                                                            settings):
    from tests.support.durability import wait_for_lease_expiry

    agent = make_agent("model-crashes", transfer_turns(), tools=["fake_lookup", "fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="transfer")
    for _ in range(8):
        worker_process(run.pk, failpoint="model_call_started")
        run.refresh_from_db()
        if run.is_terminal:
            break
        wait_for_lease_expiry(run.pk)
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "crash_loop")
    assert run.steps.count() == settings.TOLLGATE["MAX_CRASHES_PER_STEP"]


def test_an_agent_without_max_model_calls_is_still_bounded(people, worker, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "DEFAULT_MAX_MODEL_CALLS": 3}
    agent = make_agent("chatty", [{"tool_calls": [lookup("a")]}] * 10, tools=["fake_lookup"])
    agent.max_turns = 100
    agent.save()
    run = start_run(agent=agent, user=people["requester"], input="loop")
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "budget_exhausted")
    assert run.steps.count() == 3 and "max_model_calls" in run.error


def during_turn(monkeypatch, turn_index: int, action):
    """Run ``action()`` once, while the model answers turn ``turn_index`` (after the request left, before the answer)."""
    original = ScriptedClient.complete
    pending = [action]

    async def complete(self, request):
        if request.turn_index == turn_index and pending:
            await asyncio.to_thread(pending.pop())  # the database is not touched from the event loop
        return await original(self, request)

    monkeypatch.setattr(ScriptedClient, "complete", complete)


def test_input_supplemented_during_the_last_model_call_becomes_the_next_run(people, worker, monkeypatch):
    agent = make_agent("late-input", [{"content": "Here is your answer."}, {"content": "And about your PS: noted."}],
                       tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="question")
    supplement = {}

    def add_input():
        supplement["run"] = start_run(agent=agent, user=people["requester"], input="PS: also look up b.",
                                      session=Run.objects.get(pk=run.pk).session, multitask_strategy="supplement")

    during_turn(monkeypatch, 0, add_input)
    worker.drain()
    run.refresh_from_db()

    assert supplement["run"].pk == run.pk  # accepted into the busy run...
    assert run.status == RunStatus.COMPLETED
    event = run.events.get(type="input", reason__startswith="supplemented input was not read")
    following = Run.objects.get(pk=event.payload["run"])  # ...and, unread, handed on as the next run
    assert following.input == "PS: also look up b."
    assert following.session_id == run.session_id and following.status == RunStatus.COMPLETED


def test_input_supplemented_into_a_waiting_run_that_is_cancelled_is_reported_unread(people, worker):
    agent = make_agent("waits", [{"tool_calls": [transfer("acme", 80)]}, {"content": "done"}], tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send 80")
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    start_run(agent=agent, user=people["requester"], input="actually 70", session=run.session,
              multitask_strategy="supplement")

    cancel_run(run=run, actor="user:requester")
    event = run.events.get(type="input", reason__contains="not read")
    unread = Message.objects.get(pk=event.payload["messages"][0])
    assert unread.content == "actually 70" and "not read" in event.reason


@pytest.mark.parametrize("how", ["cancel", "interrupt"])
def test_a_cancel_accepted_during_the_final_answer_call_wins(people, worker, monkeypatch, api, how):
    agent = make_agent("final-answer", [{"content": "All done."}, {"content": "Second run."}], tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="question")
    responses = []

    def cancel():
        client = api(people["requester"])
        if how == "cancel":
            responses.append(client.post(f"/api/runs/{run.pk}/cancel/"))
        else:
            responses.append(client.post("/api/runs/", {"agent": agent.slug, "input": "new question",
                                                        "session": run.session_id,
                                                        "multitask_strategy": "interrupt"}, format="json"))

    during_turn(monkeypatch, 0, cancel)
    worker.drain()
    run.refresh_from_db()
    assert responses[0].status_code in (200, 201)
    assert run.status == RunStatus.CANCELLED and run.outcome == ""
    assert run.events.filter(reason="cancelled before the final answer was accepted").exists()


def test_the_model_hears_the_approvers_edit_and_comment(people, worker, api):
    agent = make_agent("edited", [{"tool_calls": [transfer("acme", 60)]}, {"content": "Sent 40."}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send 60")
    worker.drain()
    item = Interrupt.objects.get(run=run)
    response = api(people["approver"]).post(f"/api/interrupts/{item.pk}/approve/", {
        "arguments": {"account": "acme", "amount": 40}, "comment": "Only 40: the rest is due next month."},
        format="json")
    assert response.status_code == 200, response.json()
    worker.drain()

    told = tool_message(ToolCall.objects.get(run=run))
    assert told["status"] == "succeeded"
    assert told["approval"] == {"comment": "Only 40: the rest is due next month.",
                                "proposed_arguments": {"account": "acme", "amount": 60},
                                "approved_arguments": {"account": "acme", "amount": 40}}


def test_a_transient_database_error_is_retried_shortly_not_after_the_sweeper_grace(people, worker, monkeypatch):
    from django.db import OperationalError

    from runs.engine import runtime

    original = runtime.advance_slice
    failures = []

    def flaky(run_id, run=None):
        if not failures:
            failures.append(run_id)
            raise OperationalError("server closed the connection unexpectedly")
        return original(run_id, run)

    monkeypatch.setattr(runtime, "advance_slice", flaky)
    agent = make_agent("db-blip", [{"content": "fine"}], tools=["fake_lookup"])
    run = start_run(agent=agent, user=people["requester"], input="hello")
    worker.drain()  # includes the delayed re-send; no sweeper runs here
    run.refresh_from_db()
    assert failures == [run.pk]
    assert run.status == RunStatus.COMPLETED


def test_a_cancel_accepted_just_before_the_run_would_wait_ends_it_instead(people, worker, monkeypatch):
    from runs.engine import loop

    real, fired = loop.deadline_passed, []

    def cancel_lands_now(run):  # between the loop's cancel check and the wait for approval
        if not fired and run.tool_calls.filter(status=S.AWAITING_APPROVAL).exists():
            fired.append(cancel_run(run=Run.objects.get(pk=run.pk), actor="user:requester"))
        return real(run)

    monkeypatch.setattr(loop, "deadline_passed", cancel_lands_now)
    agent = make_agent("cancel-race", [{"tool_calls": [transfer("acme", 60)]}, {"content": "done"}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send 60")
    worker.drain()
    run.refresh_from_db()
    assert fired and run.status == RunStatus.CANCELLED
    assert not Interrupt.objects.filter(run=run, status=InterruptStatus.PENDING).exists()


@pytest.fixture
def vanishing_tool():
    """A side-effecting tool whose calls always end ``unknown``; the test removes it from the registry."""

    def handler(ctx, args):
        raise RuntimeError("connection reset")

    tool = registry.register(Tool(name="vanishing", description="test tool", parameters={"type": "object"},
                                  handler=handler, side_effect=True,
                                  reconcile=lambda key: Reconciliation("not_found")))
    yield tool
    registry._TOOLS.pop(tool.name, None)


def test_a_run_whose_unknown_call_belongs_to_a_removed_tool_can_still_be_cancelled(people, worker, api,
                                                                                   vanishing_tool):
    agent = make_agent("vanished", [{"tool_calls": [{"name": "vanishing", "arguments": {}}]}, {"content": "x"}],
                       tools=["vanishing"])
    run = start_run(agent=agent, user=people["requester"], input="go")
    worker.drain()
    registry._TOOLS.pop("vanishing")  # removed in a deploy

    response = api(people["requester"]).post(f"/api/runs/{run.pk}/cancel/", {}, format="json")
    assert response.status_code == 200
    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert run.status == RunStatus.CANCELLED and call.status == S.UNKNOWN
    assert Interrupt.objects.filter(tool_call=call, kind=InterruptKind.RECONCILIATION,
                                    status=InterruptStatus.PENDING).exists()


def test_a_persons_item_is_closed_when_the_sweeper_settles_its_call(people, worker, monkeypatch, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 1}
    visible = []
    tool = registry.get_tool("fake_transfer")
    # One attempt: a call with attempts left that the hook cannot find is sent again instead (same key).
    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(
        tool, max_attempts=1, reconcile=lambda key: tool.reconcile(key) if visible else Reconciliation("not_found")))
    time_out_after_commit()
    agent = make_agent("item-closed", [{"tool_calls": [transfer("acct-123", 5)]}, {"content": "ok"}],
                       tools=["fake_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="send 5")
    worker.drain()
    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION)
    cancel_run(run=run, actor="user:requester")
    visible.append(True)  # the bank's record shows up

    assert sweep()["reconciled"] == 1
    item.refresh_from_db()
    assert ToolCall.objects.get(run=run).status == S.SUCCEEDED
    assert item.status == InterruptStatus.CANCELLED


def test_a_waiting_run_does_not_outlive_its_deadline(people, worker):
    agent = make_agent("deadline-wait", [{"tool_calls": [transfer("acme", 60)]}, {"content": "done"}],
                       tools=["fake_transfer"])
    agent.deadline_s = 60
    agent.save()
    run = start_run(agent=agent, user=people["requester"], input="send 60")
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING

    sweep(now=timezone.now() + timedelta(seconds=61))
    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "deadline_exceeded")
    assert ToolCall.objects.get(run=run).status == S.CANCELLED


def test_a_repeat_waiting_on_an_original_only_a_person_can_settle_looks_less_and_less_often(
        people, worker, vanishing_tool):
    agent = make_agent("waits-on-person", [{"tool_calls": [{"name": "vanishing", "arguments": {"x": 1}}]},
                                           {"content": "x"}], tools=["vanishing"])
    first = start_run(agent=agent, user=people["requester"], input="go")
    worker.drain()
    cancel_run(run=first, actor="user:requester")
    second = start_run(agent=agent, user=people["requester"], input="again", session=first.session)
    worker.drain()
    waits = []
    for _ in range(5):
        second.refresh_from_db()
        assert second.waiting_reason == WaitingReason.RECONCILIATION
        went_to_wait = second.events.filter(type="transition", to_status="waiting").latest("seq").created_at
        waits.append((second.wake_at - went_to_wait).total_seconds())
        sweep(now=second.wake_at + timedelta(seconds=1))
        worker.drain()
    assert all(later > 1.5 * earlier for earlier, later in zip(waits, waits[1:])), waits


def test_the_sweeper_blames_the_run_whose_work_started_last_in_a_dead_worker(people):
    from runs.models import Step

    agent = make_agent("dead-worker", [{"content": "x"}], tools=["fake_lookup"])
    long_ago = timezone.now() - timedelta(minutes=5)
    runs = []
    for started in (long_ago, long_ago + timedelta(seconds=30)):
        run = start_run(agent=agent, user=people["requester"], input="x", session=None)
        Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, lease_owner="worker-that-died",
                                             lease_expires_at=timezone.now() - timedelta(seconds=1))
        step = Step.objects.create(run=run, index=0)
        Step.objects.filter(pk=step.pk).update(started_at=started)
        runs.append(run)
    bystander, culprit = runs

    sweep()
    for run in runs:
        run.refresh_from_db()
    assert (culprit.crash_streak, culprit.loss_streak, culprit.lost_leases) == (1, 1, 1)
    assert (bystander.crash_streak, bystander.loss_streak, bystander.lost_leases) == (0, 1, 1)
    assert (culprit.death_blame, bystander.death_blame) == (DeathBlame.CULPRIT, DeathBlame.BYSTANDER)
