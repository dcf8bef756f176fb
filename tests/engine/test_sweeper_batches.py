"""Issue 13, due work: a sweeper pass costs a small constant per due item, and a pass is bounded.

Due items are read with one query per kind, handled several per
transaction with what ending a run needs loaded for all of them at once,
and at most ``SWEEP_BATCH`` of each kind per pass: the rest are the next
pass's. Each item still gets its own events and transitions, as one at a
time did. A decision on an approval past its expiry is refused (409
``expired``); the sweeper then expires it like any other.
"""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals.models import Interrupt
from runs.engine.sweep_jobs import expire_overdue_approvals, reconcile_after_run_end
from runs.sweeping import sweep
from runs.models import Message, Run, RunEvent, Session
from runs.services import append_event
from runs.webhooks.models import OutboxEntry, WebhookSubscription
from tests.support.api import error_of
from tests.support.core import pending_transfer
from tools.models import ToolCall

# Statements of a pass with due work besides its items (the looks for due work, one batch's locks and loads).
FIXED_BOUND = 30
# What expiring one approval writes to its run's log, in order (type, from, to, reason).
EXPIRY_EVENTS = [
    ("interrupt", "pending", "expired", "expired"),
    ("tool_call", "awaiting_approval", "expired", "expire"),
    ("transition", "waiting", "failed", "approval expired"),
]


def overdue_items(count: int, requester) -> list[Interrupt]:
    """``count`` pending approvals in waiting runs, overdue by 1, 2, ... minutes (the first the most)."""
    items = [pending_transfer(requester=requester) for _ in range(count)]
    now = timezone.now()
    for minutes, item in enumerate(items):
        Interrupt.objects.filter(pk=item.pk).update(expires_at=now - timedelta(minutes=count - minutes))
    return items


def due_backoffs(count: int, requester) -> list[Run]:
    """``count`` runs waiting in a retry backoff whose ``wake_at`` passed."""
    agent = pending_transfer(requester=requester, expires_in=None).run.agent
    runs = []
    for number in range(count):
        session = Session.objects.create(owner=requester, agent=agent)
        runs.append(Run.objects.create(session=session, agent=agent, requested_by=requester, input=f"backoff {number}",
                                       status="waiting", waiting_reason="retry_backoff", started_at=timezone.now(),
                                       wake_at=timezone.now() - timedelta(seconds=number + 1)))
    return runs


def statements_of_a_pass() -> tuple[int, dict]:
    with CaptureQueriesContext(connection) as captured:
        found = sweep()
    return len(captured.captured_queries), found


def log_of(run_id: int, since: int) -> list[tuple]:
    return list(RunEvent.objects.filter(run_id=run_id, seq__gt=since).order_by("seq")
                .values_list("type", "from_status", "to_status", "reason"))


def assert_expired_as_one_at_a_time(item: Interrupt, since: int) -> None:
    """The item's run ended exactly as a single expiry ends it: item, call, run, log and the call's result."""
    item.refresh_from_db()
    run = Run.objects.get(pk=item.run_id)
    call = ToolCall.objects.get(pk=item.tool_call_id)
    assert (item.status, call.status) == ("expired", "expired")
    assert (run.status, run.failure_type) == ("failed", "approval_expired")
    assert run.error == f"Inbox item {item.pk} expired before anyone decided."
    assert log_of(run.pk, since) == EXPIRY_EVENTS
    assert Message.objects.filter(run=run, role="tool", tool_call_id=call.provider_call_id).count() == 1


