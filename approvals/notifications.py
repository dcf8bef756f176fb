"""Emails about inbox items (docs/design.md#notifications), through Django's mail API.

Three kinds, each one a ``NotificationPreference`` flag (on for a user
without a row):

* ``new_item``: an item arrived that the user may decide (its recipients are
  ``runs.access.users_who_may_decide``: never the requester of a four-eyes
  item). One connection carries the messages to all of them.
* ``claimed_expiring``: an item the user claimed expires within
  ``TOLLGATE["CLAIM_EXPIRY_WARNING_HOURS"]``; the sweeper asks
  (``warn_claimed_items_expiring``), and ``Interrupt.expiry_warning_sent_at``
  makes it once per claim, even with two sweepers.
* ``run_expired``: an approval expired and failed the run; to its requester.

``new_item`` and ``run_expired`` are queued when the caller's transaction commits
(``transaction.on_commit``: never for work rolled back) as a message to
the ``send_notification`` actor (``approvals.actors``), so the worker
that opened the item or the sweeper that failed the run spends no query
and no time on mail, and never sends while a run's row lock is held. A
failure to queue or to send is logged and swallowed: it never breaks a run. Each
message is written in its recipient's language (``NotificationPreference.language``).

An email costs two queries however many recipients it has: the item with
what it shows (``_item``, ``_items``), and its recipients with their preferences
(``_wanting``); describing the call may add a tool's ``summarize`` hook's,
once per language among them (tests/approvals/test_notifications.py caps it).
"""

import json
import logging
import unicodedata
from datetime import timedelta

import dramatiq
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.urls import reverse
from django.utils import translation
from django.utils.text import Truncator
from django.utils.translation import gettext as _

from approvals.models import Interrupt, InterruptKind, InterruptStatus, NotificationPreference
from runs.access import deciders
from runs.base import selects
from runs.base.query_templates import QueryTemplate
from runs.base.errors import InvalidInput
from runs.base.masking import mask_credentials
from config.strict_json import printable
from runs.wakeups import ADVANCE_QUEUE
from tools.services.summary import describe

log = logging.getLogger(__name__)

NEW_ITEM, CLAIMED_EXPIRING, RUN_EXPIRED = "new_item", "claimed_expiring", "run_expired"
NOTIFY_ACTOR = "send_notification"  # declared by approvals.actors
NOTIFY_QUEUE = ADVANCE_QUEUE
# An email shows this much of a call's arguments (credentials masked): the item page has them all.
MAX_ARGUMENT_CHARS = 500
MAX_SUBJECT_CHARS = 200


def _wanting(users, kind: str) -> list[tuple[str, str]]:
    """``(email, language)`` of each of ``users`` (a ``User`` queryset) with an email address who did not turn
    ``kind`` off, in one query: their ``NotificationPreference`` comes by a left join (no row: all on, and
    ``LANGUAGE_CODE``)."""
    return _addresses(_wanting_rows(users, kind))


def _wanting_rows(users, kind: str):
    """``_wanting``'s query: ``(email, wanted, language)`` rows (a ``values_list`` queryset)."""
    return users.exclude(email="").values_list(
        "email", f"notification_preference__{kind}", "notification_preference__language")


def _addresses(rows) -> list[tuple[str, str]]:
    return [(email, language or settings.LANGUAGE_CODE) for email, wanted, language in rows if wanted is None or wanted]


# The new item e-mail's recipients (``_wanting`` of ``runs.access.deciders``), compiled once per kind of item:
# one e-mail per inbox item made that query the worker's costliest to build.
_NEW_ITEM_RECIPIENTS = QueryTemplate(
    lambda *, key, app_label, codename, requester: _wanting_rows(
        deciders(question=key[0], allow_requester=key[1], app_label=app_label, codename=codename,
                 requester=requester), NEW_ITEM),
    app_label=str, codename=str, requester=int)


def _new_item_recipients(interrupt: Interrupt) -> list[tuple[str, str]]:
    """``_wanting(users_who_may_decide(interrupt), NEW_ITEM)``, its SQL built once per kind of item."""
    app_label, _, codename = interrupt.required_permission.partition(".")
    return _addresses(_NEW_ITEM_RECIPIENTS.rows((interrupt.kind == InterruptKind.INPUT, interrupt.allow_requester),
                                                app_label=app_label, codename=codename,
                                                requester=interrupt.run.requested_by_id))


# The rows an email about one item shows (``_item_text``) and whom it goes to: its run's agent (its slug),
# requester (their name) and tool call (name and arguments).
_SHOWN = ("run", "run__agent", "run__requested_by", "tool_call")


