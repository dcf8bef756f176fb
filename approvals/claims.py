"""Claims: a person says they are handling an inbox item ("being handled by X").

A claim informs; it does not lock: anyone who may decide the item still
can (``approvals.services.decide_interrupt`` ignores claims). Only someone
who may decide a pending item may claim it, and one person holds a claim
at a time: claiming an item another person holds is a ``Conflict`` (409)
until they unclaim it (staff may unclaim anyone's). Claims and unclaims are
written to the run's event log. The claimer is warned by email before the
item expires (``approvals.notifications.warn_claimed_items_expiring``).
"""

from django.db import transaction
from django.utils import timezone

from approvals.models import Interrupt, InterruptStatus
from runs.errors import Conflict, Forbidden
from runs.models import Run
from runs.services import actor_for, append_event


def _locked_pending(interrupt: Interrupt, user) -> Interrupt:
    """The item locked (after its run), if ``user`` may decide it (else ``Forbidden``) and it is pending
    (else ``Conflict``)."""
    if not Interrupt.objects.decidable_by(user).filter(pk=interrupt.pk).exists():
        raise Forbidden("You may not claim this item.")
    Run.objects.select_for_update().get(pk=interrupt.run_id)  # the run first, as every decision locks
    locked = Interrupt.objects.select_for_update(of=("self",)).select_related("claimed_by").get(pk=interrupt.pk)
    if locked.status != InterruptStatus.PENDING:
        raise Conflict("The item is no longer pending.", details={"status": locked.status})
    return locked


def _log(interrupt: Interrupt, user, reason: str) -> None:
    append_event(interrupt.run, type="claim", actor=actor_for(user), reason=reason,
                 payload={"interrupt": interrupt.pk, "claimed_by": interrupt.claimed_by_id})


def claim_interrupt(*, interrupt: Interrupt, user) -> Interrupt:
    """``user`` claims ``interrupt``; claiming one's own claim again changes nothing. Returns the item.

    Raises ``Forbidden`` (may not decide it; checked first), ``Conflict``
    (not pending, or claimed by someone else: ``details.claimed_by`` names them).
    """
    with transaction.atomic():
        locked = _locked_pending(interrupt, user)
        if locked.claimed_by_id == user.pk:
            return locked
        if locked.claimed_by_id is not None:
            raise Conflict(f"{locked.claimed_by.get_username()} is handling this item.",
                           details={"claimed_by": locked.claimed_by.get_username()})
        locked.claimed_by, locked.claimed_at, locked.expiry_warning_sent_at = user, timezone.now(), None
        locked.save(update_fields=["claimed_by", "claimed_at", "expiry_warning_sent_at"])
        _log(locked, user, f"claimed by {user.get_username()}")
    return locked


def unclaim_interrupt(*, interrupt: Interrupt, user) -> Interrupt:
    """Drop the claim on ``interrupt``: its claimer, or staff. Unclaiming an unclaimed item changes nothing.

    Raises ``Forbidden`` (may not decide it, or someone else's claim and
    ``user`` is not staff) and ``Conflict`` (not pending).
    """
    with transaction.atomic():
        locked = _locked_pending(interrupt, user)
        if locked.claimed_by_id is None:
            return locked
        if locked.claimed_by_id != user.pk and not user.is_staff:
            raise Forbidden("Only its claimer or staff may unclaim this item.")
        previous = locked.claimed_by.get_username()
        locked.claimed_by, locked.claimed_at = None, None
        locked.save(update_fields=["claimed_by", "claimed_at"])
        _log(locked, user, f"unclaimed (was {previous})")
    return locked
