"""The transitions of Run, ToolCall and Interrupt: legal ones work, others raise."""

import pytest
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from approvals.models import Interrupt, InterruptKind
from runs.models import Run, RunStatus, Step
from runs.services import transition_run
from runs.engine.lifecycle import start_run
from tests.durability import lookup_agent
from tools.models import ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(people):
    return start_run(agent=lookup_agent(), user=people["requester"], input="look a up")


def test_status_field_cannot_be_assigned_directly(run):
    with pytest.raises(AttributeError):
        run.status = RunStatus.COMPLETED


def test_queued_run_cannot_complete_without_running(run):
    with pytest.raises(TransitionNotAllowed):
        transition_run(run, "complete", actor="test", outcome="achieved", final_output="done")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def test_terminal_runs_are_final(run):
    transition_run(run, "fail", actor="test", failure_type="internal_error", error="boom")
    for name, kwargs in [("start", {}), ("resume", {}), ("cancel", {}),
                         ("fail", {"failure_type": "model_error", "error": "x"})]:
        with pytest.raises(TransitionNotAllowed):
            transition_run(run, name, actor="test", **kwargs)
    run.refresh_from_db()
    assert (run.status, run.failure_type) == (RunStatus.FAILED, "internal_error")


def test_every_transition_is_logged_with_from_to_and_actor(run):
    transition_run(run, "start", actor="worker")
    transition_run(run, "wait", actor="worker", waiting_reason="approval")
    transitions = list(run.events.filter(type="transition").values_list("seq", "from_status", "to_status", "actor"))
    assert transitions == [
        (1, "", "queued", "user:requester"),
        (2, "queued", "running", "worker"),
        (3, "running", "waiting", "worker"),
    ]
    run.refresh_from_db()
    assert run.waiting_reason == "approval"


def test_a_stale_copy_of_a_run_cannot_overwrite_a_newer_status(run):
    stale = Run.objects.get(pk=run.pk)
    transition_run(run, "cancel", actor="user:requester")
    with pytest.raises(ConcurrentTransition):
        transition_run(stale, "start", actor="worker")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_tool_call_cannot_run_before_it_is_ready(run):
    step = Step.objects.create(run=run, index=0)
    call = ToolCall.objects.create(run=run, step=step, index=0, provider_call_id="c1", name="fake_transfer")
    with pytest.raises(TransitionNotAllowed):
        call.begin(idempotency_key="k", now=None)
    call.request_approval()
    with pytest.raises(TransitionNotAllowed):
        call.begin(idempotency_key="k", now=None)
    call.make_ready()
    call.begin(idempotency_key="k", now=None)
    assert call.status == ToolCallStatus.RUNNING


def test_resolved_interrupt_cannot_be_resolved_again(run, people):
    interrupt = Interrupt.objects.create(run=run, kind=InterruptKind.APPROVAL, title="t")
    interrupt.resolve(decision="approved", user=people["approver"], comment="", edited_arguments=None, now=None)
    with pytest.raises(TransitionNotAllowed):
        interrupt.resolve(decision="rejected", user=people["approver"], comment="", edited_arguments=None, now=None)
    with pytest.raises(TransitionNotAllowed):
        interrupt.cancel(now=None)
