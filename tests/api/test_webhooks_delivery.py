"""Webhooks reach a real HTTP endpoint: signed, retried, in order, and nothing lost when a process dies."""

import base64
import hashlib
import hmac
import io
import os
import subprocess
import sys
import time

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.engine.lifecycle import cancel_run, start_run
from runs.models import RunEvent
from runs.webhooks.events import webhook_type
from runs.webhooks.models import DeliveryStatus, OutboxEntry, WebhookDelivery
from runs.webhooks.services import sweep_webhooks
from tests.support.core import transfer, transfer_needing_approval
from tests.support.durability import make_agent
from tests.support.fake_tools import time_out_after_commit
from tests.support.processes import database_url_for_subprocess
from tests.support.webhooks import FAST_SCHEDULE_S, subscribe, wait_settled, wait_until


def test_a_delivery_is_signed_the_standard_webhooks_way_with_the_subscription_secret(
        people, worker, receiver, webhook_settings):
    subscription = subscribe(people["requester"], receiver, "run.waiting")
    run = transfer_needing_approval(people["requester"])
    worker.drain()
    delivery, = wait_settled(subscription, 1)
    request, = receiver.requests

    event = RunEvent.objects.get(run=run, type="transition", to_status="waiting")
    headers, body = request["headers"], request["body"]
    assert headers["webhook-id"] == f"evt_{event.pk}" == delivery.webhook_id
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert headers["content-type"] == "application/json"
    # The reference library verifies it with the secret...
    payload = Webhook(subscription.secret).verify(body, headers)
    # ...and so does the signature computed by hand from the spec: HMAC-SHA256 over "id.timestamp.body".
    key = base64.b64decode(subscription.secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == f"v1,{expected}"
    # Another secret, or a changed body, does not verify.
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + base64.b64encode(b"x" * 32).decode()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(subscription.secret).verify(body.replace(b"approval", b"approvaL"), headers)

    assert payload["type"] == "run.waiting"
    assert payload["data"] == {"run": run.pk, "session": run.session_id, "agent": "wh-transfer",
                               "requested_by": "requester", "seq": event.seq, "status": "waiting",
                               "waiting_reason": "approval"}
    assert (delivery.status, delivery.attempt_count, delivery.last_status_code) == ("delivered", 1, 200)
    assert delivery.last_response == "answered 200"


def test_an_endpoint_answering_500_twice_gets_the_event_on_the_third_attempt(people, worker, receiver,
                                                                              webhook_settings):
    receiver.answer(500, 500)
    subscription = subscribe(people["requester"], receiver, "run.waiting")
    transfer_needing_approval(people["requester"])
    worker.drain()
    delivery, = wait_settled(subscription, 1)

    requests = receiver.requests
    assert len(requests) == 3
    assert len({r["headers"]["webhook-id"] for r in requests}) == 1
    assert len({r["body"] for r in requests}) == 1
    gaps = [later["at"] - earlier["at"] for earlier, later in zip(requests, requests[1:])]
    assert all(gap >= FAST_SCHEDULE_S[0] - 0.05 for gap in gaps), gaps  # the schedule was waited for
    assert (delivery.status, delivery.attempt_count, delivery.last_status_code) == ("delivered", 3, 200)


def test_a_delivery_is_given_up_after_the_schedule_and_the_runs_next_event_then_goes(
        people, worker, receiver, webhook_settings):
    receiver.answer(*[503] * (len(FAST_SCHEDULE_S) + 1))
    subscription = subscribe(people["requester"], receiver, "interrupt.created", "run.waiting")
    run = transfer_needing_approval(people["requester"])
    worker.drain()
    first, second = wait_settled(subscription, 2)

    assert (first.event_type, first.status, first.attempt_count) == ("interrupt.created", "failed", 3)
    assert (first.last_status_code, first.last_response) == (503, "answered 503")
    assert (second.event_type, second.status, second.attempt_count) == ("run.waiting", "delivered", 1)
    types = [body["type"] for body in receiver.bodies()]
    assert types == ["interrupt.created"] * 3 + ["run.waiting"]
    assert all(body["data"]["run"] == run.pk for body in receiver.bodies())


def test_the_events_of_one_run_arrive_in_the_order_they_happened(people, worker, receiver, webhook_settings):
    receiver.answer(500)  # the first event needs a retry; the ones after it must wait for it
    subscription = subscribe(people["requester"], receiver)
    run = transfer_needing_approval(people["requester"])
    worker.drain()
    interrupt = Interrupt.objects.get(run=run)
    decide_interrupt(interrupt=interrupt, user=people["approver"], decision="approved", comment="fine")
    worker.drain()
    run.refresh_from_db()
    assert run.status == "completed"
    deliveries = wait_settled(subscription, 4)

    in_log = [(event.seq, kind) for event in run.events.order_by("seq") if (kind := webhook_type(event))]
    assert [kind for _, kind in in_log] == ["interrupt.created", "run.waiting", "interrupt.resolved",
                                            "run.completed"]
    received = [(body["data"]["seq"], body["type"]) for body in receiver.bodies()]
    assert received == [in_log[0]] + in_log  # the first twice (500, then 200), then each once, in order
    assert all(d.status == DeliveryStatus.DELIVERED for d in deliveries)
    resolved = receiver.bodies()[3]["data"]
    assert (resolved["interrupt"], resolved["status"], resolved["decision"], resolved["tool"]) == (
        interrupt.pk, "resolved", "approved", "fake_transfer")
    completed = receiver.bodies()[4]["data"]
    assert (completed["status"], completed["outcome"]) == ("completed", "achieved")
    assert completed["effects"] == [{"tool_call": interrupt.tool_call_id, "name": "fake_transfer",
                                     "status": "succeeded", "reused": False, "duplicate_of": None}]


def test_events_committed_while_the_broker_lost_every_message_are_sent_by_the_sweeper_pass(
        people, idle_worker, receiver, webhook_settings):
    subscription = subscribe(people["requester"], receiver, "run.cancelled")
    run = start_run(agent=make_agent("wh-lost", [], tools=[]), user=people["requester"], input="x")
    cancel_run(run=run, actor="user:requester")
    assert OutboxEntry.objects.count() == 1  # committed with the event
    idle_worker.broker.flush_all()  # every wake-up lost, as if the broker had died

    idle_worker.worker.start()
    output = io.StringIO()
    call_command("recover_runs", stdout=output)  # one sweeper pass: runs, then webhooks
    assert "webhook_events=1" in output.getvalue()
    delivery, = wait_settled(subscription, 1)
    assert delivery.status == DeliveryStatus.DELIVERED
    assert [body["type"] for body in receiver.bodies()] == ["run.cancelled"]
    assert OutboxEntry.objects.count() == 0


def test_a_worker_killed_while_the_endpoint_holds_the_request_loses_no_event(
        people, idle_worker, receiver, webhook_settings, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "QUEUED_GRACE_S": 0.0}
    subscription = subscribe(people["requester"], receiver, "run.cancelled")
    run = start_run(agent=make_agent("wh-kill", [], tools=[]), user=people["requester"], input="x")
    cancel_run(run=run, actor="user:requester")
    sweep_webhooks()  # fans the event out; the wake-ups it sends are dropped below
    idle_worker.broker.flush_all()
    delivery = WebhookDelivery.objects.get(subscription=subscription)

    # A worker process sends the delivery; the endpoint keeps the request open; the worker is SIGKILLed.
    receiver.hold()
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess(), "DJANGO_SETTINGS_MODULE": "config.settings",
           "TOLLGATE_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1", "TOLLGATE_WEBHOOK_ALLOW_HTTP": "true",
           "TOLLGATE_WEBHOOK_TIMEOUT_S": "2"}
    code = ("import django; django.setup(); from runs.webhooks.actors import deliver_run_events; "
            f"deliver_run_events({subscription.pk}, {run.pk})")
    process = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=settings.BASE_DIR)
    assert receiver.arrived.wait(30), "the worker process never reached the endpoint"
    process.kill()
    assert process.wait(timeout=30) == -9
    receiver.release()

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempt_count) == ("pending", 1)
    assert delivery.claimed_until > timezone.now()  # the dead worker's claim still stands...
    assert sweep_webhooks()["webhook_chains_woken"] == 0  # ...so nobody sends it twice at once
    wait_until(lambda: timezone.now() > delivery.claimed_until, 15, "the claim to expire")

    idle_worker.worker.start()
    assert sweep_webhooks()["webhook_chains_woken"] == 1
    delivery, = wait_settled(subscription, 1)
    assert (delivery.status, delivery.attempt_count, delivery.last_status_code) == ("delivered", 2, 200)
    first, second = receiver.requests  # at least once: the cut-off request and the one that got through
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"] == delivery.webhook_id
    assert first["body"] == second["body"]


