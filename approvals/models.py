"""The inbox: one model of pending human work (docs/design.md#inbox-item-status)."""

import uuid

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils.text import Truncator
from django.utils.translation import gettext, gettext_lazy as _
from django_fsm import FSMField, transition

from config.strict_json import StoredJSONDecoder
from runs.access import InterruptQuerySet
from runs.base.fsm import FSMModel
from runs.base.labels import choice
from tools.services.edits import argument_changes, proposed_arguments
from tools.services.summary import title_of


class InterruptKind(models.TextChoices):
    APPROVAL = choice("approval")
    INPUT = choice("input")
    RECONCILIATION = choice("reconciliation")


class InterruptStatus(models.TextChoices):
    PENDING = choice("pending")
    RESOLVED = choice("resolved")
    EXPIRED = choice("expired")
    CANCELLED = choice("cancelled")


class Decision(models.TextChoices):
    APPROVED = choice("approved")
    REJECTED = choice("rejected")
    ANSWERED = choice("answered")
    SUCCEEDED = choice("succeeded")
    FAILED = choice("failed")


TITLE_CHARS = 300  # Interrupt.title's length


def item_title(kind: str, tool_call, stored: str = "") -> str:
    """The title of an inbox item of ``kind`` about ``tool_call``, in the active language; at most 300 characters, no query.

    Approvals read as their call (``tools.services.summary.title_of``), reconciliations as "Outcome unknown: " and it;
    questions and items without a call (or non-object arguments) keep ``stored`` (docs/design.md#surfaces).
    """
    if kind == InterruptKind.INPUT or tool_call is None or not isinstance(tool_call.arguments, dict):
        return stored
    title = title_of(tool_call)
    if kind == InterruptKind.RECONCILIATION:
        title = gettext("Outcome unknown: %(call)s") % {"call": title}
    return Truncator(title).chars(TITLE_CHARS)


