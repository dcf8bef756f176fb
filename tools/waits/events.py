"""The ``external_event`` kind: a run waits until an outside system reports an event type + key
(``POST /api/events/``; docs/design.md#waits)."""

import json
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError
from jsonschema import Draft202012Validator

from runs.access import may_deliver_event
from runs.base.errors import InvalidInput, NotFound
from runs.models import WaitingReason
from runs.services import actor_for, append_event
from runs.tx import locked
from tools.models import ExternalEvent, Wait, WaitStatus
from tools.waits.kinds import WaitKind, register_wait_kind
from tools.waits.settle import settle_wait

# An event type and a correlation key, as ``wait_for_event`` takes them and ``receive_event`` checks them.
EVENT_TYPE_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 100, "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]*$"}
CORRELATION_KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[A-Za-z0-9_.:-]+$"}
_DELIVERY = Draft202012Validator({"type": "object",
                                  "properties": {"type": EVENT_TYPE_SCHEMA, "key": CORRELATION_KEY_SCHEMA}})


def key_in_use(event_type: str, key: str, *, tool_call=None) -> bool:
    """Whether ``event_type`` + ``key`` is taken: a pending wait holds it, or such an event already came.

    The wait of ``tool_call`` itself (checked again before it runs) does not count.
    """
    pending = Wait.objects.filter(kind=EXTERNAL_EVENT.name, status=WaitStatus.PENDING,
                                  event_type=event_type, correlation_key=key)
    events = ExternalEvent.objects.filter(type=event_type, key=key)
    if tool_call is not None:
        pending, events = pending.exclude(tool_call=tool_call), events.exclude(wait__tool_call=tool_call)
    return pending.exists() or events.exists()


EXTERNAL_EVENT = register_wait_kind(WaitKind(
    name=WaitingReason.EXTERNAL_EVENT,
    taken=lambda wait: key_in_use(wait.event_type, wait.correlation_key),
    taken_error="The key {correlation_key!r} is already used for {event_type} events.",
    timeout_error="Timed out: no {event_type} event came within the wait's timeout.",
))


@dataclass(frozen=True)
class Received:
    """What ``receive_event`` did: ``event`` stored now (``created``) or found from an earlier delivery."""

    event: ExternalEvent
    created: bool


def _check_event(event_type, key, payload) -> None:
    """Raise ``InvalidInput`` for a type, key or payload that breaks the limits (see ``receive_event``)."""
    errors = {}
    for problem in sorted(_DELIVERY.iter_errors({"type": event_type, "key": key}), key=lambda e: list(e.path)):
        errors.setdefault(problem.path[0] if problem.path else "type", []).append(problem.message)
    size = len(json.dumps(payload, separators=(",", ":")).encode())
    limit = settings.TOLLGATE["MAX_EVENT_PAYLOAD_BYTES"]
    if size > limit:
        errors["payload"] = [f"The payload is {size} bytes of JSON; the limit is {limit}."]
    if errors:
        raise InvalidInput.for_fields(errors)


def receive_event(*, event_type: str, key: str, payload, user) -> Received:
    """An outside system reports event ``event_type`` with correlation ``key``: resume the run waiting on it.

    Only a pending wait with exactly this type and key is resumed, and
    only by a sender who may deliver to its run (``runs.access.may_deliver_event``:
    the run's requester, or a user with the ``tools.add_externalevent``
    permission, e.g. the token of the integrator's service that reports
    payments). A key can be guessed (the model may choose it), so it is
    not a capability of its own: to anyone else the wait, and an event
    delivered before, are not found. The event is stored (``ExternalEvent``), logged in
    the run's timeline, and its ``payload`` becomes the waiting call's
    result (``{"event_type", "correlation_key", "payload"}``). A repeat of
    a stored type + key changes nothing and returns the stored event
    (``created=False``). Raises ``InvalidInput`` (type or key not matching
    ``EVENT_TYPE_SCHEMA`` / ``CORRELATION_KEY_SCHEMA``, payload over
    ``TOLLGATE["MAX_EVENT_PAYLOAD_BYTES"]``) and ``NotFound`` (no wait holds
    that type and key: unknown, timed out, or its run ended).
    """
    _check_event(event_type, key, payload)
    actor = actor_for(user)
    for _ in range(2):  # a concurrent first delivery of the same event may win the insert
        earlier = ExternalEvent.objects.select_related("run").filter(type=event_type, key=key).first()
        if earlier is not None and may_deliver_event(user, earlier.run):
            return Received(earlier, created=False)
        wait = Wait.objects.select_related("run").filter(kind=EXTERNAL_EVENT.name, status=WaitStatus.PENDING,
                                                         event_type=event_type, correlation_key=key).first()
        if earlier is not None or wait is None or not may_deliver_event(user, wait.run):
            raise NotFound("No run is waiting for an event of this type with this key.")
        try:
            with locked(wait.run_id) as tx:
                run = tx.run
                event = ExternalEvent.objects.create(type=event_type, key=key, payload=payload, run=run, wait=wait,
                                                     received_by=user)
                append_event(run, type="external_event", actor=actor, reason=f"{event_type} received",
                             payload={"event": event.pk, "event_type": event_type, "wait": wait.pk,
                                      "tool_call": wait.tool_call_id})
                result = {"event_type": event_type, "correlation_key": key, "payload": payload}
                if not settle_wait(wait, status=WaitStatus.DONE, actor=actor, result=result):
                    raise NotFound("No run is waiting for an event of this type with this key.")
        except IntegrityError:
            continue
        return Received(event, created=True)
    return Received(ExternalEvent.objects.get(type=event_type, key=key), created=False)