def test_a_side_effect_whose_outcome_is_unknown_is_announced(people, worker, receiver, webhook_settings):
    time_out_after_commit()  # the transfer is made, then the tool times out: its outcome is unknown
    subscription = subscribe(people["requester"], receiver, "tool_call.unknown")
    agent = make_agent("wh-unknown", [{"tool_calls": [transfer("acme", 5)]}, {"content": "done"}],
                       tools=["fake_transfer"], check="fake_transfer")
    run = start_run(agent=agent, user=people["requester"], input="Send 5 to acme.")
    worker.drain()
    delivery, = wait_settled(subscription, 1)

    call = run.tool_calls.get(name="fake_transfer")
    body, = receiver.bodies()
    assert body["type"] == "tool_call.unknown"
    assert (body["data"]["tool_call"], body["data"]["tool"]) == (call.pk, "fake_transfer")
    assert delivery.status == DeliveryStatus.DELIVERED


def test_owners_get_only_events_of_runs_they_may_see(people, worker, receiver, webhook_settings):
    outsider = get_user_model().objects.create_user("outsider", password="outsider-password-1")
    own = subscribe(people["requester"], receiver, "run.waiting")
    approvers = subscribe(people["approver"], receiver, "run.waiting")
    outsiders = subscribe(outsider, receiver, "run.waiting")
    transfer_needing_approval(people["requester"])
    worker.drain()
    wait_settled(own, 1)
    wait_settled(approvers, 1)

    assert not WebhookDelivery.objects.filter(subscription=outsiders).exists()
    assert len(receiver.requests) == 2


def test_without_subscriptions_the_event_log_leaves_nothing_behind(people, worker):
    run = transfer_needing_approval(people["requester"])
    worker.drain()
    assert any(webhook_type(event) for event in run.events.all())
    assert OutboxEntry.objects.count() == 0 and WebhookDelivery.objects.count() == 0
