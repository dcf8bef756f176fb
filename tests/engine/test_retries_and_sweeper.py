"""Read-only retries with backoff, long backoffs as timers, and the sweeper's other duties."""

from datetime import timedelta

import dramatiq
import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.utils import timezone, translation

from approvals.models import Interrupt, InterruptStatus
from runs.models import DeathBlame, FailureType, Run, RunStatus, Step, WaitingReason
from runs.engine.recovery import BLAME_MARGIN, recover_after_takeover
from runs.sweeping import sweep
from runs.engine.lifecycle import start_run
from tests.support.core import asking_agent, refused_agent
from tests.support.durability import make_agent
from tests.support.fake_tools import transfers
from tools import registry
from tools.models import ToolCall, ToolCallStatus
from tools.registry import Tool, ToolUnavailable


@pytest.fixture
def flaky_lookup(monkeypatch):
    """A read-only tool that fails ``failures[0]`` times with a transient error, then answers."""
    failures = [0]

    def handler(ctx, args):
        if failures[0] > 0:
            failures[0] -= 1
            raise ToolUnavailable("inventory service answered 503")
        return {"in_stock": 3}

    tool = Tool(name="stock_lookup", description="Look up stock.", handler=handler, max_attempts=3, backoff_s=0.01,
                parameters={"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]})
    monkeypatch.setitem(registry._TOOLS, "stock_lookup", tool)
    return failures


def _lookup_run(people):
    agent = make_agent("stock", [{"tool_calls": [{"name": "stock_lookup", "arguments": {"sku": "A-1"}}]},
                                 {"content": "3 in stock."}], tools=["stock_lookup"])
    return start_run(agent=agent, user=people["requester"], input="how many A-1?")


def test_read_only_call_is_retried_and_each_attempt_is_an_event(people, worker, flaky_lookup):
    flaky_lookup[0] = 2
    run = _lookup_run(people)
    worker.drain()
    run.refresh_from_db()
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.attempts, call.result) == (ToolCallStatus.SUCCEEDED, 3, {"in_stock": 3})
    assert run.events.filter(type="tool_call", reason="retrying").count() == 2
    assert run.status == RunStatus.COMPLETED


def test_read_only_call_fails_after_its_attempts_and_the_model_hears_it(people, worker, flaky_lookup):
    flaky_lookup[0] = 99
    run = _lookup_run(people)
    worker.drain()
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.attempts) == (ToolCallStatus.FAILED, 3)
    assert "Gave up after 3 attempts" in call.error
    assert run.messages.filter(role="tool", content__contains="Gave up").exists()


def test_long_backoff_waits_on_a_timer_instead_of_a_sleeping_worker(people, worker, flaky_lookup, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "INLINE_BACKOFF_MAX_S": 0.0}
    flaky_lookup[0] = 1
    run = _lookup_run(people)
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.RETRY_BACKOFF)
    assert run.wake_at is not None and run.lease_owner == ""

    assert sweep(now=run.wake_at + timedelta(seconds=1))["woken"] == 1
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert ToolCall.objects.get(run=run).attempts == 2


def test_sweeper_re_enqueues_a_queued_run_whose_message_was_lost(people, idle_worker, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "QUEUED_GRACE_S": 0.0}
    run = start_run(agent=refused_agent(), user=people["requester"], input="send 500 to acme")
    dramatiq.get_broker().flush_all()  # the broker lost the wake-up
    idle_worker.worker.start()
    idle_worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED

    call_command("recover_runs", stdout=open("/dev/null", "w"))
    idle_worker.drain()
    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, "not_achieved")


def test_expired_approval_fails_the_run_and_runs_nothing(people, worker):
    run = start_run(agent=asking_agent(), user=people["requester"], input="send 80 to acme")
    worker.drain()
    item = Interrupt.objects.get(run=run)
    assert sweep(now=item.expires_at - timedelta(seconds=1))["expired"] == 0

    assert sweep(now=item.expires_at + timedelta(seconds=1))["expired"] == 1
    run.refresh_from_db()
    item.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "approval_expired")
    assert item.status == InterruptStatus.EXPIRED
    assert ToolCall.objects.get(run=run, name="fake_transfer").status == ToolCallStatus.EXPIRED
    assert transfers() == []
    assert timezone.now() < item.expires_at  # decided by the sweeper's clock, not by waiting


