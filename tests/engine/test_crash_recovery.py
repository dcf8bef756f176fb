"""kill -9 of a worker in each phase: after the sweeper, the run ends as the rules say.

Each test advances a run in a separate worker process that SIGKILLs itself
at a failpoint (or is killed from outside), lets its lease expire, runs the
sweeper, and lets a fresh worker finish the run. The tests' own bank
(``fake_transfer``) keeps its ledger outside the worker, in a file the
processes share (``tests.support.fake_tools``): it shows whether anything
happened twice.
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
from tests.support.core import asking_agent, lookup, transfer_agent
from tests.support.durability import make_agent, wait_for_lease_expiry
from tests.support.fake_tools import (FAKE_NOTICE, FAKE_WAIT, set_account_limit, slow_down, transfer_bank,
                                      transfer_keys, transfer_made_under, transfer_requests)
from tools.models import ToolCall, ToolCallStatus

KILLED = -9


def _start(people, agent):
    return start_run(agent=agent, user=people["requester"], input="please transfer 10 to acme")


def _recover(run, worker):
    """Let the dead worker's lease expire, sweep (which must send the run again), then start ``worker`` (an
    ``idle_worker``) and let it finish. Started only after the sweep: a wake-up queued before the kill must
    not let it take the run over first (under load, after the expiry), which would leave the sweeper nothing
    to send."""
    wait_for_lease_expiry(run.pk)
    assert sweep()["reenqueued"] >= 1
    worker.worker.start()
    worker.drain()
    run.refresh_from_db()
    return run


def _charged_keys(account="acme"):
    """The idempotency keys of the transfers made to ``account`` (in any process), oldest first."""
    return [key for key in transfer_keys() if transfer_made_under(key)["account"] == account]


@pytest.mark.parametrize(
    "point", ["model_call_started", "tool_call_ready:fake_transfer", "tool_call_started:fake_transfer",
              "tool_call_returned:fake_transfer", "model_call_returned:stop"]
)
def test_transfer_killed_at_each_failpoint_completes_with_one_charge(
    point, people, idle_worker, worker_process
):
    run = _start(people, transfer_agent("transfer-10"))
    assert worker_process(run.pk, failpoint=point) == KILLED
    run = _recover(run, idle_worker)

    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    charges = _charged_keys()
    assert len(charges) == 1
    transfer_call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert charges[0] == transfer_call.idempotency_key
    assert transfer_call.status == ToolCallStatus.SUCCEEDED
    if point == "model_call_returned:stop":  # the stored final answer is judged, not asked for again
        assert run.steps.count() == 3 and run.model_calls == 3
    if point == "model_call_started":
        assert run.steps.filter(status=Step.Status.DISCARDED).count() == 1
        assert run.events.filter(type="model_call", reason__startswith="discarded").exists()
    if point in ("tool_call_started:fake_transfer", "tool_call_returned:fake_transfer"):
        assert run.events.filter(type="tool_call", reason="retrying after a worker crash").exists()
    if point == "tool_call_started:fake_transfer":  # never reached the bank: looked up, not found, checked, sent
        assert transfer_call.attempts == 2
    if point == "tool_call_returned:fake_transfer":  # paid before the kill: found by its key, not sent again
        assert transfer_call.attempts == 1
        assert transfer_requests()[transfer_call.idempotency_key] == 1
        assert run.events.filter(type="tool_call", reason="found at the external system before sending again",
                                 to_status="succeeded").exists()


def test_worker_killed_while_the_bank_is_transferring_ends_with_one_charge(
    people, idle_worker, worker_process
):
    """kill -9 from outside while the transfer is in flight: the bank made it, its answer is slow."""
    slow_down(1.0)
    run = _start(people, transfer_agent("transfer-10"))

    def transfer_in_flight():
        return ToolCall.objects.filter(run=run, name="fake_transfer", status=ToolCallStatus.RUNNING).exists()

    assert worker_process(run.pk, kill_when=transfer_in_flight) == KILLED
    run = _recover(run, idle_worker)

    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    transfer_call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert _charged_keys() == [transfer_call.idempotency_key]
    assert transfer_requests() == {transfer_call.idempotency_key: 1}  # found by its key, never sent again


def _notice_agent():
    text = "Contract attached."
    return make_agent("notice-default", [
        {"tool_calls": [lookup("c")]},
        {"tool_calls": [{"name": "fake_notice", "arguments": {"to": "c@example.com", "subject": "Contract",
                                                                "body": text}}]},
        {"content": "Sent."},
    ], tools=["fake_lookup", "fake_notice"])


@pytest.mark.parametrize("point", ["tool_call_started:fake_notice", "tool_call_returned:fake_notice"])
def test_side_effect_without_hook_killed_mid_call_goes_to_a_person(point, people, idle_worker, worker_process,
                                                                   monkeypatch):
    from tools import registry

    monkeypatch.setitem(registry._TOOLS, "fake_notice", FAKE_NOTICE)  # a side effect without a reconcile hook
    run = _start(people, _notice_agent())
    assert worker_process(run.pk, tools=("fake_notice",)) == 0
    run.refresh_from_db()
    assert run.waiting_reason == WaitingReason.APPROVAL
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="approved")

    assert worker_process(run.pk, failpoint=point, tools=("fake_notice",)) == KILLED
    run = _recover(run, idle_worker)

    send_call = ToolCall.objects.get(run=run, name="fake_notice")
    assert send_call.status == ToolCallStatus.UNKNOWN
    assert send_call.attempts == 1  # never sent again blindly
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION, status=InterruptStatus.PENDING)

    reconcile_interrupt(interrupt=item, user=people["approver"], succeeded=True,
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
    """``neighbour`` died in ``run``'s worker too, its step started ``BLAME_MARGIN`` after ``run``'s transfer: the
    sweeper will blame the neighbour and count ``run`` a bystander."""
    owner = Run.objects.values_list("lease_owner", flat=True).get(pk=run.pk)
    call_started = ToolCall.objects.values_list("started_at", flat=True).get(run=run, name="fake_transfer")
    Run.objects.filter(pk=neighbour.pk).update(status=RunStatus.RUNNING, lease_owner=owner,
                                               lease_expires_at=timezone.now() - timedelta(seconds=1))
    step = Step.objects.create(run=neighbour, index=neighbour.steps.count())
    Step.objects.filter(pk=step.pk).update(started_at=call_started + BLAME_MARGIN)


def test_sends_a_bystander_lost_to_a_neighbours_crashes_leave_its_retries_whole(
    people, idle_worker, worker_process, monkeypatch
):
    # The chaos run's flake: twice a transfer had just started (running, not yet sent) in a worker that a
    # neighbour's step killed; as a bystander it was sent again each time, but those two cut-off sends
    # still counted against max_attempts (3), so the bank's first answer, a 503 that is retried
    # otherwise, left it unknown; the bank had no trace, a person settled it failed, the run failed.
    run = _start(people, transfer_agent("transfer-10"))
    neighbour = _start(people, make_agent("neighbour", [{"content": "Done."}], tools=[]))
    # worker_process: the real actor in a process that SIGKILLs itself at the failpoint. It keeps no flight
    # recorder (its directory cannot be made), so the order of starts decides, as for a sweeper on another host.
    for attempt in (1, 2):
        assert worker_process(run.pk, failpoint="tool_call_started:fake_transfer",
                              env={"TOLLGATE_FLIGHT_RECORDER_DIR": "/dev/null/no-recorder"}) == KILLED
        _neighbour_blamed_for(run, neighbour)
        wait_for_lease_expiry(run.pk)
        sweep()
        assert Run.objects.values_list("death_blame", flat=True).get(pk=run.pk) == DeathBlame.BYSTANDER
    assert transfer_requests() == {}  # neither send left the worker

    bank = transfer_bank(monkeypatch)  # this process's worker sends from now on: its bank counts every send
    bank.script("unavailable")
    idle_worker.worker.start()
    idle_worker.drain()
    run.refresh_from_db()

    call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "achieved")
    assert (call.status, call.attempts) == (ToolCallStatus.SUCCEEDED, 4)
    assert [e.payload["blamed"] for e in run.events.filter(type="recovery")] == [False, False]
    assert _charged_keys() == [call.idempotency_key]
    assert bank.sends == {call.idempotency_key: 2}


def _transfer_whose_earlier_send_lands_late(monkeypatch, account: str, amount: float, hidden_lookups: int):
    """Replace the transfer tool's ``reconcile`` hook: the first time it is asked, the transfer's earlier send
    (still on its way when its worker died) lands at the bank just after the lookup; the first
    ``hidden_lookups`` lookups answer ``not_found`` (the bank's view lagging behind)."""
    import dataclasses
    from types import SimpleNamespace

    from tools import registry
    from tools.registry import Reconciliation

    real = registry.get_tool("fake_transfer")
    asked = []

    def late(key):
        asked.append(key)
        found = real.reconcile(key) if len(asked) > hidden_lookups else Reconciliation("not_found")
        if len(asked) == 1:
            real.handler(SimpleNamespace(idempotency_key=key), {"account": account, "amount": amount})
        return found

    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(real, reconcile=late))
    return asked


