"""Claims on a target (``tools.services.targets``): who a release wakes, and a run that ends holding one.

* A release wakes the runs parked because the target was held (their call
  was never sent), not a run backing off after a failed send: its own
  ``wake_at`` stands, so one run's failures cannot cut another's backoff
  short.
* Only a claim that found the target held marks that a run waits, and only
  a marked target's release looks for waiters; a release that waits for
  such a claim's transaction still sees its mark.
* A run that ends while its call holds the target (cancelled, failed by
  the sweeper) wakes the target's waiters as its ending commits, rather
  than leaving them until their lease-TTL ``wake_at``.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Interrupt
from runs.engine.lifecycle import cancel_run, start_run
from runs.models import Run, RunStatus, WaitingReason
from tests.support.core import transfer
from tests.support.durability import make_agent
from tests.support.sessions import in_session, wait_for_a_lock_wait
from tools.models import PolicyLock, ToolCall, ToolCallStatus
from tools.registry import get_tool
from tools.services.targets import claim, release, target_of

pytestmark = pytest.mark.django_db(transaction=True)
S = ToolCallStatus
TRANSFER_80 = transfer("acme", 80)


def _waiting_transfers(people, worker, count: int) -> list[Run]:
    agent = make_agent("transfer-80", [{"tool_calls": [TRANSFER_80]}, {"content": "Done."}], tools=["fake_transfer"],
                       check="fake_transfer")
    runs = [start_run(agent=agent, user=people["requester"], input=f"send 80 to acme, {n}") for n in range(count)]
    worker.drain()
    assert Interrupt.objects.filter(run__in=runs, status="pending").count() == count
    Interrupt.objects.filter(run__in=runs).update(status="resolved")  # decided, as far as these tests care
    return runs


def _park(run: Run, *, attempts: int) -> ToolCall:
    """``run``'s transfer ``ready`` after ``attempts`` sends, the run waiting ``retry_backoff`` a minute away."""
    ToolCall.objects.filter(run=run).update(status=S.READY, attempts=attempts)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING, waiting_reason=WaitingReason.RETRY_BACKOFF,
                                         wake_at=timezone.now() + timedelta(minutes=1))
    return ToolCall.objects.get(run=run)


def _woken_by(run: Run, holder: ToolCall) -> bool:
    """Whether ``run`` was woken by ``holder``'s release (its ``wake`` transition says so)."""
    return Run.objects.get(pk=run.pk).events.filter(reason__startswith=f"call #{holder.pk} released").exists()


def test_a_release_wakes_a_run_parked_behind_the_target_but_not_one_backing_off(people, worker):
    holder_run, parked_run, backing_off_run = _waiting_transfers(people, worker, 3)
    holder = _park(holder_run, attempts=0)
    parked = _park(parked_run, attempts=0)  # never sent: it found the target held
    backing_off = _park(backing_off_run, attempts=1)  # sent once, failed, waits out its backoff
    tool = get_tool("fake_transfer")
    target = target_of(tool, holder.arguments)
    with transaction.atomic():
        assert claim(target, holder) is None
    for call in (parked, backing_off):  # each found the target held (and its run waits, as parked here)
        with transaction.atomic():
            assert claim(target, call) == holder.pk

    with transaction.atomic():
        assert release(holder, tool, actor="test") == 1

    assert _woken_by(parked_run, holder)
    assert not _woken_by(backing_off_run, holder)
    backing_off = Run.objects.get(pk=backing_off_run.pk)
    assert (backing_off.status, backing_off.waiting_reason) == (RunStatus.WAITING, WaitingReason.RETRY_BACKOFF)


def test_a_run_cancelled_while_its_call_holds_the_target_wakes_the_waiter_as_it_ends(people, worker):
    holder_run, parked_run = _waiting_transfers(people, worker, 2)
    holder = _park(holder_run, attempts=0)
    parked = _park(parked_run, attempts=0)
    target = target_of(get_tool("fake_transfer"), holder.arguments)
    with transaction.atomic():
        assert claim(target, holder) is None
    with transaction.atomic():
        assert claim(target, parked) == holder.pk

    cancel_run(run=Run.objects.get(pk=holder_run.pk), actor="test")

    assert Run.objects.get(pk=holder_run.pk).status == RunStatus.CANCELLED
    assert ToolCall.objects.get(pk=holder.pk).status == S.CANCELLED
    assert _woken_by(parked_run, holder)  # now, not a lease TTL later


def test_a_release_with_no_run_waiting_looks_for_no_waiter_and_one_that_woke_them_clears_the_flag(people, worker):
    """Only a claim that found the target held marks that a run waits (``PolicyLock.waiters``); a release
    with nobody marked frees the target in one statement, and the release that wakes the waiters clears the
    mark, so the next holder's release looks for no waiter again."""
    first_run, second_run = _waiting_transfers(people, worker, 2)
    first, second = _park(first_run, attempts=0), _park(second_run, attempts=0)
    tool = get_tool("fake_transfer")
    target = target_of(tool, first.arguments)
    with transaction.atomic():
        assert claim(target, first) is None
    assert PolicyLock.objects.get(key=target.lock_key).waiters is False

    with transaction.atomic(), CaptureQueriesContext(connection) as alone:
        assert release(first, tool, actor="test") == 0
    assert len(alone) == 1 and "tools_toolcall" not in alone[0]["sql"]  # no look for waiters
    assert PolicyLock.objects.get(key=target.lock_key).holder_id is None

    with transaction.atomic():
        assert claim(target, first) is None
    with transaction.atomic():
        assert claim(target, second) == first.pk  # found held: marked
    assert PolicyLock.objects.get(key=target.lock_key).waiters is True
    with transaction.atomic():
        assert release(first, tool, actor="test") == 1
    assert _woken_by(second_run, first)
    assert PolicyLock.objects.get(key=target.lock_key).waiters is False


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL: row locks between sessions")
def test_a_release_waiting_for_a_claim_that_finds_the_target_held_wakes_that_claims_run(people, worker):
    """The lost wake-up the mark must not allow: a run's claim finds the target held and, in the same
    transaction, its run waits; the holder's release meanwhile waits for the target's row. Once the claim's
    transaction commits, the release reads the row as it is then (the mark set) and wakes the run."""
    holder_run, waiter_run = _waiting_transfers(people, worker, 2)
    holder = _park(holder_run, attempts=0)
    waiter = ToolCall.objects.get(run=waiter_run)
    tool = get_tool("fake_transfer")
    target = target_of(tool, holder.arguments)
    with transaction.atomic():
        assert claim(target, holder) is None
    errors, released, claimed = {}, {}, threading.Event()

    def holders_release():
        claimed.wait(20)
        with transaction.atomic():
            released["woken"] = release(holder, tool, actor="test")  # waits for the claim's lock on the row

    thread = in_session(errors, "release", holders_release)
    try:
        with transaction.atomic():
            assert claim(target, waiter) == holder.pk
            _park(waiter_run, attempts=0)  # its run waits, in the transaction that found the target held
            claimed.set()
            wait_for_a_lock_wait("UPDATE")
    finally:
        claimed.set()
        thread.join()
    assert errors == {}
    assert released == {"woken": 1}
    assert _woken_by(waiter_run, holder)