def _item(interrupt_id: int) -> Interrupt:
    """Item ``interrupt_id`` with the rows of ``_SHOWN``, in one statement (``runs.base.selects``: no queryset
    built; raises ``Interrupt.DoesNotExist``)."""
    return selects.select_one(Interrupt, {"pk": interrupt_id}, related=_SHOWN)


def _items():
    """Inbox items with the rows of ``_SHOWN``, in one query; only the columns an email shows (a run's and a
    call's state too: a state machine reads it when it is built)."""
    return Interrupt.objects.select_related(*_SHOWN).only(
        "run__status", "run__agent__slug", f"run__requested_by__{get_user_model().USERNAME_FIELD}",
        "tool_call__status", "tool_call__name", "tool_call__arguments",
        "kind", "status", "title", "required_permission", "allow_requester", "expires_at", "claimed_by")


def _link(name: str, *args) -> str:
    return settings.TOLLGATE["SITE_URL"].rstrip("/") + reverse(name, args=args)


def _messages(recipients, write) -> list[EmailMessage]:
    """One email to each of ``recipients`` (``_wanting``'s): ``write()`` returns ``(subject, body)`` and is
    called once per language among them, in that language (an item's text is the same for all who read
    it in one language: describing its call may ask the database or a tool's hook).

    Subject and body hold text a model chose (an item's title, arguments):
    the subject is made one clean line (``header_line``) and the body
    printable, so no stored text can make the mail library refuse it.
    """
    texts: dict[str, tuple[str, str]] = {}
    messages = []
    for email, language in recipients:
        if language not in texts:
            with translation.override(language):
                subject, body = write()
            texts[language] = (header_line(subject), printable(body))
        subject, body = texts[language]
        messages.append(EmailMessage(subject=subject, body=body, to=[email]))
    return messages


def header_line(text: str) -> str:
    """``text`` as one line fit for a mail header: every control character, line or paragraph separator
    becomes a space (runs of them one), a lone surrogate U+FFFD, and at most ``MAX_SUBJECT_CHARS`` are kept."""
    cleaned = "".join(" " if unicodedata.category(char) in ("Cc", "Zl", "Zp") else char
                      for char in printable(text))
    return Truncator(" ".join(cleaned.split())).chars(MAX_SUBJECT_CHARS)


def _send(messages: list[EmailMessage], what: str) -> int:
    """Send ``messages`` over one connection, each on its own; returns how many went.

    A message the mail library or server refuses is logged and skipped:
    the others still go. Errors are logged, never raised.
    """
    if not messages:
        return 0
    sent = 0
    try:
        with get_connection() as connection:
            for message in messages:
                try:
                    sent += connection.send_messages([message]) or 0
                except Exception:
                    log.exception("an email about %s to one of %s recipients was refused", what, len(messages))
    except Exception:  # opening or closing the connection
        log.exception("sending %s email(s) about %s failed", len(messages), what)
    return sent


def _item_text(interrupt: Interrupt) -> str:
    call = interrupt.tool_call
    lines = [interrupt.display_title,
             _("Run %(run)s of agent %(agent)s, requested by %(requester)s.") % {
                 "run": interrupt.run_id, "agent": interrupt.run.agent.slug,
                 "requester": interrupt.run.requested_by.get_username()}]
    if call is not None:
        lines.append(describe(call).text)
        arguments = json.dumps(mask_credentials(call.arguments), ensure_ascii=False, sort_keys=True)
        lines.append(_("Tool: %(tool)s; arguments: %(arguments)s") % {
            "tool": call.name, "arguments": Truncator(arguments).chars(MAX_ARGUMENT_CHARS)})
    lines.append(_link("inbox-item", interrupt.pk))
    return "\n".join(lines)


def send_new_item(interrupt_id: int) -> int:
    """Tell each user who may decide item ``interrupt_id`` (and wants it) that it arrived; returns emails sent."""
    interrupt = _item(interrupt_id)
    if interrupt.status != InterruptStatus.PENDING:
        return 0

    def write():
        return (_("[Tollgate] Waiting for you: %(title)s") % {"title": interrupt.display_title},
                _("A new inbox item waits for your decision.") + "\n\n" + _item_text(interrupt))

    recipients = _new_item_recipients(interrupt)
    return _send(_messages(recipients, write), f"new item {interrupt_id}")


def new_item_on_commit(interrupt: Interrupt) -> None:
    """Queue ``send_new_item`` for ``interrupt`` once the current transaction commits."""
    _queue_on_commit(NEW_ITEM, interrupt.pk)