class Interrupt(FSMModel):
    """An inbox item: a run is waiting for a person.

    ``required_permission`` is the Django permission (``app_label.codename``)
    a user needs to resolve it; ``allow_requester`` says whether the run's
    own requester may resolve it. ``edited_arguments`` holds arguments an
    approver changed before approving (``argument_changes``: what changed;
    the tool call's ``arguments`` then hold them too). ``rule`` is the
    approval rule that fired (e.g. ``"amount > 50"``; empty for other kinds and for items
    opened before it was recorded). ``target`` groups pending items acting
    on the same thing (``tools.services.summary.target_of``: tool name and
    target value; empty when the tool names no target). Only
    ``approvals.services`` changes ``status``; text produced by the model
    never does. ``title`` is stored in English when the item is opened (the
    API's and the search's); pages, emails and the admin show
    ``display_title``, built from the call in the reader's language.
    """

    run = models.ForeignKey("runs.Run", verbose_name=_("run"), on_delete=models.CASCADE, related_name="interrupts")
    tool_call = models.ForeignKey(
        "tools.ToolCall", verbose_name=_("tool call"), null=True, blank=True, on_delete=models.CASCADE,
        related_name="interrupts",
    )
    kind = models.CharField(_("kind"), max_length=32, choices=InterruptKind.choices)
    status = FSMField(_("status"), default=InterruptStatus.PENDING, choices=InterruptStatus.choices, protected=True,
                      db_index=True)
    title = models.CharField(_("title"), max_length=TITLE_CHARS)
    required_permission = models.CharField(_("required permission"), max_length=200,
                                           default="approvals.decide_interrupt")
    allow_requester = models.BooleanField(_("allow requester"), default=True)
    decision = models.CharField(_("decision"), max_length=16, choices=Decision.choices, blank=True)
    comment = models.TextField(_("comment"), blank=True)
    edited_arguments = models.JSONField(_("edited arguments"), null=True, blank=True, decoder=StoredJSONDecoder)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, verbose_name=_("resolved by"), null=True, blank=True, on_delete=models.PROTECT,
        related_name="resolved_interrupts",
    )
    resolved_at = models.DateTimeField(_("resolved at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    rule = models.TextField(_("rule"), blank=True)
    target = models.CharField(_("target"), max_length=200, blank=True)
    # Who said they are handling it (approvals.claims): it informs, it does not stop others deciding.
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, verbose_name=_("claimed by"), null=True, blank=True, on_delete=models.SET_NULL,
        related_name="claimed_interrupts",
    )
    claimed_at = models.DateTimeField(_("claimed at"), null=True, blank=True)
    # When the claimer was told it is about to expire (approvals.notifications): sent once per claim.
    expiry_warning_sent_at = models.DateTimeField(_("expiry warning sent at"), null=True, blank=True)

    objects = InterruptQuerySet.as_manager()  # decidable_by / visible_to (runs.access)

    class Meta:
        verbose_name = _("inbox item")
        verbose_name_plural = _("inbox items")
        ordering = ["-created_at"]
        permissions = [("decide_interrupt", "Can approve, reject, answer or reconcile inbox items")]
        # The API list's order (created_at, id) with and without its status
        # filter (the inbox's "oldest"/"newest" pages read the latter), the
        # sweeper's look for pending items past their expiry (only rows with
        # an expiry, only while pending), the inbox's "expiring soonest" pages
        # (pending by expires_at then id, those that never expire included:
        # approvals.selectors), its related-item cues (pending by target) and
        # the history page (approvals.selectors.decided_items): newest
        # decisions, all or one person's.
        indexes = [
            models.Index(fields=["created_at", "id"], name="interrupt_created"),
            models.Index(fields=["status", "created_at", "id"], name="interrupt_status_created"),
            models.Index(fields=["expires_at"], name="interrupt_pending_expiry",
                         condition=models.Q(status="pending", expires_at__isnull=False)),
            models.Index(fields=["expires_at", "id"], condition=models.Q(status="pending"),
                         name="interrupt_inbox_expiry"),
            models.Index(fields=["target"], condition=models.Q(status="pending") & ~models.Q(target=""),
                         name="interrupt_pending_target"),
            # the questions waiting for their requester (the navigation's counts of a user who decides no
            # approvals): without it PostgreSQL walks every pending approval to find them
            models.Index(fields=["run"], condition=models.Q(status="pending", kind="input"),
                         name="interrupt_pending_input"),
            models.Index(fields=["status", "-resolved_at", "-id"], name="interrupt_status_resolved"),
            models.Index(fields=["resolved_by", "-resolved_at", "-id"], name="interrupt_resolver_resolved"),
            # the sweeper's look for claimed items about to expire (approvals.notifications)
            models.Index(fields=["expires_at"], name="interrupt_claimed_expiry",
                         condition=models.Q(status="pending", claimed_by__isnull=False,
                                            expiry_warning_sent_at__isnull=True)),
        ]

    event_type = "interrupt"

    def __str__(self):
        return f"{self.kind} #{self.pk} ({self.status})"

    @property
    def display_title(self) -> str:
        """The title a person reads, in the active language (``item_title``); the stored one for questions
        and for items without a call. Load ``tool_call`` with the item (``select_related``) in lists."""
        return item_title(self.kind, self.tool_call, self.title)

    def get_absolute_url(self) -> str:
        """The item's page in the inbox on the site."""
        return reverse("inbox-item", args=[self.pk])

    def event_run(self):
        return self.run

    def event_payload(self, arguments: dict) -> dict:
        """The item as the log shows it: id, kind, decision, comment and whether the requester may decide."""
        return {"interrupt": self.pk, "kind": self.kind, "decision": self.decision, "comment": self.comment,
                "allow_requester": self.allow_requester}

    def proposed_arguments(self) -> dict | None:
        """The arguments the model proposed for the item's call (None without a call or parsable arguments)."""
        return proposed_arguments(self.tool_call) if self.tool_call is not None else None

    def argument_changes(self) -> list[dict]:
        """What the approver changed, per leaf (``tools.services.edits.argument_changes``); [] if nothing."""
        if self.edited_arguments is None or self.tool_call is None:
            return []
        return argument_changes(self.proposed_arguments(), self.edited_arguments)

    @transition(field=status, source=InterruptStatus.PENDING, target=InterruptStatus.RESOLVED)
    def resolve(self, *, decision: str, user, comment: str, edited_arguments, now):
        self.decision = decision
        self.resolved_by = user
        self.comment = comment
        self.edited_arguments = edited_arguments
        self.resolved_at = now

    @transition(field=status, source=InterruptStatus.PENDING, target=InterruptStatus.EXPIRED)
    def expire(self, *, now):
        self.resolved_at = now

    @transition(field=status, source=InterruptStatus.PENDING, target=InterruptStatus.CANCELLED)
    def cancel(self, *, now):
        self.resolved_at = now


def _answer_file_path(answer_file: "AnswerFile", filename: str) -> str:
    """Where the storage keeps an answer file: ``answers/<run id>/<random>``; the sender's name is never a path."""
    return f"answers/{answer_file.interrupt.run_id}/{uuid.uuid4().hex}"


class AnswerFile(models.Model):
    """A file a person answered a question (an ``input`` item) with, kept through Django's storage API.

    ``name`` is the file name as sent (no folders), ``content_type`` the
    type decided from the bytes (``approvals.answer_files``), ``size`` in
    bytes, ``sha256`` hex of the content. Written once by
    ``approvals.services.answer_interrupt``; downloaded only by users who
    may see the run.
    """

    interrupt = models.OneToOneField(Interrupt, verbose_name=_("inbox item"), on_delete=models.CASCADE,
                                     related_name="answer_file")
    file = models.FileField(_("file"), upload_to=_answer_file_path, max_length=300)
    name = models.CharField(_("name"), max_length=255)
    content_type = models.CharField(_("content type"), max_length=100)
    size = models.PositiveBigIntegerField(_("size (bytes)"))
    sha256 = models.CharField(_("SHA-256"), max_length=64)
    uploaded_by = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("uploaded by"), on_delete=models.PROTECT,
                                    related_name="+")
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("answer file")
        verbose_name_plural = _("answer files")

    def __str__(self):
        return f"{self.name} ({self.size} bytes) answering item {self.interrupt_id}"


class NotificationPreference(models.Model):
    """Which emails a user wants (``approvals.notifications``); a user without a row gets all of them.

    ``language``: the language of their emails (a code of ``settings.LANGUAGES``;
    blank: ``settings.LANGUAGE_CODE``).
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, verbose_name=_("user"), on_delete=models.CASCADE,
                                related_name="notification_preference")
    new_item = models.BooleanField(_("an item for me arrives"), default=True)
    claimed_expiring = models.BooleanField(_("an item I claimed is about to expire"), default=True)
    run_expired = models.BooleanField(_("my run failed because its approval expired"), default=True)
    language = models.CharField(_("language of my emails"), max_length=16, blank=True, choices=settings.LANGUAGES)

    class Meta:
        verbose_name = _("notification preference")
        verbose_name_plural = _("notification preferences")

    def __str__(self):
        return f"notification preferences of {self.user}"