def _transfer_of_most_of_a_small_limit(people, account: str):
    """A run transferring 10 to ``account``, which can take 15 in all: once it is made, no room is left for it."""
    set_account_limit(account, 15)
    return start_run(agent=transfer_agent(f"transfer-{account}", account), user=people["requester"],
                     input=f"transfer 10 to {account}")


def test_an_earlier_send_landing_after_the_lookup_is_found_not_denied_by_its_own_transfer(
    people, idle_worker, worker_process, monkeypatch
):
    """The worker dies with the transfer (10 of 15) sent; the next worker looks its key up (not there yet),
    then the earlier send lands, so the precondition sees the call's own transfer and says no room is left.
    The bank made it: the call ends ``succeeded`` (looked up again), never ``denied``; one charge."""
    run = _transfer_of_most_of_a_small_limit(people, "acct-700")
    assert worker_process(run.pk, failpoint="tool_call_started:fake_transfer") == KILLED
    asked = _transfer_whose_earlier_send_lands_late(monkeypatch, "acct-700", 10, hidden_lookups=1)
    run = _recover(run, idle_worker)

    call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert len(asked) == 2
    assert (call.status, run.status, run.outcome) == (ToolCallStatus.SUCCEEDED, RunStatus.COMPLETED, "achieved")
    assert _charged_keys("acct-700") == [call.idempotency_key]
    assert not run.events.filter(type="tool_call", to_status="denied").exists()


