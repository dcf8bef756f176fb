"""The ToolCall model and its state machine (docs/design.md#tool-call-status)."""

from django.db import models
from django.utils.translation import gettext_lazy as _
from django_fsm import RETURN_VALUE, FSMField, transition

from config.strict_json import StoredJSONDecoder
from runs.base.fsm import FSMModel
from runs.base.labels import choice


class ToolCallStatus(models.TextChoices):
    PROPOSED = choice("proposed")
    INVALID = choice("invalid")
    DENIED = choice("denied")
    AWAITING_APPROVAL = choice("awaiting_approval")
    READY = choice("ready")
    REJECTED = choice("rejected")
    EXPIRED = choice("expired")
    CANCELLED = choice("cancelled")
    RUNNING = choice("running")
    SUCCEEDED = choice("succeeded")
    FAILED = choice("failed")
    UNKNOWN = choice("unknown")


S = ToolCallStatus

# A call in one of these still owes the model a result.
PENDING_STATUSES = [S.PROPOSED, S.AWAITING_APPROVAL, S.READY, S.RUNNING, S.UNKNOWN]
# Ended without the effect (or the read): the action may be proposed and assessed again.
NO_EFFECT_STATUSES = [S.INVALID, S.DENIED, S.REJECTED, S.EXPIRED, S.CANCELLED, S.FAILED]
# Where a call can end; a duplicate ends where its original ended.
FINAL_STATUSES = [S.INVALID, S.DENIED, S.REJECTED, S.EXPIRED, S.CANCELLED, S.SUCCEEDED, S.FAILED]


def _was_sent(call: "ToolCall") -> bool:
    """Guard: the call may have gone out at least once (``ToolCall.maybe_sent``), so its effect may have happened."""
    return call.maybe_sent


