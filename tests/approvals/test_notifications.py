"""Email notifications (approvals.notifications): new items, claimed items about to expire, expired runs.

Real parts: users and permissions (``people``), the worker
that runs the ``send_notification`` actor, the sweeper, Django's locmem mail
backend.
"""

from datetime import timedelta

import dramatiq
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core import mail
from django.urls import reverse

from approvals.claims import claim_interrupt
from approvals.models import Interrupt, NotificationPreference
from approvals.notifications import save_preferences, send_queued
from runs.access import users_who_may_decide
from runs.engine.lifecycle import start_run
from runs.sweeping import sweep
from runs.base.errors import InvalidInput
from runs.models import Agent, RunStatus
from tests.support.core import transfer
from tests.support.durability import make_agent
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_transfer(people, worker):
    """A run drained until its transfer of 80 to acme waits for approval; returns its inbox item."""
    agent = make_agent("transfer-80", [{"tool_calls": [transfer("acme", 80)]}, {"content": "Sent."}],
                       tools=["fake_transfer"], check="fake_transfer")
    run = start_run(agent=agent, user=people["requester"], input="send 80 to acme")
    worker.drain()
    return Interrupt.objects.get(run=run)


def sent_to(address: str) -> list:
    return [message for message in mail.outbox if message.to == [address]]


def test_each_approver_gets_one_email_for_a_new_item_and_the_four_eyes_requester_none(people, worker):
    item = waiting_transfer(people, worker)

    assert sorted(message.to[0] for message in mail.outbox) == ["admin@example.com", "approver@example.com"]
    message = sent_to("approver@example.com")[0]
    assert item.title in message.subject
    assert f"/inbox/{item.pk}/" in message.body and "fake_transfer" in message.body
    assert "requester" in message.body  # who asked, so the approver can judge without opening it
    assert '"amount": 80' in message.body and '"account": "acme"' in message.body
    assert sent_to("requester@example.com") == []  # the transfer is four-eyes: the requester may not decide it



def test_a_message_queued_before_the_actor_moved_to_approvals_is_still_sent(people, worker):
    """The actor left runs.engine.actors for approvals.actors under the same name and queue: a message queued
    by an older process, written here as it wrote it, is consumed and sent."""
    item = waiting_transfer(people, worker)
    mail.outbox.clear()
    dramatiq.get_broker().enqueue(dramatiq.Message(queue_name="default", actor_name="send_notification",
                                                   args=("new_item", item.pk), kwargs={}, options={}))
    worker.drain()
    assert sorted(message.to[0] for message in mail.outbox) == ["admin@example.com", "approver@example.com"]
    assert dramatiq.get_broker().get_actor("send_notification").fn.__module__ == "approvals.actors"

def test_recipients_are_exactly_the_users_who_may_decide(people, worker):
    item = waiting_transfer(people, worker)
    User = get_user_model()
    outsider = User.objects.create_user("outsider", email="outsider@example.com")
    grouped = User.objects.create_user("grouped", email="grouped@example.com")
    grouped.groups.add(Group.objects.get(permissions__codename="decide_interrupt"))
    User.objects.create_user("gone", email="gone@example.com", is_active=False).groups.add(*grouped.groups.all())

    recipients = set(users_who_may_decide(item))

    assert recipients == {user for user in User.objects.all() if Interrupt.objects.decidable_by(user).filter(
        pk=item.pk).exists()}
    assert grouped in recipients and outsider not in recipients and people["requester"] not in recipients


def test_the_requester_is_told_when_an_expired_approval_fails_the_run(people, worker):
    item = waiting_transfer(people, worker)
    mail.outbox.clear()

    assert sweep(now=item.expires_at + timedelta(seconds=1))["expired"] == 1
    worker.drain()

    item.run.refresh_from_db()
    assert item.run.status == RunStatus.FAILED
    [message] = mail.outbox
    assert message.to == ["requester@example.com"]
    assert f"Run {item.run_id} failed" in message.subject and f"/runs/{item.run_id}/" in message.body

    NotificationPreference.objects.create(user=people["requester"], run_expired=False)
    mail.outbox.clear()
    assert send_queued("run_expired", item.pk) == 0 and mail.outbox == []