@pytest.mark.parametrize("kind", ["expiry", "wake"])
def test_a_pass_with_5_or_20_due_items_grows_by_a_small_constant_per_item(people, idle_worker, kind):
    """Statements per due item: an expiry writes 3 events (each bumping the run's counter), 3 rows and a
    message (10; 38 when each had its own transaction and reads); a wake one event and the run (3; 10)."""
    per_item_bound = {"expiry": 10, "wake": 3}[kind]
    counts, items = {}, []
    for count in (5, 20):
        if kind == "expiry":
            batch = overdue_items(count, people["requester"])
            items += batch
            seqs = {item.pk: Run.objects.get(pk=item.run_id).last_event_seq for item in batch}
        else:
            due_backoffs(count, people["requester"])
        counts[count], found = statements_of_a_pass()
        assert found[{"expiry": "expired", "wake": "woken"}[kind]] == count
        if kind == "expiry":
            for item in batch:
                assert_expired_as_one_at_a_time(item, seqs[item.pk])
    per_item = (counts[20] - counts[5]) / 15
    assert per_item <= per_item_bound, counts
    assert counts[5] - 5 * per_item <= FIXED_BOUND, counts  # reads of the due sets, locks and loads of one batch
    assert set(statements_of_a_pass()[1].values()) == {0}


def test_the_cap_leaves_the_rest_for_the_next_pass_which_finishes_them(people, idle_worker, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "SWEEP_BATCH": 3}
    items = overdue_items(5, people["requester"])
    backoffs = due_backoffs(4, people["requester"])
    first = sweep()
    assert (first["expired"], first["woken"]) == (3, 3)
    statuses = dict(Interrupt.objects.filter(pk__in=[item.pk for item in items]).values_list("pk", "status"))
    assert [statuses[item.pk] for item in items] == ["expired"] * 3 + ["pending"] * 2  # the longest overdue first
    woken = dict(Run.objects.filter(pk__in=[run.pk for run in backoffs]).values_list("pk", "status"))
    assert [woken[run.pk] for run in backoffs] == ["waiting", "running", "running", "running"]  # earliest first
    second = sweep()
    assert (second["expired"], second["woken"]) == (2, 1)
    assert set(Interrupt.objects.filter(pk__in=[item.pk for item in items]).values_list("status", flat=True)) == {
        "expired"}
    assert set(sweep().values()) == {0}


def test_reconciliation_after_the_run_ended_is_capped_per_pass(people, idle_worker, settings):
    """Unknown transfers of ended runs the bank has no record of yet: asked at most SWEEP_BATCH per pass."""
    settings.TOLLGATE = {**settings.TOLLGATE, "SWEEP_BATCH": 2}
    now = timezone.now()
    calls = []
    for number in range(3):
        item = pending_transfer(requester=people["requester"], expires_in=None)
        Run.objects.filter(pk=item.run_id).update(status="failed", waiting_reason="")
        ToolCall.objects.filter(pk=item.tool_call_id).update(
            status="unknown", attempts=1, idempotency_key=f"sweeper-cap-{number}-{item.pk}",
            reconcile_after=now - timedelta(minutes=3 - number))
        calls.append(item.tool_call_id)
    assert reconcile_after_run_end(now=now) == {"reconciled": 2}
    asked_later = dict(ToolCall.objects.filter(pk__in=calls).values_list("pk", "reconcile_after"))
    assert all(asked_later[pk] > now for pk in calls[:2]) and asked_later[calls[2]] <= now  # the longest due first
    assert reconcile_after_run_end(now=now) == {"reconciled": 1}
    assert all(at > now for at in ToolCall.objects.filter(pk__in=calls).values_list("reconcile_after", flat=True))


def test_a_run_with_two_overdue_items_gets_one_expired_and_the_other_cancelled(people, idle_worker):
    """The second item of the run is cancelled by the run's end, as when the items were done one at a time."""
    first = pending_transfer(requester=people["requester"])
    run = first.run
    second_call = ToolCall.objects.create(run=run, step=first.tool_call.step, index=1, provider_call_id="second",
                                          name="fake_transfer", arguments={"account": "globex", "amount": 70},
                                          side_effect=True, status="awaiting_approval")
    second = Interrupt.objects.create(run=run, tool_call=second_call, kind="approval", title="Approve transfer?")
    Interrupt.objects.filter(pk__in=[first.pk, second.pk]).update(expires_at=timezone.now() - timedelta(minutes=1))
    since = Run.objects.get(pk=run.pk).last_event_seq
    assert sweep()["expired"] == 1
    statuses = dict(Interrupt.objects.filter(run=run).values_list("pk", "status"))
    expired = next(pk for pk, status in statuses.items() if status == "expired")
    assert sorted(statuses.values()) == ["cancelled", "expired"]
    log = log_of(run.pk, since)
    assert log[:2] == EXPIRY_EVENTS[:2] and log[-1] == EXPIRY_EVENTS[-1]
    assert ("interrupt", "pending", "cancelled", "run cancelled") in log
    assert ("tool_call", "awaiting_approval", "cancelled", "cancel") in log
    assert Run.objects.get(pk=run.pk).error == f"Inbox item {expired} expired before anyone decided."


