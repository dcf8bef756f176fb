"""Which ``RunEvent`` rows are webhook events, and the body each one is sent with.

The mapping, from the event names the core writes (``runs.services``,
``tools.services``, ``approvals.services``):

=====================  ===============================================================
webhook type           ``RunEvent`` row
=====================  ===============================================================
``run.waiting``        ``type="transition"``, ``to_status="waiting"`` (the ``wait``
                       transition; ``waiting_reason`` in its payload)
``run.completed``      ``type="transition"``, ``to_status="completed"``
``run.failed``         ``type="transition"``, ``to_status="failed"``
``run.cancelled``      ``type="transition"``, ``to_status="cancelled"``
``interrupt.created``  ``type="interrupt"``, no ``from_status``, ``to_status="pending"``
``interrupt.resolved`` ``type="interrupt"``, ``from_status="pending"`` and any other
                       ``to_status``: decided by a person (``resolved``), ``expired``
                       or ``cancelled`` (``status`` in the body says which)
``tool_call.unknown``  ``type="tool_call"``, ``to_status="unknown"`` from another status
=====================  ===============================================================

Every other event (model calls, phases, other tool-call moves, ``resume``,
``recovery``...) is not sent. A body follows the Standard Webhooks
payload shape, ``{"type", "timestamp", "data"}``; ``data`` always has
``run``, ``session``, ``agent`` (slug), ``requested_by`` (username) and
``seq`` (the event's place in the run's log), plus the fields listed in
``_FIELDS``. ``run.completed`` also carries ``final_output_status``
(``runs.selectors.final_output_status``: whether recorded facts
contradict the model's final text, and which), as the API's run does.
Long texts (the model's final output) are left out: read them from
``GET /api/runs/{id}/``.
"""

from approvals.models import Interrupt, InterruptStatus
from runs.models import RunEvent, RunStatus
from runs.selectors import final_output_status
from runs.webhooks.models import EventType
from tools.models import ToolCallStatus

_RUN_TYPES = {
    RunStatus.WAITING: EventType.RUN_WAITING,
    RunStatus.COMPLETED: EventType.RUN_COMPLETED,
    RunStatus.FAILED: EventType.RUN_FAILED,
    RunStatus.CANCELLED: EventType.RUN_CANCELLED,
}

# Fields copied from the event's payload, by webhook type; ``_RENAMED``
# gives the body's name where the core's would be unclear to an integrator.
_FIELDS = {
    EventType.RUN_WAITING: ("waiting_reason",),
    EventType.RUN_COMPLETED: ("outcome", "outcome_reason", "effects"),
    EventType.RUN_FAILED: ("failure_type", "error", "effects"),
    EventType.RUN_CANCELLED: ("effects",),
    EventType.INTERRUPT_CREATED: ("interrupt", "kind"),
    EventType.INTERRUPT_RESOLVED: ("interrupt", "kind", "decision", "comment"),
    EventType.TOOL_CALL_UNKNOWN: ("tool_call", "name", "error"),
}
_RENAMED = {"name": "tool"}


def webhook_type(event: RunEvent) -> str | None:
    """The webhook type ``event`` stands for (an ``EventType`` value), or None when it is not sent (see module doc)."""
    if event.type == "transition" and event.from_status:
        return _RUN_TYPES.get(event.to_status)
    if event.type == "interrupt":
        if not event.from_status and event.to_status == InterruptStatus.PENDING:
            return EventType.INTERRUPT_CREATED
        if event.from_status == InterruptStatus.PENDING and event.to_status != InterruptStatus.PENDING:
            return EventType.INTERRUPT_RESOLVED
    unknown = ToolCallStatus.UNKNOWN
    if event.type == "tool_call" and event.to_status == unknown and event.from_status != unknown:
        return EventType.TOOL_CALL_UNKNOWN
    return None


def webhook_body(event: RunEvent, kind: str) -> dict:
    """The JSON body for ``event`` sent as webhook type ``kind``: ``{"type", "timestamp", "data"}``.

    ``event.run`` with its ``agent`` and ``requested_by`` should be loaded
    (``select_related``) by a caller handling many events. A
    ``run.completed`` body reads the run's calls and edited approvals for
    ``final_output_status`` (two queries when the run has a final text).
    """
    run = event.run
    data = {"run": run.pk, "session": run.session_id, "agent": run.agent.slug,
            "requested_by": run.requested_by.get_username(), "seq": event.seq}
    if kind.startswith("run."):
        data["status"] = event.to_status
    for field in _FIELDS[kind]:
        if field in event.payload:
            data[_RENAMED.get(field, field)] = event.payload[field]
    if kind == EventType.RUN_COMPLETED:
        data["final_output_status"] = final_output_status(run).as_dict()
    if kind.startswith("interrupt."):
        data["status"] = event.to_status
        item = Interrupt.objects.filter(pk=event.payload.get("interrupt")).values("tool_call_id",
                                                                                   "tool_call__name").first()
        data["tool_call"] = item["tool_call_id"] if item else None
        data["tool"] = item["tool_call__name"] if item else None
    return {"type": kind, "timestamp": event.created_at.isoformat().replace("+00:00", "Z"), "data": data}
