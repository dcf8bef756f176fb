"""Bulk decisions: approve or reject several approval items of one tool, each as its own decision.

Two steps, as in the inbox and the admin: ``plan_bulk`` loads what the
confirmation page lists, each item with its ``fingerprint``; ``decide_bulk``
decides the items the person confirmed, one transaction each, through
``approvals.services.decide_interrupt`` (so each is checked, logged and
audited individually, like a single decision). An item that changed after
the page was shown is skipped, never decided blind: not pending any more,
its run ended or asked to cancel, or its fingerprint differs (the same idea
as an HTTP ``If-Match`` precondition). The result says, per item, decided
or skipped and why.
"""

import hashlib
import json
from dataclasses import dataclass

from django.utils.translation import gettext as _
from django_fsm import ConcurrentTransition, TransitionNotAllowed

from approvals.models import Decision, Interrupt, InterruptKind, InterruptStatus
from approvals.services import decide_interrupt
from config.strict_json import MAX_INT
from runs.base.errors import InvalidInput, TollgateError
from runs.tx import locked

MAX_BULK_ITEMS = 100

# Why an item was skipped (``BulkOutcome.skipped``).
GONE, NOT_PENDING, RUN_ENDED, CHANGED, REFUSED = "gone", "not_pending", "run_ended", "changed", "refused"


