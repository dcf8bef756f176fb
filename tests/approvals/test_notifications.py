"""Email notifications (approvals.notifications): new items, claimed items about to expire, expired runs.

Real parts: users and permissions (``people``), the worker
that runs the ``send_notification`` actor, the sweeper, Django's locmem mail
backend.
"""

from datetime import timedelta

import dramatiq
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core import mail
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext

from approvals.claims import claim_interrupt
from approvals.models import Interrupt, NotificationPreference
from approvals.notifications import (_new_item_recipients, _wanting, save_preferences, send_new_item, send_queued,
                                     send_run_expired, warn_claimed_items_expiring)
from runs.access import users_who_may_decide
from runs.engine.lifecycle import start_run
from runs.sweeping import sweep
from runs.base.errors import InvalidInput
from runs.models import Agent, RunStatus
from tests.support.core import pending_transfer, transfer
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


def deciders_of_every_kind(people) -> None:
    """Besides ``people`` (``approver`` through the group, ``admin`` a superuser), users who may decide a
    transfer and want its email: ``chinese`` (in Chinese), ``direct`` (the permission granted to them),
    ``both`` (through the group and granted: one email), ``quiet`` (other kinds turned off); and users who
    get none: ``off`` (new items turned off), ``inactive``, ``no-address``, ``outsider`` (no permission).
    The requester writes in Chinese (a four-eyes item is not theirs)."""
    User = get_user_model()
    approvers = Group.objects.get(name="approvers")
    decide = Permission.objects.get(codename="decide_interrupt", content_type__app_label="approvals")
    users = {name: User.objects.create_user(name, email=f"{name}@example.com")
             for name in ("chinese", "direct", "both", "quiet", "off", "inactive", "no-address", "outsider")}
    for name in ("chinese", "both", "quiet", "off", "inactive", "no-address"):
        users[name].groups.add(approvers)
    for name in ("direct", "both"):
        users[name].user_permissions.add(decide)
    User.objects.filter(username="inactive").update(is_active=False)
    User.objects.filter(username="no-address").update(email="")
    NotificationPreference.objects.create(user=users["chinese"], language="zh-hans")
    NotificationPreference.objects.create(user=users["quiet"], claimed_expiring=False, run_expired=False)
    NotificationPreference.objects.create(user=users["off"], new_item=False, language="zh-hans")
    NotificationPreference.objects.create(user=people["requester"], language="zh-hans")


def new_item_subject(item, language: str) -> str:
    with translation.override(language):
        return gettext("[Tollgate] Waiting for you: %(title)s") % {"title": item.display_title}


def test_a_new_item_goes_once_to_each_decider_with_an_address_who_wants_it_in_their_language(people):
    deciders_of_every_kind(people)
    item = pending_transfer(requester=people["requester"])
    mail.outbox.clear()

    assert send_new_item(item.pk) == 6

    english, chinese = new_item_subject(item, "en"), new_item_subject(item, "zh-hans")
    assert english != chinese
    assert sorted((message.to[0], message.subject) for message in mail.outbox) == [
        ("admin@example.com", english), ("approver@example.com", english), ("both@example.com", english),
        ("chinese@example.com", chinese), ("direct@example.com", english), ("quiet@example.com", english)]
    bodies = {message.to[0]: message.body for message in mail.outbox}
    assert bodies["chinese@example.com"].startswith("有一个新的收件箱事项等待你决定。")
    assert bodies["direct@example.com"].startswith("A new inbox item waits for your decision.")
    assert len(set(bodies.values())) == 2  # one text per language


def test_a_requester_who_holds_the_permission_is_told_only_of_an_item_they_may_decide(people):
    people["requester"].groups.add(Group.objects.get(name="approvers"))
    item = pending_transfer(requester=people["requester"])
    mail.outbox.clear()
    assert send_new_item(item.pk) == 2 and sent_to("requester@example.com") == []  # four eyes

    Interrupt.objects.filter(pk=item.pk).update(allow_requester=True)  # as for a tool whose requester may decide
    mail.outbox.clear()
    assert send_new_item(item.pk) == 3
    assert sorted(message.to[0] for message in mail.outbox) == [
        "admin@example.com", "approver@example.com", "requester@example.com"]

    mail.outbox.clear()
    save_preferences(user=people["requester"], new_item=False, claimed_expiring=True, run_expired=True)
    assert send_new_item(item.pk) == 2 and sent_to("requester@example.com") == []


def test_each_notification_costs_a_fixed_number_of_queries_whatever_its_recipients(
        people, settings, django_assert_max_num_queries):
    """A new item: the item with its run, agent, requester and call (1), its recipients with their
    preferences (1), however many they are and in however many languages (a tool's ``summarize`` hook
    adds its own, once per language: ``fake_transfer`` has none). An expired run: the item, its requester
    (2). An expiry warning: the items due, then per item its mark and its claimer (3 for one)."""
    deciders_of_every_kind(people)
    item = pending_transfer(requester=people["requester"])
    mail.outbox.clear()

    with django_assert_max_num_queries(2):
        assert send_new_item(item.pk) == 6
    with django_assert_max_num_queries(2):
        assert send_run_expired(item.pk) == 1

    claim_interrupt(interrupt=item, user=people["approver"])
    settings.TOLLGATE = {**settings.TOLLGATE, "CLAIM_EXPIRY_WARNING_HOURS": 2}
    with django_assert_max_num_queries(3):
        assert warn_claimed_items_expiring(now=item.expires_at - timedelta(hours=1)) == {"expiry_warnings": 1}


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


def test_a_new_items_email_goes_to_whom_the_orm_names_for_each_kind_of_item_as_permissions_change(people, worker):
    """The recipients' query is compiled once per kind of item (``_new_item_recipients``): each item still
    gets the addresses the ORM's query names for it, whoever gained or lost the permission in between."""
    item = waiting_transfer(people, worker)
    deciders_of_every_kind(people)
    User = get_user_model()
    question = Interrupt(run=item.run, kind="input", title="Which account?", required_permission="")
    own = Interrupt(run=item.run, kind="approval", title="t", required_permission=item.required_permission,
                    allow_requester=True)
    other = Interrupt(run=item.run, kind="approval", title="t", required_permission="auth.add_user")

    def compared():
        for shape in (item, question, own, other):
            assert _new_item_recipients(shape) == _wanting(users_who_may_decide(shape), "new_item")
        return {email for email, _ in _new_item_recipients(item)}

    before = compared()
    User.objects.get(username="outsider").groups.add(Group.objects.get(name="approvers"))
    User.objects.get(username="chinese").groups.clear()
    User.objects.get(username="direct").user_permissions.add(Permission.objects.get(codename="add_user"))
    after = compared()
    assert after - before == {"outsider@example.com"} and before - after == {"chinese@example.com"}


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

    assert send_queued("new_item", item.pk) == 1
    message, = mail.outbox  # a question is its requester's: the approver and the superuser are not told
    assert message.to == ["requester@example.com"]
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
