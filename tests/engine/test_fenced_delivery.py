"""``tools.services.results.deliver_tool_results`` (fence=True) checks the lease and inserts the messages in one
transaction: the check's fenced UPDATE holds the run's row (PostgreSQL) or the write lock (SQLite) until the
messages are in, so no takeover comes between (``loop.advance``: "nothing written after that was saved"). A
reviewer's test: the two went as two autocommitted statements for a while, and a takeover landed between them.
"""

import inspect
import threading

from django.db import connection
from django.db.models import F

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs import lease
from runs.lease import LeaseLost
from runs.engine import loop
from runs.engine.lifecycle import start_run
from runs.models import Agent, Message, Run
from tests.support.core import CORE_TOOLS, transfer


def _takeover(run_id: int, done: list) -> None:
    """Another worker takes the run's lease (its own connection)."""
    try:
        done.append(Run.objects.filter(pk=run_id).update(lease_token=F("lease_token") + 1, lease_owner="thief"))
    finally:
        connection.close()


def test_delivered_results_are_not_written_once_the_lease_was_taken_over(idle_worker, people, monkeypatch):
    agent = Agent.objects.create(slug="fenced", name="fenced", tools=CORE_TOOLS, completion_check="default",
                                 model={"provider": "scripted", "turns": [{"tool_calls": [transfer("acme", 80)]},
                                                                          {"content": "Not sent."}]})
    run = start_run(agent=agent, user=people["requester"], input="send 80 to acme")
    loop.advance(run.pk)  # waits for the approval of the transfer
    decide_interrupt(interrupt=Interrupt.objects.get(run=run), user=people["approver"], decision="rejected")

    check = lease.check
    stolen, threads = [], []

    def check_then_taken_over(run_id):
        check(run_id)
        if not stolen and any(frame.function == "deliver_tool_results" for frame in inspect.stack()):
            done = []
            thief = threading.Thread(target=_takeover, args=(run_id, done), daemon=True)
            thief.start()
            thief.join(3)  # blocked while the checking transaction holds the row / the write lock
            stolen.append(bool(done))  # else it goes on once this worker's transaction is over
            threads.append(thief)

    monkeypatch.setattr(lease, "check", check_then_taken_over)
    try:
        loop.advance(run.pk)
    except LeaseLost:
        pass
    for thief in threads:
        thief.join(30)
    messages = list(Message.objects.filter(run=run, role="tool").values_list("tool_call_id", flat=True))
    assert stolen, "the rejected call's result was delivered by _step's deliver_tool_results"
    assert not (stolen[0] and messages), (
        "the lease changed hands between the check and the INSERT, and the old worker's messages were stored")