class ToolCall(FSMModel):
    """One tool call the model proposed, from parsing to its outcome.

    ``raw_arguments`` keeps the model's text verbatim; ``arguments`` is the
    parsed object (``None`` when it did not parse) and, after an approver
    edited them, the edited arguments. ``idempotency_key`` is set by the
    ``ready -> running`` transition, before the call leaves the process,
    and derived from the run and the logical action (tool + arguments).
    ``result`` is what the tool returned (JSON); ``error`` why it did not.

    ``action_key`` is the business identity of a side-effecting call as
    proposed (session + tool + canonical arguments, see
    ``tools.services.action_identity``). A call proposed with the key of an
    earlier call that succeeded or is still pending is the same action:
    ``duplicate_of`` points to that original, and the call ends as the
    original ends, without being assessed or executed itself.
    """

    run = models.ForeignKey("runs.Run", verbose_name=_("run"), on_delete=models.CASCADE, related_name="tool_calls")
    step = models.ForeignKey("runs.Step", verbose_name=_("step"), on_delete=models.CASCADE, related_name="tool_calls")
    index = models.PositiveIntegerField(_("index"), help_text=_("Position within the model turn."))
    provider_call_id = models.CharField(_("provider call id"), max_length=100)
    name = models.CharField(_("tool"), max_length=100)
    raw_arguments = models.TextField(_("raw arguments"), blank=True)
    arguments = models.JSONField(_("arguments"), null=True, blank=True, decoder=StoredJSONDecoder)
    status = FSMField(_("status"), default=S.PROPOSED, choices=S.choices, protected=True)
    side_effect = models.BooleanField(_("side effect"), default=False)
    action_key = models.CharField(_("action key"), max_length=64, blank=True)
    target = models.CharField(
        _("target"), max_length=100, blank=True,
        help_text=_("What the call acts on (its tool's target argument, as the target's lock key); empty when "
                    "none. Per-target approval rules count the calls with the same target."))
    duplicate_of = models.ForeignKey("self", verbose_name=_("duplicate of"), null=True, blank=True,
                                     on_delete=models.PROTECT, related_name="duplicates", db_index=False,
                                     help_text=_("The earlier call of the same action."))
    idempotency_key = models.CharField(_("idempotency key"), max_length=80, blank=True, db_index=True)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    unsent_attempts = models.PositiveIntegerField(
        _("unsent attempts"), default=0,
        help_text=_("Attempts that certainly never left (no connection could be made: ToolNotSent)."))
    reconcile_attempts = models.PositiveIntegerField(_("reconcile attempts"), default=0)
    reconcile_after = models.DateTimeField(
        _("reconcile after"), null=True, blank=True, db_index=True,
        help_text=_("For an unknown call of a run that has ended: when the sweeper asks the reconcile hook next."))
    result = models.JSONField(_("result"), null=True, blank=True, decoder=StoredJSONDecoder)
    error = models.TextField(_("error"), blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("tool call")
        verbose_name_plural = _("tool calls")
        ordering = ["run", "id"]
        indexes = [
            # Equality only (a field's db_index would add a LIKE-pattern twin on PostgreSQL, which every
            # insert and status change would write too; the idempotency key keeps its: it is read by prefix).
            models.Index(fields=["status"], name="toolcall_status"),
            models.Index(fields=["action_key"], name="toolcall_action_key"),
            models.Index(fields=["target", "name"], name="toolcall_target"),
            # Only re-proposals have an original: an index of every call's NULL would be the planner's choice
            # for "duplicate_of IS NULL" before the table has statistics (a fresh table growing fast), a
            # scan of every call in the guise of an index scan (docs/benchmark-history.md, 7 December).
            models.Index(fields=["duplicate_of"], name="toolcall_duplicate_of",
                         condition=models.Q(duplicate_of__isnull=False)),
        ]

    def __str__(self):
        return f"{self.name} ({self.status})"

    event_type = "tool_call"

    @property
    def is_pending(self) -> bool:
        return self.status in PENDING_STATUSES

    @property
    def maybe_sent(self) -> bool:
        """Whether an attempt may have left (not every one of them was certainly not sent), so the call may have
        taken effect. The attempt ``running`` now counts as one that may have left."""
        return self.attempts > self.unsent_attempts

    def event_run(self):
        return self.run

    def event_payload(self, arguments: dict) -> dict:
        """``{"tool_call": id, "name": tool}``, the call's ``error`` when it has one, and, once it ended with an
        earlier call's result, ``"reused": true`` and that call's id (``duplicate_of``): not a new effect."""
        payload = {"tool_call": self.pk, "name": self.name}
        if self.error:
            payload["error"] = self.error
        if self.status == ToolCallStatus.SUCCEEDED and self.duplicate_of_id:
            payload.update(reused=True, duplicate_of=self.duplicate_of_id)
        return payload

    # --- transitions (docs/design.md#tool-call-status) -------------------

    @transition(field=status, source=S.PROPOSED, target=S.INVALID)
    def invalidate(self, error: str):
        self.error = error

    @transition(field=status, source=[S.PROPOSED, S.READY], target=S.DENIED)
    def deny(self, error: str):
        """The policy refused: when proposed, or when checked again just before running."""
        self.error = error

    @transition(field=status, source=S.PROPOSED, target=S.AWAITING_APPROVAL)
    def request_approval(self):
        pass

    @transition(field=status, source=[S.PROPOSED, S.AWAITING_APPROVAL], target=S.READY)
    def make_ready(self, arguments=None, action_key: str = "", target: str = ""):
        """Cleared to run; an approver's edited ``arguments`` replace the proposed ones, and with them
        the call's business identity (``action_key``) and its ``target`` (``tools.services.targets.target_key``)."""
        if arguments is not None:
            self.arguments = arguments
            self.target = target
        if action_key:
            self.action_key = action_key

    @transition(field=status, source=S.AWAITING_APPROVAL, target=S.REJECTED)
    def reject(self, error: str):
        self.error = error

    @transition(field=status, source=S.AWAITING_APPROVAL, target=S.EXPIRED)
    def expire(self):
        self.error = "The approval request expired."

    @transition(field=status, source=[S.PROPOSED, S.AWAITING_APPROVAL, S.READY], target=S.CANCELLED)
    def cancel(self, error: str = "Cancelled before it ran."):
        self.error = error

    @transition(field=status, source=S.READY, target=S.RUNNING)
    def begin(self, idempotency_key: str, now):
        self.idempotency_key = idempotency_key
        self.attempts += 1
        self.started_at = now

    @transition(field=status, source=[S.RUNNING, S.UNKNOWN], target=S.READY)
    def requeue(self, error: str, not_sent: bool = False):
        """Send again: only for read-only or idempotent tools (retry, crash recovery), for any call whose
        attempt certainly never left (``not_sent``: counted in ``unsent_attempts``), and, from ``unknown``,
        for an idempotent call the external system shows no trace of (reconciliation)."""
        self.error = error
        if not_sent:
            self.unsent_attempts += 1

    @transition(field=status, source=[S.RUNNING, S.UNKNOWN], target=S.SUCCEEDED)
    def succeed(self, result, now, reused_from: int | None = None):
        """Done: ``result`` is the handler's, or, with ``reused_from``, that of the earlier call of the same
        action (sent under the same idempotency key) whose result answers this one: nothing was sent."""
        self.result = result
        self.error = ""
        self.finished_at = now
        if reused_from is not None:
            self.duplicate_of_id = reused_from

    @transition(field=status, source=[S.RUNNING, S.UNKNOWN], target=S.FAILED)
    def fail(self, error: str, now):
        self.error = error
        self.finished_at = now

    @transition(field=status, source=S.PROPOSED, target=RETURN_VALUE(*FINAL_STATUSES))
    def settle_as_duplicate(self, original: "ToolCall", now):
        """A re-proposal of ``original``'s action ends as ``original`` ended (its result, or its error)."""
        self.duplicate_of = original
        self.result = original.result
        self.error = "" if original.status == S.SUCCEEDED else f"Same action as call #{original.pk}: {original.error}"
        self.finished_at = now
        return original.status

    @transition(field=status, source=[S.RUNNING, S.READY], target=S.UNKNOWN, conditions=[_was_sent])
    def mark_unknown(self, error: str):
        """The effect may have happened: in flight when its worker died, or sent before and now abandoned."""
        self.error = error
