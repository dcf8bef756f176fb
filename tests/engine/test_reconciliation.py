"""Unknown outcomes are reconciled — by the tool's hook or by a person — never blindly retried."""

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from approvals.services import reconcile_interrupt
from runs.base.errors import InvalidInput
from runs.models import RunStatus, WaitingReason
from runs.sweeping import sweep
from runs.engine.lifecycle import cancel_run, start_run
from tests.support.core import CORE_TOOLS, lookup, transfer
from tests.support.durability import make_agent
from tests.support.fake_tools import FAKE_TRANSFER, time_out_after_commit, transfer_bank, transfer_keys, transfers
from tools import registry
from tools.models import ToolCall, ToolCallStatus
from tools.registry import Tool, ToolTimeout, ToolUnavailable


def _transfer_run(people):
    agent = make_agent("transfer-5", [{"tool_calls": [lookup("acme")]}, {"tool_calls": [transfer("acme", 5)]},
                                      {"content": "Sent 5."}], tools=CORE_TOOLS, check="fake_transfer")
    return start_run(agent=agent, user=people["requester"], input="send 5 to acme")


def _transfer_refused_after_the_timeout(people, worker, monkeypatch, *, reconcile):
    """Drain a transfer run (``reconcile`` as the tool's hook) whose first send the bank refuses after the
    client's timeout (nothing transferred, the client sees a timeout). Returns (run, transfer call, the bank).
    """
    bank = transfer_bank(monkeypatch, reconcile=reconcile)
    bank.script("late")
    run = _transfer_run(people)
    worker.drain()
    run.refresh_from_db()
    return run, ToolCall.objects.get(run=run, name="fake_transfer"), bank


def test_bank_timeout_after_commit_is_reconciled_to_succeeded_with_one_transfer(people, worker, monkeypatch):
    bank = transfer_bank(monkeypatch)
    time_out_after_commit(1)
    run = _transfer_run(people)
    worker.drain()
    run.refresh_from_db()

    call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert call.status == ToolCallStatus.SUCCEEDED and call.attempts == 1
    statuses = list(run.events.filter(type="tool_call", payload__tool_call=call.pk).values_list("to_status", flat=True))
    assert statuses == ["proposed", "ready", "running", "unknown", "succeeded"]
    assert run.events.filter(type="tool_call", reason="reconciled automatically").exists()
    assert transfer_keys() == [call.idempotency_key]
    assert bank.sends == {call.idempotency_key: 1}


def test_5xx_from_the_bank_is_sent_again_with_the_same_key(people, worker, monkeypatch):
    bank = transfer_bank(monkeypatch)
    bank.script("unavailable")
    run = _transfer_run(people)
    worker.drain()
    run.refresh_from_db()

    call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert (call.status, call.attempts) == (ToolCallStatus.SUCCEEDED, 2)
    assert run.events.filter(type="tool_call", reason="retrying", payload__tool_call=call.pk).count() == 1
    assert transfer_keys() == [call.idempotency_key]
    assert bank.sends == {call.idempotency_key: 2}


def test_a_503_that_comes_after_the_timeout_is_sent_again_once_the_bank_shows_no_trace(people, worker, monkeypatch):
    # The chaos run's flake: the bank refused the first send (503, nothing transferred) but its answer came
    # after the client's timeout, so the call became unknown with attempts left. The bank has no
    # trace of the key: the transfer did not happen, and the key deduplicates, so it is sent again under
    # the same key rather than left to a person who can only say "failed".
    lookups = []

    def lookup_the_bank(key):
        lookups.append(key)
        return FAKE_TRANSFER.reconcile(key)

    run, call, bank = _transfer_refused_after_the_timeout(people, worker, monkeypatch, reconcile=lookup_the_bank)
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert (call.status, call.attempts) == (ToolCallStatus.SUCCEEDED, 2)
    statuses = list(run.events.filter(type="tool_call", payload__tool_call=call.pk).values_list("to_status", flat=True))
    assert statuses == ["proposed", "ready", "running", "unknown", "ready", "running", "succeeded"]
    # Reconciliation asked once; the send asked again with the target locked, right before its precondition.
    assert lookups == [call.idempotency_key, call.idempotency_key]
    assert transfer_keys() == [call.idempotency_key]
    assert bank.sends == {call.idempotency_key: 2}
    assert not Interrupt.objects.filter(run=run, kind=InterruptKind.RECONCILIATION).exists()


