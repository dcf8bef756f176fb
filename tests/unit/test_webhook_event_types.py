"""Which rows of the event log are announced to webhooks, and as which type (``runs.webhooks.events.webhook_type``).

Delivering them to a real endpoint is tests/api/test_webhooks_delivery.py.
"""

import pytest

from runs.models import RunEvent
from runs.webhooks.events import webhook_type


@pytest.mark.parametrize("row, expected", [
    ({"type": "transition", "from_status": "running", "to_status": "waiting"}, "run.waiting"),
    ({"type": "transition", "from_status": "running", "to_status": "completed"}, "run.completed"),
    ({"type": "transition", "from_status": "waiting", "to_status": "failed"}, "run.failed"),
    ({"type": "transition", "from_status": "queued", "to_status": "cancelled"}, "run.cancelled"),
    ({"type": "transition", "from_status": "", "to_status": "queued"}, None),
    ({"type": "transition", "from_status": "waiting", "to_status": "running"}, None),
    ({"type": "interrupt", "from_status": "", "to_status": "pending"}, "interrupt.created"),
    ({"type": "interrupt", "from_status": "pending", "to_status": "resolved"}, "interrupt.resolved"),
    ({"type": "interrupt", "from_status": "pending", "to_status": "expired"}, "interrupt.resolved"),
    ({"type": "interrupt", "from_status": "pending", "to_status": "cancelled"}, "interrupt.resolved"),
    ({"type": "tool_call", "from_status": "running", "to_status": "unknown"}, "tool_call.unknown"),
    ({"type": "tool_call", "from_status": "ready", "to_status": "unknown"}, "tool_call.unknown"),
    ({"type": "tool_call", "from_status": "unknown", "to_status": "succeeded"}, None),
    ({"type": "model_call", "from_status": "", "to_status": ""}, None),
])
def test_event_log_rows_map_to_webhook_types(row, expected):
    assert webhook_type(RunEvent(**row)) == expected
