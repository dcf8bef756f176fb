"""The ``delivery`` kind, the ``wait_for_delivery`` tool and ``report_delivery`` (see the package doc).

* ``wait_for_delivery`` {parcel, timeout_s}: the run waits ``delivery``;
  the result is ``{"parcel", "signed_by"}``. After ``timeout_s`` the call
  fails with the kind's ``timeout_error`` and the run goes on.
* ``report_delivery(parcel=, signed_by=, actor=)``: the courier's report
  settles the pending wait for that parcel and resumes its run.
"""

from datetime import timedelta

from django.utils import timezone

from runs.base.errors import NotFound
from runs.tx import locked
from tools.models import Wait, WaitStatus
from tools.registry import Tool, WaitSpec, register
from tools.waits import WaitKind, register_wait_kind, settle_wait, settled_result

DELIVERY = register_wait_kind(WaitKind(
    name="delivery",
    timeout_error="No courier reported parcel {correlation_key} delivered in time.",
))


def _delivery_wait(ctx, args: dict) -> WaitSpec:
    return WaitSpec(kind=DELIVERY.name, deadline=timezone.now() + timedelta(seconds=args["timeout_s"]),
                    correlation_key=args["parcel"])


WAIT_FOR_DELIVERY = register(Tool(
    name="wait_for_delivery",
    description="Wait until the courier reports the parcel delivered (at most timeout_s seconds).",
    parameters={"type": "object",
                "properties": {"parcel": {"type": "string", "pattern": "^[A-Z0-9-]{1,40}$"},
                               "timeout_s": {"type": "integer", "minimum": 1, "maximum": 86400}},
                "required": ["parcel", "timeout_s"], "additionalProperties": False},
    handler=settled_result,
    wait=_delivery_wait,
))


def report_delivery(*, parcel: str, signed_by: str, actor: str) -> Wait:
    """The courier delivered ``parcel``: settle the pending ``delivery`` wait for it and resume its run.

    Raises ``NotFound`` when no run waits for that parcel (unknown, timed out, or already reported).
    """
    wait = Wait.objects.filter(kind=DELIVERY.name, status=WaitStatus.PENDING, correlation_key=parcel).first()
    if wait is None:
        raise NotFound(f"No run waits for parcel {parcel}.")
    with locked(wait.run_id):
        if not settle_wait(wait, status=WaitStatus.DONE, actor=actor,
                           result={"parcel": parcel, "signed_by": signed_by}):
            raise NotFound(f"No run waits for parcel {parcel}.")
    return wait