def test_no_resend_when_the_hook_could_not_ask_nor_once_the_run_has_ended(people, worker, monkeypatch, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_BACKOFF_S": 60.0}
    lookups = []

    def unreachable_at_first(key):
        lookups.append(key)
        if len(lookups) == 1:
            raise ToolUnavailable("bank unreachable")
        return FAKE_TRANSFER.reconcile(key)

    run, call, bank = _transfer_refused_after_the_timeout(people, worker, monkeypatch, reconcile=unreachable_at_first)
    assert (call.status, call.attempts) == (ToolCallStatus.UNKNOWN, 1), "an unanswered lookup proves nothing"
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)

    cancel_run(run=run, actor="user:requester")
    assert sweep()["reconciled"] == 1  # the bank answers "not found" now, but the run has ended: nothing is sent

    call.refresh_from_db()
    assert (call.status, call.attempts) == (ToolCallStatus.UNKNOWN, 1)
    assert len(lookups) == 2
    assert (transfers(), bank.sends) == ([], {call.idempotency_key: 1})


def test_hook_that_keeps_finding_nothing_hands_the_call_to_a_person(people, worker, monkeypatch, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 2}
    transfer_bank(monkeypatch).always = "unavailable"
    run = _transfer_run(people)
    worker.drain()
    run.refresh_from_db()
    call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert (call.status, call.attempts) == (ToolCallStatus.UNKNOWN, registry.get_tool("fake_transfer").max_attempts)
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
    assert run.wake_at is not None  # the hook will be asked again, no process sleeping meanwhile

    assert sweep(now=run.wake_at + timedelta(seconds=1))["woken"] == 1
    worker.drain()
    run.refresh_from_db()
    call.refresh_from_db()
    assert call.status == ToolCallStatus.UNKNOWN, "no trace is not proof: nothing is guessed"
    assert (run.waiting_reason, run.wake_at) == (WaitingReason.RECONCILIATION, None)
    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION, status=InterruptStatus.PENDING)

    reconcile_interrupt(interrupt=item, user=people["approver"], succeeded=False,
                        evidence="bank statement: no transfer to acme")
    worker.drain()
    call.refresh_from_db()
    assert call.status == ToolCallStatus.FAILED
    assert "bank statement" in call.error
    assert transfers() == []


@pytest.fixture
def wire_transfer(monkeypatch):
    """A side-effecting tool with no reconcile hook whose call always times out."""

    def handler(ctx, args):
        raise ToolTimeout("bank did not answer")

    tool = Tool(name="wire_transfer", description="Send money.", handler=handler, side_effect=True,
                parameters={"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]})
    monkeypatch.setitem(registry._TOOLS, "wire_transfer", tool)
    return tool


def test_unknown_outcome_without_hook_waits_for_a_person_then_resumes(people, worker, wire_transfer):
    agent = make_agent("wire", [{"tool_calls": [{"name": "wire_transfer", "arguments": {"amount": 10}}]},
                                {"content": "Transferred."}], tools=["wire_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="pay the supplier")
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.waiting_reason, run.wake_at) == (RunStatus.WAITING, WaitingReason.RECONCILIATION, None)
    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION)
    assert item.status == InterruptStatus.PENDING
    assert sweep(now=timezone.now() + timedelta(days=30))["woken"] == 0  # no timer: a person must look

    with pytest.raises(PermissionDenied):
        reconcile_interrupt(interrupt=item, user=people["requester"], succeeded=True, evidence="trust me")
    with pytest.raises(InvalidInput):
        reconcile_interrupt(interrupt=item, user=people["approver"], succeeded=True, evidence="  ")
    reconcile_interrupt(interrupt=item, user=people["approver"], succeeded=True, result={"transfer": "T-1"},
                        evidence="bank statement, line 42")
    worker.drain()
    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.result, call.attempts) == (ToolCallStatus.SUCCEEDED, {"transfer": "T-1"}, 1)
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert run.events.filter(actor="user:approver", reason__contains="bank statement").exists()


def test_reconciling_through_the_api_is_audited_and_resumes_the_run(people, worker, wire_transfer, api):
    agent = make_agent("wire-api", [{"tool_calls": [{"name": "wire_transfer", "arguments": {"amount": 10}}]},
                                    {"content": "Transferred."}], tools=["wire_transfer"])
    run = start_run(agent=agent, user=people["requester"], input="pay the supplier")
    worker.drain()
    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION)
    url = f"/api/interrupts/{item.pk}/reconcile/"

    assert api(people["requester"]).post(url, {"succeeded": True, "evidence": "x"}, format="json").status_code == 403
    assert api(people["approver"]).post(url, {"succeeded": False}, format="json").status_code == 400
    response = api(people["approver"]).post(url, {"succeeded": False, "evidence": "bank: no such transfer"},
                                          format="json")
    assert response.status_code == 200 and response.json()["decision"] == "failed"
    again = api(people["approver"]).post(url, {"succeeded": True, "evidence": "changed my mind"}, format="json")
    assert again.status_code == 409
    worker.drain()
    assert ToolCall.objects.get(run=run).status == ToolCallStatus.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


