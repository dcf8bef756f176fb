"""A side effect's stored outcome survives a deadlock in what its worker does next, with the real worker and
PostgreSQL's deadlock detector (a reviewer's test of 676be64, whose lone jobs ran whole in one transaction).

The test runs the real worker (tests/conftest.py's ``worker``: one broker thread, the process's engine with
``ENGINE_GROUP_MAX`` 8 on PostgreSQL), so the job under test is alone on its database thread: each of its
transactions commits as it ends. tests/engine/test_group_commit.py has the same for a job in a group, where
commit points keep it.
"""

import threading

import pytest
from django.db import connection, transaction

from runs.engine.lifecycle import start_run
from runs.models import RunStatus
from tests.support.durability import make_agent, paying_tool
from tests.support.sessions import in_session, wait_for_a_lock_wait
from tools.models import PolicyLock, ToolCall, ToolCallStatus
from tools.services.targets import target_of

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                     reason="row locks, deadlocks and group commit (PostgreSQL's default)")
S = ToolCallStatus


@postgresql_only
def test_a_claim_waiting_on_a_writer_who_wants_the_released_target_does_not_undo_the_stored_outcome(
        people, worker, monkeypatch):
    """One turn pays two accounts. The job that stores the first payment's outcome (and gives up its claim on
    account a) goes on, with no call in between, to claim account b for the second, against another session
    doing the reverse (holding b, then wanting a). Had the release of a and the claim of b been one transaction
    (676be64 made a lone job one), PostgreSQL would have broken that circle by failing the worker's job, and
    the payment's outcome would have gone with it: the money left, the call ``running`` again, and the takeover
    could only make it ``unknown`` (no hook to ask), so the run would wait for a person to reconcile a payment
    it saw succeed. The outcome (and the release) is committed first, so the other session gets a, the worker
    then gets b, and both payments are stored as made."""
    sent = []
    tool = paying_tool(monkeypatch, sent)
    agent = make_agent("review-pay-two", [
        {"tool_calls": [{"name": tool.name, "arguments": {"account": "a"}},
                        {"name": tool.name, "arguments": {"account": "b"}}]},
        {"content": "Paid both."}], tools=[tool.name])
    key_a = target_of(tool, {"account": "a"}).lock_key
    key_b = target_of(tool, {"account": "b"}).lock_key
    PolicyLock.objects.create(key=key_b)  # the row another writer holds (a claim's INSERT ... ON CONFLICT waits)
    errors, holding = {}, threading.Event()

    def other_writer():  # holds b, then wants a: the reverse order
        with transaction.atomic():
            PolicyLock.objects.select_for_update().get(key=key_b)
            holding.set()
            wait_for_a_lock_wait("INSERT INTO")  # the worker's claim of b waits for this session
            PolicyLock.objects.filter(key=key_a).update(holder=None)  # waits for the worker's release of a

    other = in_session(errors, "other writer", other_writer)
    try:
        assert holding.wait(20)
        run = start_run(agent=agent, user=people["requester"], input="pay a and b")
        worker.drain(timeout_s=60)
    finally:
        other.join(30)

    assert errors == {}  # the other session was not failed either
    first = ToolCall.objects.get(run=run, arguments={"account": "a"})
    assert sent.count("a") == sent.count("b") == 1  # each payment went out once
    assert (first.status, first.result) == (S.SUCCEEDED, {"paid": "a", "payment_id": "pay-1"})
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
