"""Claims on a target (``tools.services.targets``): who a release wakes, and a run that ends holding one.

* A release wakes the runs parked because the target was held (their call
  was never sent), not a run backing off after a failed send: its own
  ``wake_at`` stands, so one run's failures cannot cut another's backoff
  short.
* A run that ends while its call holds the target (cancelled, failed by
  the sweeper) wakes the target's waiters as its ending commits, rather
  than leaving them until their lease-TTL ``wake_at``.
"""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from approvals.models import Interrupt
from runs.engine.lifecycle import cancel_run, start_run
from runs.models import Run, RunStatus, WaitingReason
from tests.support.core import transfer
from tests.support.durability import make_agent
from tools.models import ToolCall, ToolCallStatus
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
    _park(parked_run, attempts=0)  # never sent: it found the target held
    _park(backing_off_run, attempts=1)  # sent once, failed, waits out its backoff
    tool = get_tool("fake_transfer")
    with transaction.atomic():
        assert claim(target_of(tool, holder.arguments), holder) is None

    with transaction.atomic():
        assert release(holder, tool, actor="test") == 1

    assert _woken_by(parked_run, holder)
    assert not _woken_by(backing_off_run, holder)
    backing_off = Run.objects.get(pk=backing_off_run.pk)
    assert (backing_off.status, backing_off.waiting_reason) == (RunStatus.WAITING, WaitingReason.RETRY_BACKOFF)


def test_a_run_cancelled_while_its_call_holds_the_target_wakes_the_waiter_as_it_ends(people, worker):
    holder_run, parked_run = _waiting_transfers(people, worker, 2)
    holder = _park(holder_run, attempts=0)
    _park(parked_run, attempts=0)
    with transaction.atomic():
        assert claim(target_of(get_tool("fake_transfer"), holder.arguments), holder) is None

    cancel_run(run=Run.objects.get(pk=holder_run.pk), actor="test")

    assert Run.objects.get(pk=holder_run.pk).status == RunStatus.CANCELLED
    assert ToolCall.objects.get(pk=holder.pk).status == S.CANCELLED
    assert _woken_by(parked_run, holder)  # now, not a lease TTL later