def fingerprint(interrupt: Interrupt) -> str:
    """What the confirmation page showed of ``interrupt``, as sha256 hex: id, status, kind, tool and arguments.

    Any change to these between showing and deciding changes the value.
    Needs ``tool_call`` loaded (or loadable).
    """
    call = interrupt.tool_call
    shown = [interrupt.pk, interrupt.status, interrupt.kind, call.name if call else None,
             call.arguments if call else None]
    return hashlib.sha256(json.dumps(shown, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def checked_ids(ids) -> list[int]:
    """The ids as ints, first occurrence kept; ``InvalidInput`` if none, too many or not ids (1 to ``MAX_INT``)."""
    try:
        ordered = list(dict.fromkeys(int(i) for i in ids))
    except (TypeError, ValueError):
        ordered = [0]
    if any(not 1 <= pk <= MAX_INT for pk in ordered):
        raise InvalidInput.for_fields({"items": _("Item ids must be whole numbers from 1 up.")})
    if not ordered:
        raise InvalidInput.for_fields({"items": _("Select at least one item.")})
    if len(ordered) > MAX_BULK_ITEMS:
        raise InvalidInput.for_fields({"items": _("Select at most %(limit)s items at a time.")
                                                % {"limit": MAX_BULK_ITEMS}})
    return ordered


@dataclass
class BulkPlan:
    """What a confirmation page lists: ``items`` (pending approval items ``user`` may decide, one tool,
    in the order asked, each with ``.fingerprint``) and ``left_out`` (``(id, reason)`` of the others)."""

    items: list[Interrupt]
    left_out: list[tuple[int, str]]

    @property
    def tool(self) -> str | None:
        """The one tool of the items (None without items)."""
        return self.items[0].tool_call.name if self.items else None


def plan_bulk(*, user, ids, shown: dict[str, str] | None = None) -> BulkPlan:
    """The items of ``ids`` that ``user`` may decide in bulk now, for a confirmation page.

    ``shown`` (``{item id as a string: fingerprint}``): when the page is shown
    again (to correct the comment), the fingerprints it showed first stay,
    so an item that changed since is still caught.

    Left out, with a reason: items not found or not decidable by ``user``
    (``gone``: the same answer for both, so nothing leaks), not pending,
    not approval items (``refused``). Raises ``InvalidInput`` for bad ids,
    more than ``MAX_BULK_ITEMS``, or items of more than one tool.
    """
    ordered = checked_ids(ids)
    found = {i.pk: i for i in Interrupt.objects.decidable_by(user).filter(pk__in=ordered)
             .select_related("run__agent", "run__requested_by", "tool_call")}
    items, left_out = [], []
    for pk in ordered:
        interrupt = found.get(pk)
        if interrupt is None:
            left_out.append((pk, GONE))
        elif interrupt.status != InterruptStatus.PENDING:
            left_out.append((pk, NOT_PENDING))
        elif interrupt.kind != InterruptKind.APPROVAL or interrupt.tool_call is None:
            left_out.append((pk, REFUSED))
        else:
            interrupt.fingerprint = (shown or {}).get(str(pk)) or fingerprint(interrupt)
            items.append(interrupt)
    _require_one_tool({i.tool_call.name for i in items})
    return BulkPlan(items=items, left_out=left_out)


def _require_one_tool(names: set[str]) -> None:
    """Raise ``InvalidInput`` (field ``items``) when ``names`` holds more than one tool name."""
    if len(names) > 1:
        raise InvalidInput.for_fields({"items": _("Select items of one tool at a time (these are of %(tools)s).")
                                       % {"tools": ", ".join(sorted(names))}})


@dataclass(frozen=True)
class BulkOutcome:
    """One item's result: ``decided`` (True) or ``skipped`` (a reason code of this module) with ``detail``."""

    interrupt_id: int
    decided: bool
    skipped: str = ""
    detail: str = ""


def decide_bulk(*, user, decision: str, comment: str, expected: dict[int, str]) -> list[BulkOutcome]:
    """Decide each item of ``expected`` (``{item id, int or digits: fingerprint shown}``) as ``decision``.

    ``decision`` is ``approved`` or ``rejected``; a rejection needs a
    comment (the model is told it). Each item is decided in its own
    transaction that locks its run and the item, then checks it is still
    what was shown (else skipped, see the module doc) and calls
    ``decide_interrupt``: one item's failure never undoes another's
    decision. Returns one ``BulkOutcome`` per item, in the order given.
    Raises ``InvalidInput`` (bad decision, missing comment, bad ids, items
    of more than one tool: the confirmation page lists one tool's items,
    and a POST naming others is refused whole, as ``plan_bulk`` refuses it).
    """
    if decision not in (Decision.APPROVED, Decision.REJECTED):
        raise InvalidInput.for_fields({"decision": _("Unknown decision %(decision)s.") % {"decision": repr(decision)}})
    comment = (comment or "").strip()
    if decision == Decision.REJECTED and not comment:
        raise InvalidInput.for_fields({"comment": _("Say why: a rejection needs a comment.")})
    ids = checked_ids(expected)
    shown = {int(pk): value for pk, value in expected.items()}
    found = dict(Interrupt.objects.decidable_by(user).filter(pk__in=ids).values_list("pk", "tool_call__name"))
    _require_one_tool({name for name in found.values() if name is not None})
    decidable = set(found)
    outcomes = []
    for pk in ids:
        if pk not in decidable:
            outcomes.append(BulkOutcome(pk, False, GONE))
            continue
        outcomes.append(_decide_one(pk, user=user, decision=decision, comment=comment, shown=shown[pk]))
    return outcomes


def _decide_one(pk: int, *, user, decision: str, comment: str, shown: str) -> BulkOutcome:
    try:
        run_id = Interrupt.objects.values_list("run_id", flat=True).get(pk=pk)
        with locked(run_id) as tx:
            run = tx.run
            interrupt = Interrupt.objects.select_for_update(of=("self",)).select_related("tool_call").get(pk=pk)
            if run.is_terminal or run.cancel_requested_at is not None:  # first: it also cancels the items
                return BulkOutcome(pk, False, RUN_ENDED, run.status)
            if interrupt.status != InterruptStatus.PENDING:
                return BulkOutcome(pk, False, NOT_PENDING, interrupt.status)
            if fingerprint(interrupt) != shown:
                return BulkOutcome(pk, False, CHANGED)
            decide_interrupt(interrupt=interrupt, user=user, decision=decision, comment=comment)
    except Interrupt.DoesNotExist:
        return BulkOutcome(pk, False, GONE)
    except (TransitionNotAllowed, ConcurrentTransition):
        return BulkOutcome(pk, False, NOT_PENDING)
    except TollgateError as exc:
        return BulkOutcome(pk, False, REFUSED, exc.message)
    return BulkOutcome(pk, True)