def test_an_earlier_send_the_lookup_cannot_see_is_unknown_when_its_precondition_says_no(
    people, idle_worker, worker_process, monkeypatch
):
    """Same, but the bank's lookups never show the landed transfer: the precondition's "no" may be the
    call's own transfer, so the call is ``unknown``, and after ``RECONCILE_MAX_TRIES`` looks a person
    reconciles it; never ``denied``, never sent again."""
    run = _transfer_of_most_of_a_small_limit(people, "acct-701")
    assert worker_process(run.pk, failpoint="tool_call_started:fake_transfer") == KILLED
    _transfer_whose_earlier_send_lands_late(monkeypatch, "acct-701", 10, hidden_lookups=10**6)
    run = _recover(run, idle_worker)

    call = ToolCall.objects.get(run=run, name="fake_transfer")
    assert call.status == ToolCallStatus.UNKNOWN
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RECONCILIATION)
    assert Interrupt.objects.filter(run=run, kind=InterruptKind.RECONCILIATION,
                                    status=InterruptStatus.PENDING).exists()
    assert len(_charged_keys("acct-701")) == 1
    assert call.attempts == 1
    assert not run.events.filter(type="tool_call", to_status="denied").exists()


def test_a_run_taken_over_from_a_dead_worker_before_the_sweeper_is_advanced_alone(people, worker_process):
    from runs.engine import runtime

    run = _start(people, transfer_agent("transfer-10"))
    assert worker_process(run.pk, failpoint="tool_call_started:fake_transfer") == KILLED
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


def test_a_worker_killed_by_one_runs_call_blames_that_run_and_clears_the_runs_waiting_for_answers(
        people, worker_process, monkeypatch):
    """Issue 21 (quarantine at scale): the dead worker's flight recorder says whose code was running when it
    died, so its neighbours, waiting for answers on the loop, are neither blamed nor made suspects."""
    from runs import lease
    from runs.base import flight_recorder
    from tools import registry

    monkeypatch.setitem(registry._TOOLS, "fake_wait", FAKE_WAIT)
    waiting_agent = make_agent("waiting", [{"tool_calls": [{"name": "fake_wait", "arguments": {"seconds": 30}}]},
                                           {"content": "Waited."}], tools=["fake_wait"])
    waiting = [start_run(agent=waiting_agent, user=people["requester"], input=f"wait {n}") for n in range(4)]
    poison = _start(people, transfer_agent("poison"))
    killed = worker_process(poison.pk, failpoint="tool_call_started:agent=poison", tools=("fake_wait",),
                            first=tuple(run.pk for run in waiting))
    assert killed == KILLED
    everyone = [*waiting, poison]
    owners = set(Run.objects.filter(pk__in=[run.pk for run in everyone]).values_list("lease_owner", flat=True))
    assert len(owners) == 1 and flight_recorder.read(owner := owners.pop()) is not None
    assert ToolCall.objects.filter(run__in=everyone, status=ToolCallStatus.RUNNING).count() == 5  # all in flight
    for run in everyone:
        wait_for_lease_expiry(run.pk)

    assert sweep()["reenqueued"] == 5
    assert flight_recorder.read(owner) is None  # read, then discarded once no run was left leased to it
    counted = {pk: rest for pk, *rest in Run.objects.filter(pk__in=[run.pk for run in everyone]).values_list(
        "pk", "death_blame", "crash_streak", "loss_streak", "lost_leases")}
    assert counted == {poison.pk: [DeathBlame.CULPRIT, 1, 1, 1],
                       **{run.pk: [DeathBlame.CLEARED, 0, 1, 1] for run in waiting}}
    suspects = {run.pk: lease.acquire(run.pk).suspect for run in everyone}
    assert suspects == {poison.pk: True, **{run.pk: False for run in waiting}}
