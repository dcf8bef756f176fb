"""Side effects on one target are checked and sent one at a time (tools.services.targets), with real concurrency.

Account acme can take 100 (``fake_transfer``'s limit). Three transfers of 80
approved at the same instant, advanced by three worker threads while the
bank takes its time to pay, must pay at most 100: one succeeds, the others
are denied by their precondition, checked once the first had paid. The same
with transfers advanced by separate worker processes, whose bank keeps its
ledger in a file all the processes share (``tests.support.fake_tools``).
"""

import time
from decimal import Decimal

import dramatiq
import pytest
from bs4 import BeautifulSoup
from django.contrib.auth import get_user_model
from django.test import Client
from dramatiq import Worker

from approvals.bulk import fingerprint
from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.engine.lifecycle import start_run
from runs.sweeping import sweep
from runs.models import Run, RunStatus
from tests.support.api import all_at_once
from tests.support.core import transfer
from tests.support.durability import make_agent
from tests.support.fake_tools import judge_transfers, slow_down, transfer_bank, transfer_requests, transfers
from tools.models import ToolCall, ToolCallStatus

S = ToolCallStatus
KILLED = -9


@pytest.fixture
def workers(idle_worker):
    """A started worker with three threads on the configured broker; ``settle(runs)`` waits until they end."""
    broker = dramatiq.get_broker()
    idle_worker.worker = Worker(broker, worker_timeout=20, worker_threads=3)
    idle_worker.worker.start()
    return idle_worker


def _transfer_runs(people, worker, count: int) -> list[Run]:
    """``count`` runs, each in its own session, each asking to transfer 80 to acme; all waiting for approval."""
    agent = make_agent("transfer-80", [{"tool_calls": [transfer("acme", 80)]}, {"content": "Done."}],
                       tools=["fake_transfer"], check="fake_transfer")
    runs = [start_run(agent=agent, user=people["requester"], input=f"send 80 to acme, try {n}") for n in range(count)]
    worker.drain()
    assert Interrupt.objects.filter(run__in=runs, status="pending").count() == count
    return runs


def _settle(runs: list[Run], timeout_s: float = 60) -> None:
    """Wait until every run has ended (the workers advance them; the sweeper wakes what waits on a timer)."""
    deadline = time.monotonic() + timeout_s
    while Run.objects.filter(pk__in=[r.pk for r in runs]).exclude(
            status__in=[RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED]).exists():
        assert time.monotonic() < deadline, list(Run.objects.filter(pk__in=[r.pk for r in runs])
                                                 .values_list("status", "waiting_reason"))
        sweep()
        time.sleep(0.2)


def _transferred() -> list[Decimal]:
    return [Decimal(str(t["amount"])) for t in transfers() if t["account"] == "acme"]


def _assert_one_transferred_rest_denied(runs: list[Run], sends: dict[str, int]) -> None:
    """One transfer paid 80 to acme, the others were denied by the account's limit; every key was sent once
    (``sends``: calls that reached the bank per idempotency key)."""
    assert _transferred() == [Decimal("80.00")]
    calls = list(ToolCall.objects.filter(run__in=runs, name="fake_transfer").order_by("pk"))
    assert sorted(call.status for call in calls) == [S.DENIED] * (len(runs) - 1) + [S.SUCCEEDED]
    for call in calls:
        if call.status == S.DENIED:
            assert "at most 20.00 more can be transferred" in call.error
    assert all(requests == 1 for requests in sends.values())


def test_transfers_approved_at_once_over_the_api_pay_at_most_the_account_limit(people, workers, api, monkeypatch):
    runs = _transfer_runs(people, workers, 3)
    bank = transfer_bank(monkeypatch)
    bank.delay_s = 0.3  # each payment takes a while: the others are checked meanwhile
    approver = api(people["approver"])
    items = list(Interrupt.objects.filter(run__in=runs).order_by("pk"))

    answers = all_at_once(3, lambda n: approver.post(f"/api/interrupts/{items[n].pk}/approve/", {}, format="json"))
    assert [answer.status_code for answer in answers] == [200] * 3
    _settle(runs)

    _assert_one_transferred_rest_denied(runs, bank.sends)
    # The later ones waited for the first: the log says for which call, and that its outcome woke them.
    waited = [run for run in runs if run.events.filter(reason__contains="waits for call #").exists()]
    assert waited and all(run.events.filter(reason__contains="released account acme").exists() for run in waited)