def send_run_expired(interrupt_id: int) -> int:
    """Tell the requester of item ``interrupt_id``'s run that its expiry failed the run; returns emails sent."""
    interrupt = _item(interrupt_id)
    requester = get_user_model().objects.filter(pk=interrupt.run.requested_by_id, is_active=True)

    def write():
        return (_("[Tollgate] Run %(run)s failed: its approval expired") % {"run": interrupt.run_id},
                _("Nobody decided this item before it expired, so the run failed.") + "\n\n"
                + _item_text(interrupt) + "\n" + _link("run-detail", interrupt.run_id))

    return _send(_messages(_wanting(requester, RUN_EXPIRED), write), f"expired item {interrupt_id}")


def run_expired_on_commit(interrupt_id: int) -> None:
    """Queue ``send_run_expired`` once the current transaction (the one failing the run) commits."""
    _queue_on_commit(RUN_EXPIRED, interrupt_id)


def warn_claimed_items_expiring(*, now) -> dict[str, int]:
    """Email each claimer of a pending item expiring within the warning window, once; ``{"expiry_warnings": sent}``.

    A sweep job (``runs.sweeping``), registered by ``approvals.apps``.

    The window is ``TOLLGATE["CLAIM_EXPIRY_WARNING_HOURS"]`` before
    ``expires_at``. Each item is marked (``expiry_warning_sent_at``, a
    conditional UPDATE) before its mail goes, so concurrent sweepers send it
    once; a mail that fails is logged and not retried.
    """
    window = timedelta(hours=settings.TOLLGATE["CLAIM_EXPIRY_WARNING_HOURS"])
    due = _items().filter(status=InterruptStatus.PENDING, claimed_by__isnull=False,
                          expiry_warning_sent_at__isnull=True, expires_at__gt=now, expires_at__lte=now + window)
    sent = 0
    for interrupt in due:
        if not Interrupt.objects.filter(pk=interrupt.pk, expiry_warning_sent_at__isnull=True).update(
                expiry_warning_sent_at=now):
            continue  # another sweeper took it

        def write(interrupt=interrupt):
            left = interrupt.expires_at - now
            return (_("[Tollgate] Expiring soon: %(title)s") % {"title": interrupt.display_title},
                    _("An item you claimed expires in %(minutes)d minutes; if nobody decides it, its run fails.")
                    % {"minutes": left.total_seconds() // 60} + "\n\n" + _item_text(interrupt))

        claimer = get_user_model().objects.filter(pk=interrupt.claimed_by_id, is_active=True)
        sent += _send(_messages(_wanting(claimer, CLAIMED_EXPIRING), write),
                      f"claimed item {interrupt.pk}")
    return {"expiry_warnings": sent}


def _queue_on_commit(kind: str, interrupt_id: int) -> None:
    def queue():
        broker = dramatiq.get_broker()
        broker.declare_queue(NOTIFY_QUEUE)  # idempotent; a process that declared no actor may still send
        broker.enqueue(dramatiq.Message(queue_name=NOTIFY_QUEUE, actor_name=NOTIFY_ACTOR,
                                        args=(kind, interrupt_id), kwargs={}, options={}))

    transaction.on_commit(queue, robust=True)  # a broker that is down is logged, never raised


def send_queued(kind: str, interrupt_id: int) -> int:
    """Send one queued notification (the actor's work): ``kind`` ``new_item`` or ``run_expired``; returns emails sent.

    Any error (a query, a template, the mail server) is logged, never raised.
    """
    senders = {NEW_ITEM: send_new_item, RUN_EXPIRED: send_run_expired}
    try:
        return senders[kind](interrupt_id)
    except Exception:
        log.exception("notification %s for item %s failed", kind, interrupt_id)
        return 0


def preferences_of(user) -> NotificationPreference:
    """``user``'s preferences (unsaved defaults, all on, if they never set them)."""
    return NotificationPreference.objects.filter(user=user).first() or NotificationPreference(user=user)



def save_preferences(*, user, new_item: bool, claimed_expiring: bool, run_expired: bool,
                     language: str = "") -> NotificationPreference:
    """Store which emails ``user`` wants (``NotificationPreference``'s flags) and their ``language``; returns the row.

    ``language``: "" (``LANGUAGE_CODE``) or a code of ``settings.LANGUAGES``, else ``InvalidInput`` (field ``language``).
    """
    if language and language not in dict(settings.LANGUAGES):
        raise InvalidInput.for_fields({"language": f"Unknown language {language!r}."})
    preference, _created = NotificationPreference.objects.update_or_create(user=user, defaults={
        "new_item": bool(new_item), "claimed_expiring": bool(claimed_expiring), "run_expired": bool(run_expired),
        "language": language})
    return preference