def test_the_claimer_is_warned_once_before_a_claimed_item_expires(people, worker, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "CLAIM_EXPIRY_WARNING_HOURS": 2}
    item = waiting_transfer(people, worker)
    claim_interrupt(interrupt=item, user=people["approver"])
    mail.outbox.clear()

    sweep(now=item.expires_at - timedelta(hours=3))  # not yet in the window
    assert mail.outbox == []
    sweep(now=item.expires_at - timedelta(hours=1))
    sweep(now=item.expires_at - timedelta(minutes=30))  # a second pass, and a second sweeper, send nothing more

    [message] = mail.outbox
    assert message.to == ["approver@example.com"] and "Expiring soon" in message.subject
    assert "60 minutes" in message.body
    item.refresh_from_db()
    assert item.expiry_warning_sent_at is not None


def test_a_failing_mail_server_never_breaks_the_run(people, worker, settings, caplog):
    # The real SMTP backend, pointed at a port where nothing listens: the connection is refused.
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", free_port(), 5
    item = waiting_transfer(people, worker)

    item.run.refresh_from_db()
    assert item.run.status == RunStatus.WAITING
    assert mail.outbox == []
    assert "new item" in caplog.text and "failed" in caplog.text


def test_preferences_are_saved_by_the_service_one_row_per_user_and_a_bad_language_stores_nothing(client, people):
    approver = people["approver"]
    first = save_preferences(user=approver, new_item=False, claimed_expiring=True, run_expired=True, language="zh-hans")
    again = save_preferences(user=approver, new_item=True, claimed_expiring=False, run_expired=True, language="")
    assert first.pk == again.pk and NotificationPreference.objects.filter(user=approver).count() == 1
    stored = NotificationPreference.objects.get(user=approver)
    assert (stored.new_item, stored.claimed_expiring, stored.run_expired, stored.language) == (True, False, True, "")

    with pytest.raises(InvalidInput) as refused:
        save_preferences(user=people["admin"], new_item=False, claimed_expiring=False, run_expired=False, language="xx")
    assert "language" in refused.value.details
    assert not NotificationPreference.objects.filter(user=people["admin"]).exists()

    client.force_login(people["admin"])  # the page stores through the service
    page = client.post(reverse("notification-preferences"), {"claimed_expiring": "on", "language": "zh-hans"})
    assert page.status_code == 302 and page.url.endswith("?saved=1")
    stored = NotificationPreference.objects.get(user=people["admin"])
    assert (stored.new_item, stored.claimed_expiring, stored.run_expired, stored.language) == (False, True, False,
                                                                                                "zh-hans")
    assert client.post(reverse("notification-preferences"), {"language": "xx"}).status_code == 400
    assert NotificationPreference.objects.get(user=people["admin"]).language == "zh-hans"


def test_a_question_title_with_line_breaks_still_reaches_its_recipient_on_one_subject_line(people, worker):
    question = "Which order?\nBcc: all@example.com\x1c\v\f\u2028really?"
    agent = Agent.objects.create(slug="asks-oddly", name="Asks", instructions="Ask.", tools=["ask_user"],
                                 completion_check="default", model={"provider": "scripted", "turns": [
                                     {"tool_calls": [{"name": "ask_user", "arguments": {"question": question}}]},
                                     {"content": "Thanks."}]})
    run = start_run(agent=agent, user=people["requester"], input="Help me.")
    worker.drain()
    item = Interrupt.objects.get(run=run)
    mail.outbox.clear()

    assert send_queued("new_item", item.pk) >= 1
    message, = sent_to("requester@example.com")
    subject = message.message()["Subject"]  # rendered as the mail library sends it
    assert "\n" not in subject and "\r" not in subject and "Which order? Bcc: all@example.com really?" in subject
    assert message.message()["Bcc"] is None


def test_one_message_the_mail_library_refuses_does_not_stop_the_others(people, worker, caplog):
    broken = get_user_model().objects.create_user("broken", email="broken@example.com\nBcc: all@example.com")
    broken.groups.add(Group.objects.get(permissions__codename="decide_interrupt"))
    item = waiting_transfer(people, worker)
    mail.outbox.clear()

    assert send_queued("new_item", item.pk) == 2
    assert sorted(message.to[0] for message in mail.outbox) == ["admin@example.com", "approver@example.com"]
    assert "was refused" in caplog.text