def test_sweeper_sends_a_stranded_run_once_per_grace_period(people, idle_worker, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "QUEUED_GRACE_S": 30.0}
    run = start_run(agent=refused_agent(), user=people["requester"], input="send 500 to acme")
    dramatiq.get_broker().flush_all()  # lost, and every re-send below is lost too
    later = timezone.now() + timedelta(seconds=31)
    assert sweep(now=later)["reenqueued"] == 1
    assert sweep(now=later + timedelta(seconds=5))["reenqueued"] == 0
    dramatiq.get_broker().flush_all()
    assert sweep(now=later + timedelta(seconds=31))["reenqueued"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def test_a_run_waiting_its_turn_in_the_broker_is_not_sent_again(people, idle_worker):
    agent = refused_agent()
    runs = [start_run(agent=agent, user=people["requester"], input=f"send 500 to acme ({i})") for i in range(3)]
    long_after = timezone.now() + timedelta(hours=1)  # far past the grace period: a long backlog
    assert sweep(now=long_after)["reenqueued"] == 0, "their wake-ups are still in the queue"

    dramatiq.get_broker().flush_all()  # now they are lost
    assert sweep(now=long_after)["reenqueued"] == 3
    idle_worker.worker.start()
    idle_worker.drain()
    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.COMPLETED


def test_the_sweeper_sends_back_at_most_its_limit_per_pass(people, idle_worker, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "SWEEP_MAX_RESENDS": 2}
    agent = refused_agent()
    for i in range(3):
        start_run(agent=agent, user=people["requester"], input=f"send 500 to acme ({i})")
    dramatiq.get_broker().flush_all()
    long_after = timezone.now() + timedelta(hours=1)
    assert sweep(now=long_after)["reenqueued"] == 2
    assert sweep(now=long_after + timedelta(hours=1))["reenqueued"] == 1  # the third, on the next pass


def test_a_wake_up_held_by_a_dead_consumer_does_not_count_as_waiting(people, idle_worker):
    from dramatiq.brokers.redis import RedisBroker

    broker = dramatiq.get_broker()
    if not isinstance(broker, RedisBroker):
        pytest.skip("only the Redis broker hands messages to consumers in other processes")
    run = start_run(agent=refused_agent(), user=people["requester"], input="send 500 to acme")
    consumer = broker.consume("default", prefetch=10, timeout=500)
    assert next(consumer) is not None  # fetched by a worker that then dies without acknowledging it
    try:
        assert sweep(now=timezone.now() + timedelta(hours=1))["reenqueued"] == 1
    finally:
        consumer.close()
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def _die_together(runs, owner, started):
    """``runs`` were held by worker ``owner``, which died with a step of each started at ``started``."""
    for run, at in zip(runs, started):
        Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, lease_owner=owner,
                                             lease_expires_at=timezone.now() - timedelta(seconds=1))
        step = Step.objects.create(run=run, index=run.steps.count())
        Step.objects.filter(pk=step.pk).update(started_at=at)


def test_the_sweepers_blame_is_stored_as_the_strings_rows_already_hold_and_shown_as_a_word(people):
    agent = make_agent("co-dying", [{"content": "x"}], tools=[])
    bystander, culprit = (start_run(agent=agent, user=people["requester"], input="x") for _ in range(2))
    started = timezone.now() - timedelta(minutes=5)
    _die_together([bystander, culprit], "worker-0", [started, started + BLAME_MARGIN])
    sweep()
    stored = dict(Run.objects.filter(pk__in=[bystander.pk, culprit.pk]).values_list("pk", "death_blame"))
    assert stored == {bystander.pk: "bystander", culprit.pk: "culprit"}  # what migration 0008's column holds
    culprit.refresh_from_db()
    with translation.override("zh-hans"):
        assert (culprit.get_death_blame_display(), DeathBlame.BYSTANDER.label) == ("肇事者", "旁观者")
    with pytest.raises(ValidationError):  # the column's choices: the admin and full_clean refuse anything else
        Run._meta.get_field("death_blame").clean("guilty", culprit)


def test_a_run_whose_work_started_just_after_a_neighbours_is_never_blamed_for_their_deaths(people, settings):
    """The killing step runs on for a moment after recording its start: a neighbour's later start proves nothing."""
    agent = make_agent("co-dying", [{"content": "x"}], tools=["fake_lookup"])
    neighbour, bystander = (start_run(agent=agent, user=people["requester"], input="x") for _ in range(2))
    for death in range(settings.TOLLGATE["MAX_CRASHES_PER_STEP"]):
        killing_step_started = timezone.now() - timedelta(minutes=5)
        _die_together([neighbour, bystander], f"worker-{death}",
                      [killing_step_started, killing_step_started + BLAME_MARGIN / 10])
        sweep()
        for run in (neighbour, bystander):  # the worker that takes each run over
            run.refresh_from_db()
            assert run.death_blame == DeathBlame.BYSTANDER
            assert recover_after_takeover(run, actor="worker", calls=list(run.tool_calls.all())) is None
    for run in (neighbour, bystander):
        run.refresh_from_db()
        assert (run.crash_streak, run.loss_streak, run.lost_leases, run.death_blame) == (0, 3, 3, "")
        assert [e.payload["blamed"] for e in run.events.filter(type="recovery")] == [False] * 3
        assert run.steps.filter(status=Step.Status.DISCARDED).count() == 3

    # Started clearly after every other piece of the dead worker's work: blamed, and the third time ends it.
    for death in range(settings.TOLLGATE["MAX_CRASHES_PER_STEP"]):
        other_started = timezone.now() - timedelta(minutes=5)
        _die_together([neighbour, bystander], f"late-worker-{death}", [other_started, other_started + BLAME_MARGIN])
        sweep()
        neighbour.refresh_from_db()
        bystander.refresh_from_db()
        assert (neighbour.death_blame, bystander.death_blame) == (DeathBlame.BYSTANDER, DeathBlame.CULPRIT)
        assert recover_after_takeover(neighbour, actor="worker", calls=list(neighbour.tool_calls.all())) is None
        verdict = recover_after_takeover(bystander, actor="worker", calls=list(bystander.tool_calls.all()))
    assert verdict == FailureType.CRASH_LOOP
    bystander.refresh_from_db()
    assert (bystander.crash_streak, bystander.loss_streak) == (3, 6)