@pytest.mark.parametrize("answer", [float("nan"), "a \ud800 b", {"deep": []},
                                    "\x00"], ids=["nan", "surrogate", "plain", "nul"])
def test_a_hook_answer_that_cannot_be_stored_settles_nothing_and_a_raising_hook_shows_only_its_type(
        people, worker, monkeypatch, settings, answer):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_BACKOFF_S": 60.0}
    time_out_after_commit(1)
    lookups = []

    def hook(key):
        lookups.append(key)
        if len(lookups) == 1:
            raise ToolUnavailable("bank at https://svc:pw-4711@bank.internal/ unreachable")
        return registry.Reconciliation("succeeded", result={"transfer_id": "t1", "note": answer})

    transfer_bank(monkeypatch, reconcile=hook)
    run = _transfer_run(people)
    worker.drain()
    call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert call.status == ToolCallStatus.UNKNOWN
    reasons = list(run.events.filter(type="reconciliation").values_list("reason", flat=True))
    assert reasons == ["The external system could not be asked (ToolUnavailable)."]  # no URL, no password

    sweep(now=timezone.now() + timedelta(seconds=120))
    worker.drain()
    call.refresh_from_db()
    assert len(lookups) == 2
    if answer == {"deep": []}:  # a storable answer settles the call
        assert call.status == ToolCallStatus.SUCCEEDED and call.result["transfer_id"] == "t1"
    else:
        assert call.status == ToolCallStatus.UNKNOWN and call.result is None
        assert run.events.filter(type="reconciliation", reason__contains="cannot be stored").exists()


def test_a_run_joined_to_an_original_still_unknown_looks_again_ever_later_counted_from_its_events_not_their_words(
        people, worker, wire_transfer, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_BACKOFF_S": 100.0}
    agent = make_agent("wire-again", [{"tool_calls": [{"name": "wire_transfer", "arguments": {"amount": 10}}]},
                                      {"content": "Transferred."}], tools=["wire_transfer"])
    first = start_run(agent=agent, user=people["requester"], input="pay the supplier")
    worker.drain()
    original = ToolCall.objects.get(run=first)
    cancel_run(run=first, actor="user:requester")  # ended; its transfer's outcome still waits for a person
    assert ToolCall.objects.get(pk=original.pk).status == ToolCallStatus.UNKNOWN
    run = start_run(agent=agent, user=people["requester"], input="pay the supplier", session=first.session)

    delays = []
    for look in range(3):
        if look:
            assert sweep(now=run.wake_at + timedelta(seconds=1))["woken"] == 1
        worker.drain()
        run.refresh_from_db()
        assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
        waited = run.events.filter(to_status=RunStatus.WAITING).latest("seq")
        assert waited.payload["originals"] == [original.pk]
        delays.append(round((run.wake_at - waited.created_at).total_seconds() / 100))
        # Whatever the words of the waits so far (e.g. reworded in a later version), they still count.
        run.events.filter(to_status=RunStatus.WAITING).update(reason=f"reworded {look}")
    assert delays == [1, 2, 4]
    assert ToolCall.objects.get(run=run).duplicate_of_id == original.pk
