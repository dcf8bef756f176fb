"""Email notifications in the approver's language, with the demo refund tool's title translated
(``tools.demo.summaries``); the notifications themselves: tests/approvals/test_notifications.py."""

import pytest
from django.core import mail

from approvals.models import Interrupt, NotificationPreference
from runs.engine.lifecycle import start_run
from runs.models import Agent

pytestmark = pytest.mark.django_db(transaction=True)


def sent_to(address: str) -> list:
    return [message for message in mail.outbox if message.to == [address]]


def waiting_refund(demo, worker):
    """A demo refund run drained until its refund waits for approval; returns its inbox item."""
    run = start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"], input="refund 123")
    worker.drain()
    return Interrupt.objects.get(run=run)


def test_preferences_off_means_no_email_and_language_follows_the_preference(demo, worker):
    NotificationPreference.objects.create(user=demo["admin"], new_item=False)
    NotificationPreference.objects.create(user=demo["approver"], language="zh-hans")

    item = waiting_refund(demo, worker)

    assert sent_to("admin@example.com") == []
    [message] = sent_to("approver@example.com")
    assert message.subject.startswith("[Tollgate] 等待你处理") and message.subject.endswith("订单 123 退款 80.00")
    assert item.title == "Refund 80.00 on order 123"  # stored in English; the email names it in Chinese


def test_one_item_goes_to_each_approver_in_their_own_language(demo, worker):
    NotificationPreference.objects.create(user=demo["approver"], language="zh-hans")

    waiting_refund(demo, worker)

    [chinese] = sent_to("approver@example.com")
    [english] = sent_to("admin@example.com")
    assert chinese.subject.startswith("[Tollgate] 等待你处理") and "订单 123" in chinese.body
    assert english.subject == "[Tollgate] Waiting for you: Refund 80.00 on order 123"
    assert "order 123" in english.body and "订单" not in english.body
