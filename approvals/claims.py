"""Claims: a person says they are handling an inbox item ("being handled by X").

A claim informs; it does not lock: anyone who may decide the item still
can (``approvals.services.decide_interrupt`` ignores claims). Only someone
who may decide a pending item may claim it, and one person holds a claim
at a time: claiming an item another person holds is a ``Conflict`` (409)
until they unclaim it (staff may unclaim anyone's). Claims and unclaims are
written to the run's event log. The claimer is warned by email before the
item expires (``approvals.notifications.warn_claimed_items_expiring``).
"""

from django.utils import timezone

from approvals.models import Interrupt, InterruptStatus
from runs.access import may_decide
from runs.base.errors import Conflict, Forbidden
from runs.services import actor_for
from runs.tx import RunTx, locked


def _locked_pending(interrupt: Interrupt) -> Interrupt:
    """The item locked (after its run, in the caller's ``runs.tx.locked`` block), if it is pending (else
    ``Conflict``)."""
    pending = Interrupt.objects.select_for_update(of=("self",)).select_related("claimed_by").get(pk=interrupt.pk)
    if pending.status != InterruptStatus.PENDING:
        raise Conflict("The item is no longer pending.", details={"status": pending.status})
    return pending


def _may_claim(interrupt: Interrupt, user) -> None:
    """``Forbidden`` unless ``user`` may decide ``interrupt`` (checked before any lock is taken): the decide
    rule on the item as loaded (``runs.access.may_decide``, ``decidable_by``'s answer), its run's requester
    from the run loaded with it (the item page's lookup: no statement) or read (one)."""
    if not may_decide(user, interrupt, requested_by_id=interrupt.run.requested_by_id):
        raise Forbidden("You may not claim this item.")


def _log(tx: RunTx, interrupt: Interrupt, user, reason: str) -> None:
    tx.log(type="claim", actor=actor_for(user), reason=reason,
           payload={"interrupt": interrupt.pk, "claimed_by": interrupt.claimed_by_id})


def claim_interrupt(*, interrupt: Interrupt, user) -> Interrupt:
    """``user`` claims ``interrupt``; claiming one's own claim again changes nothing. Returns the item.

    Raises ``Forbidden`` (may not decide it; checked first), ``Conflict``
    (not pending, or claimed by someone else: ``details.claimed_by`` names them).
    """
    _may_claim(interrupt, user)
    with locked(interrupt.run_id) as tx:
        pending = _locked_pending(interrupt)
        if pending.claimed_by_id == user.pk:
            return pending
        if pending.claimed_by_id is not None:
            raise Conflict(f"{pending.claimed_by.get_username()} is handling this item.",
                           details={"claimed_by": pending.claimed_by.get_username()})
        pending.claimed_by, pending.claimed_at, pending.expiry_warning_sent_at = user, timezone.now(), None
        pending.save(update_fields=["claimed_by", "claimed_at", "expiry_warning_sent_at"])
        _log(tx, pending, user, f"claimed by {user.get_username()}")
    return pending


def unclaim_interrupt(*, interrupt: Interrupt, user) -> Interrupt:
    """Drop the claim on ``interrupt``: its claimer, or staff. Unclaiming an unclaimed item changes nothing.

    Raises ``Forbidden`` (may not decide it, or someone else's claim and
    ``user`` is not staff) and ``Conflict`` (not pending).
    """
    _may_claim(interrupt, user)
    with locked(interrupt.run_id) as tx:
        pending = _locked_pending(interrupt)
        if pending.claimed_by_id is None:
            return pending
        if pending.claimed_by_id != user.pk and not user.is_staff:
            raise Forbidden("Only its claimer or staff may unclaim this item.")
        previous = pending.claimed_by.get_username()
        pending.claimed_by, pending.claimed_at = None, None
        pending.save(update_fields=["claimed_by", "claimed_at"])
        _log(tx, pending, user, f"unclaimed (was {previous})")
    return pending
