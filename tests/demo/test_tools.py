"""The demo's own tools as the core sees them: a refund's target key, and the e-mail tool refusing header
injection in its schema and in its handler (moved here from the approvals and attack tests: they need the demo)."""

import pytest

from tools.registry import ToolContext, ToolError, get_tool
from tools.services.summary import target_of


def test_the_target_key_groups_equal_targets_whatever_the_number_spelling():
    refund = get_tool("refund")
    assert target_of(refund, {"order_id": 123, "amount": 1}) == target_of(refund, {"order_id": 123.0}) == "refund:\"123\""
    assert target_of(refund, {"amount": 1}) == ""
    assert target_of(get_tool("send_email"), {"to": "a@example.com"}) == ""


@pytest.mark.parametrize("to", ["customer@example.com\nBcc: all@example.com", "customer@example.com\r"])
def test_an_email_address_with_a_line_break_is_refused_by_the_schema(to):
    errors = get_tool("send_email").schema_errors({"to": to, "subject": "Hi", "body": "Text"})
    assert errors and "email" in errors[0]


def test_a_header_django_refuses_is_a_tool_error_not_an_unknown_outcome():
    send_email = get_tool("send_email")
    with pytest.raises(ToolError, match="not sent"):
        send_email.handler(ToolContext(run=None, user=None, idempotency_key="k"),
                           {"to": "customer@example.com", "subject": "Hi\nBcc: all@example.com", "body": "Text"})