def test_transfers_approved_together_on_the_bulk_page_pay_at_most_the_account_limit(people, workers, monkeypatch):
    runs = _transfer_runs(people, workers, 3)
    bank = transfer_bank(monkeypatch, judge_together=judge_transfers)
    bank.delay_s = 0.3
    items = list(Interrupt.objects.filter(run__in=runs).order_by("pk"))
    browser = Client()
    browser.force_login(people["approver"])
    # The confirmation page repeats the inbox's warning, item by item.
    confirm = browser.get("/inbox/bulk/", {"item": [item.pk for item in items]})
    assert confirm.status_code == 200
    page = BeautifulSoup(confirm.content, "html.parser")
    assert page.select_one("#bulk-conflicts") is not None
    for item in items:
        note = page.select_one(f'.bulk-item[data-interrupt-id="{item.pk}"] p.related.conflict')
        assert note is not None and "ask 240.00; only 100.00 can be transferred: not all can be made" in note.text

    response = browser.post("/inbox/bulk/", {"decision": "approved", "comment": "all three",
                                             "item": [item.pk for item in items],
                                             **{f"fingerprint-{item.pk}": fingerprint(item) for item in items}})
    assert response.status_code == 200
    assert Interrupt.objects.filter(run__in=runs, decision="approved").count() == 3
    result = BeautifulSoup(response.content, "html.parser")
    outcomes_url = result.select_one("#bulk-outcomes")["data-url"]
    assert len(result.select(".bulk-outcome")) == 3
    _settle(runs)

    _assert_one_transferred_rest_denied(runs, bank.sends)
    # The result page's table, fetched again, tells each item's real outcome.
    rows = BeautifulSoup(browser.get(outcomes_url).content, "html.parser").select(".bulk-outcome")
    assert sorted(row["data-call-status"] for row in rows) == [S.DENIED, S.DENIED, S.SUCCEEDED]
    assert all(row["data-settled"] == "true" for row in rows)
    for row in rows:
        why = row.select_one(".bulk-outcome-detail").text
        assert ("at most 20.00 more can be transferred" in why) == (row["data-call-status"] == S.DENIED)
    # Someone who may not see the items gets no row of them; bad ids are refused.
    stranger = Client()
    stranger.force_login(get_user_model().objects.create_user("stranger", password="x" * 20))
    assert BeautifulSoup(stranger.get(outcomes_url).content, "html.parser").select(".bulk-outcome") == []
    assert browser.get("/inbox/bulk/outcomes/", {"item": "x"}).status_code == 400


def test_a_cumulative_rule_counts_a_call_still_in_flight(people, workers, monkeypatch):
    # With the rule below, a transfer asks for approval once the transfers to an account add up to more than
    # 50 over 30 days: the first 30 needs none; while it is being paid, two more runs propose 30 each at the
    # same instant.
    transfer_30 = [{"tool_calls": [transfer("acme", 30)]}, {"content": "Done."}]
    agent = make_agent("transfer-30", transfer_30, tools=["fake_transfer"], check="fake_transfer")
    transfer_bank(monkeypatch, approval="sum(amount) per target within 30d > 50").delay_s = 1.0
    first = start_run(agent=agent, user=people["requester"], input="first")
    deadline = time.monotonic() + 20
    while not ToolCall.objects.filter(run=first, status=S.RUNNING).exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)

    later = all_at_once(2, lambda n: start_run(agent=agent, user=people["requester"], input=f"later {n}").pk)
    deadline = time.monotonic() + 20
    while Interrupt.objects.filter(run_id__in=later, status="pending").count() < 2:
        assert time.monotonic() < deadline, list(ToolCall.objects.filter(run_id__in=later).values_list("status"))
        time.sleep(0.05)

    assert ToolCall.objects.get(run=first).status in (S.RUNNING, S.SUCCEEDED)
    assert list(ToolCall.objects.filter(run_id__in=later).values_list("status", flat=True)) == \
        [S.AWAITING_APPROVAL] * 2
    _settle([first])
    assert _transferred() == [Decimal("30")]  # nothing else was paid without a person


@pytest.mark.parametrize("point", ["tool_call_started:fake_transfer", "tool_call_returned:fake_transfer"])
def test_a_call_behind_a_crashed_holder_proceeds_once_it_is_recovered_and_nothing_is_paid_twice(
        point, people, idle_worker, worker_process):
    # Run A's worker dies holding account acme (before paying, or after); run B, approved meanwhile, waits for
    # it; once A's lease has expired the sweeper hands A to a worker, whose recovery releases the account.
    agent = make_agent("transfer-80", [{"tool_calls": [transfer("acme", 80)]}, {"content": "Done."}],
                       tools=["fake_transfer"], check="fake_transfer")
    run_a, run_b = (start_run(agent=agent, user=people["requester"], input=f"send 80 to acme, {n}") for n in "ab")
    assert [worker_process(run.pk) for run in (run_a, run_b)] == [0, 0]  # both wait for approval
    item_a, item_b = (Interrupt.objects.get(run=run) for run in (run_a, run_b))
    decide_interrupt(interrupt=item_a, user=people["approver"], decision="approved")
    assert worker_process(run_a.pk, failpoint=point) == KILLED
    assert ToolCall.objects.get(run=run_a).status == S.RUNNING  # it holds the account: the dead worker's claim

    decide_interrupt(interrupt=item_b, user=people["approver"], decision="approved")
    idle_worker.worker.start()
    deadline = time.monotonic() + 20
    while not run_b.events.filter(reason__contains="waits for call #").exists():
        assert time.monotonic() < deadline, list(run_b.events.values_list("reason", flat=True))
        time.sleep(0.05)
    assert ToolCall.objects.get(run=run_b).status == S.READY

    _settle([run_a, run_b])
    _assert_one_transferred_rest_denied([run_a, run_b], transfer_requests())


def test_transfers_advanced_by_separate_worker_processes_pay_at_most_the_account_limit(
        people, idle_worker, worker_process):
    agent = make_agent("transfer-80", [{"tool_calls": [transfer("acme", 80)]}, {"content": "Done."}],
                       tools=["fake_transfer"], check="fake_transfer")
    runs = [start_run(agent=agent, user=people["requester"], input=f"send 80 to acme, {n}") for n in range(3)]
    assert [worker_process(run.pk) for run in runs] == [0, 0, 0]  # all three wait for approval
    for item in Interrupt.objects.filter(run__in=runs):
        decide_interrupt(interrupt=item, user=people["approver"], decision="approved")
    slow_down(1.0)  # longer than the processes take to start apart

    assert all_at_once(3, lambda n: worker_process(runs[n].pk)) == [0, 0, 0]  # three processes at once
    idle_worker.worker.start()  # what the processes woke, or what waits on a timer, ends here
    _settle(runs)

    _assert_one_transferred_rest_denied(runs, transfer_requests())
