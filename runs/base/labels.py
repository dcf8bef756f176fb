"""Words the pages show for machine values: statuses, phases, reasons, kinds, roles.

The database, the API and the live WebSocket keep the values themselves
(``waiting``, ``awaiting_approval``, ...); pages show them through
``LABELS``, translated into the page's language (Django's gettext, the
catalogue in ``config/locale``). The models' ``choices`` take their labels
from here too (``choice``), so the admin's columns and filters use the same
words; the API still returns the values.

One value has one word whichever enumeration it comes from (``failed`` is
a run's, a tool call's and a reconciliation's), so templates need not say
which enumeration they show. ``tests/unit/test_page_labels.py`` checks that
every value of the shown enumerations has a label here.
"""

from django.utils.functional import Promise
from django.utils.translation import pgettext_lazy

LABELS = {
    # Run.status
    "queued": pgettext_lazy("state", "queued"),
    "running": pgettext_lazy("state", "running"),
    "waiting": pgettext_lazy("state", "waiting"),
    "completed": pgettext_lazy("state", "completed"),
    "failed": pgettext_lazy("state", "failed"),
    "cancelled": pgettext_lazy("state", "cancelled"),
    # Run.phase
    "preparing_context": pgettext_lazy("state", "preparing context"),
    "calling_model": pgettext_lazy("state", "calling the model"),
    "executing_tools": pgettext_lazy("state", "executing tools"),
    "finalizing": pgettext_lazy("state", "finalizing"),
    # Run.waiting_reason and Interrupt.kind
    "approval": pgettext_lazy("state", "approval"),
    "input": pgettext_lazy("state", "input"),
    "reconciliation": pgettext_lazy("state", "reconciliation"),
    "retry_backoff": pgettext_lazy("state", "retry backoff"),
    "scheduled": pgettext_lazy("state", "scheduled"),
    "external_event": pgettext_lazy("state", "external event"),
    # Run.failure_type
    "model_error": pgettext_lazy("state", "model error"),
    "invalid_model_output": pgettext_lazy("state", "invalid model output"),
    "budget_exhausted": pgettext_lazy("state", "budget exhausted"),
    "deadline_exceeded": pgettext_lazy("state", "deadline exceeded"),
    "approval_expired": pgettext_lazy("state", "approval expired"),
    "incomplete": pgettext_lazy("state", "incomplete"),
    "internal_error": pgettext_lazy("state", "internal error"),
    "crash_loop": pgettext_lazy("state", "crash loop"),
    # Run.outcome
    "achieved": pgettext_lazy("state", "achieved"),
    "not_achieved": pgettext_lazy("state", "not achieved"),
    # Run.death_blame
    "culprit": pgettext_lazy("state", "culprit"),
    "bystander": pgettext_lazy("state", "bystander"),
    "suspect": pgettext_lazy("state", "suspect"),
    "cleared": pgettext_lazy("state", "cleared"),
    # Interrupt.status and Interrupt.decision
    "pending": pgettext_lazy("state", "pending"),
    "resolved": pgettext_lazy("state", "resolved"),
    "expired": pgettext_lazy("state", "expired"),
    "approved": pgettext_lazy("state", "approved"),
    "rejected": pgettext_lazy("state", "rejected"),
    "answered": pgettext_lazy("state", "answered"),
    "succeeded": pgettext_lazy("state", "succeeded"),
    # Step.status
    "started": pgettext_lazy("state", "started"),
    "discarded": pgettext_lazy("state", "discarded"),
    # Wait.status
    "done": pgettext_lazy("state", "done"),
    "timed_out": pgettext_lazy("state", "timed out"),
    "refused": pgettext_lazy("state", "refused"),
    # WebhookDelivery.status and .event_type
    "delivered": pgettext_lazy("state", "delivered"),
    "run.waiting": pgettext_lazy("state", "run waiting"),
    "run.completed": pgettext_lazy("state", "run completed"),
    "run.failed": pgettext_lazy("state", "run failed"),
    "run.cancelled": pgettext_lazy("state", "run cancelled"),
    "interrupt.created": pgettext_lazy("state", "inbox item created"),
    "interrupt.resolved": pgettext_lazy("state", "inbox item resolved"),
    "tool_call.unknown": pgettext_lazy("state", "tool call outcome unknown"),
    # the demo shop's Order.status
    "open": pgettext_lazy("state", "open"),
    # ToolCall.status
    "proposed": pgettext_lazy("state", "proposed"),
    "invalid": pgettext_lazy("state", "invalid"),
    "denied": pgettext_lazy("state", "denied"),
    "awaiting_approval": pgettext_lazy("state", "awaiting approval"),
    "ready": pgettext_lazy("state", "ready"),
    "unknown": pgettext_lazy("state", "unknown"),
    # Message.role
    "user": pgettext_lazy("state", "user"),
    "assistant": pgettext_lazy("state", "assistant"),
    "tool": pgettext_lazy("state", "tool"),
    "system": pgettext_lazy("state", "system"),
}


def choice(value: str) -> tuple[str, Promise]:
    """``(value, its lazy label)``: a member of a model's ``TextChoices``, e.g. ``QUEUED = choice("queued")``.

    Raises ``KeyError`` (at import) for a value without a label here.
    """
    return value, LABELS[value]


def label(value) -> str:
    """The page word for a machine value (``"awaiting_approval"``) in the active language; ``""`` for None and ``""``, the
    value itself without a label.
    """
    if not value:
        return ""
    return str(LABELS.get(value, value))


def labels_in_active_language() -> dict[str, str]:
    """``{value: word}`` for every label, translated now (for the run page's script)."""
    return {value: str(word) for value, word in LABELS.items()}