def test_events_of_a_batch_reach_the_outbox_with_one_subscription_check_per_transaction(people, idle_worker):
    WebhookSubscription.objects.create(owner=people["admin"], url="https://hooks.example.test/in",
                                       event_types=["run.failed", "interrupt.resolved"], secret="whsec_test")
    items = overdue_items(3, people["requester"])
    OutboxEntry.objects.all().delete()
    with CaptureQueriesContext(connection) as captured:  # the expiry job alone: the webhooks' own job asks too
        assert expire_overdue_approvals(now=timezone.now()) == {"expired": 3}
    asked = [q for q in captured.captured_queries if "webhooks_webhooksubscription" in q["sql"]]
    assert len(asked) == 1  # one transaction held the three expiries
    recorded = set(OutboxEntry.objects.values_list("event__run_id", "event__type"))
    assert recorded == {(item.run_id, kind) for item in items for kind in ("interrupt", "transition")}


def test_a_subscription_check_is_not_reused_after_its_transaction_rolled_back(people, idle_worker):
    run = pending_transfer(requester=people["requester"]).run

    class Undone(Exception):
        pass

    with pytest.raises(Undone), transaction.atomic():
        append_event(run, type="transition", actor="test", from_status="waiting", to_status="failed")  # asks: none
        raise Undone
    WebhookSubscription.objects.create(owner=people["admin"], url="https://hooks.example.test/in",
                                       event_types=["run.failed"], secret="whsec_test")
    with transaction.atomic():
        event = append_event(run, type="transition", actor="test", from_status="waiting", to_status="failed")
    assert OutboxEntry.objects.filter(event=event).exists()


def test_an_approval_past_its_expiry_is_refused_through_the_api_and_then_expired_by_the_sweeper(
        people, idle_worker, api):
    item = overdue_items(1, people["requester"])[0]
    response = api(people["approver"]).post(f"/api/interrupts/{item.pk}/approve/", {"comment": "late"}, format="json")
    error = error_of(response, 409)
    assert error["code"] == "expired" and error["details"]["expires_at"]
    item.refresh_from_db()
    assert (item.status, item.tool_call.status, item.run.status) == ("pending", "awaiting_approval", "waiting")
    since = Run.objects.get(pk=item.run_id).last_event_seq
    assert sweep()["expired"] == 1
    assert_expired_as_one_at_a_time(item, since)


def test_an_approval_past_its_expiry_is_refused_in_the_inbox_form(people, idle_worker, client):
    item = overdue_items(1, people["requester"])[0]
    client.force_login(people["approver"])
    response = client.post(reverse("inbox-item", args=[item.pk]), {"decision": "approved", "comment": "late"})
    assert response.status_code == 409
    assert f"Inbox item {item.pk} expired" in response.content.decode()
    item.refresh_from_db()
    assert (item.status, item.tool_call.status) == ("pending", "awaiting_approval")
    assert sweep()["expired"] == 1
    item.refresh_from_db()
    assert item.status == "expired"


def test_an_approval_before_its_expiry_is_still_accepted(people, idle_worker, api):
    item = pending_transfer(requester=people["requester"], expires_in=timedelta(minutes=1))
    response = api(people["approver"]).post(f"/api/interrupts/{item.pk}/approve/", {}, format="json")
    assert response.status_code == 200, response.json()
    item.refresh_from_db()
    assert (item.status, item.decision, item.tool_call.status) == ("resolved", "approved", "ready")
