"""Waits: what a run waits for on behalf of one tool call, one feature with kinds as plug-ins
(docs/design.md#waits).

The facade; import from here. ``WaitKind`` / ``register_wait_kind`` declare a
kind (``scheduled`` and ``external_event`` here, ``input`` in
``approvals.waits``, a plug-in's in its own app); a tool names the kind in
its ``WaitSpec`` and uses ``settled_result`` as its handler. The loop opens
waits (``open_wait``), the sweeper ends the due ones (``prefetch_due_waits``,
``end_due_waits``), ``end_run`` cancels them (``cancel_waits``), and what
was awaited settles them (``settle_wait``; ``receive_event`` for events).
"""

from tools.waits.events import (
    CORRELATION_KEY_SCHEMA, EVENT_TYPE_SCHEMA, EXTERNAL_EVENT, Received, key_in_use, receive_event,
)
from tools.waits.kinds import SCHEDULED, WaitKind, get_wait_kind, kind_of, register_wait_kind
from tools.waits.settle import cancel_waits, settle_wait, settled_result
from tools.waits.timeline import DUE, end_due_waits, open_wait, prefetch_due_waits, wait_of

__all__ = [
    "CORRELATION_KEY_SCHEMA", "DUE", "EVENT_TYPE_SCHEMA", "EXTERNAL_EVENT", "Received", "SCHEDULED", "WaitKind",
    "cancel_waits", "end_due_waits", "get_wait_kind", "key_in_use", "kind_of", "open_wait", "prefetch_due_waits",
    "receive_event", "register_wait_kind", "settle_wait", "settled_result", "wait_of",
]
