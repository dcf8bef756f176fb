"""Approval rules and idempotency keys: pure functions, decided by code."""

from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured

from tools.policy import InvalidRule, approval_required, check_rule
from tools.registry import Tool
from tools.services import action_identity, idempotency_key_base


@pytest.mark.parametrize(
    ("rule", "arguments", "expected"),
    [
        ("always", {}, True),
        ("never", {"amount": 10_000}, False),
        ("amount > 50", {"amount": 50}, False),
        ("amount > 50", {"amount": 50.01}, True),
        ("amount >= 50", {"amount": 50}, True),
        ("amount <= 5", {"amount": "4"}, True),
        ("amount == 3", {"amount": 3.0}, True),
        ("amount != 3", {"amount": 3}, False),
    ],
)
def test_approval_rule_decides_from_arguments(rule, arguments, expected):
    assert approval_required(rule, arguments) is expected


@pytest.mark.parametrize("arguments", [{}, {"amount": "lots"}, {"amount": None}])
def test_condition_on_missing_or_non_numeric_argument_asks_a_person(arguments):
    assert approval_required("amount > 50", arguments) is True


@pytest.mark.parametrize("rule", ["sometimes", "amount >> 5", "__import__('os') > 1", "amount > fifty", ""])
def test_malformed_rules_are_refused(rule):
    with pytest.raises(InvalidRule):
        check_rule(rule)


def _tool(name: str = "refund", same_action="session") -> Tool:
    return Tool(name=name, description=name, parameters={"type": "object"}, handler=lambda ctx, args: None,
                side_effect=True, same_action=same_action)


def _run(pk: int = 1, session: int = 7):
    return SimpleNamespace(pk=pk, session_id=session, requested_by=None)


def test_action_identity_names_the_logical_action_not_the_call():
    refund, order = _tool(), {"order_id": 123, "amount": 80}
    first = action_identity(refund, _run(), order)
    assert action_identity(refund, _run(), {"amount": 80, "order_id": 123}) == first
    assert action_identity(refund, _run(), {"order_id": 123.0, "amount": 8e1}) == first
    assert action_identity(refund, _run(pk=2), order) == first  # another run of the session: the same action
    assert action_identity(refund, _run(session=8), order) != first
    assert action_identity(refund, _run(), {"order_id": 123, "amount": 81}) != first
    assert action_identity(_tool("cancel_order"), _run(), order) != first


def test_a_run_scoped_action_is_the_same_only_within_its_run():
    report, arguments = _tool("send_report", same_action="run"), {"day": "2026-12-05"}
    first = action_identity(report, _run(pk=1), arguments)
    assert action_identity(report, _run(pk=1), arguments) == first
    assert action_identity(report, _run(pk=2), arguments) != first  # a later run of the session sends it again
    assert idempotency_key_base(report, _run(pk=1), arguments).startswith("send_report-r1-")


def test_a_business_key_makes_the_same_action_of_other_arguments_and_two_of_the_same():
    booking = _tool("book_room", same_action=lambda ctx, a: f"{a['room']}/{a['date']}")
    first = action_identity(booking, _run(), {"room": "A", "date": "2026-12-24", "note": "window seat"})
    assert action_identity(booking, _run(session=9), {"room": "A", "date": "2026-12-24", "note": "aisle"}) == first
    assert action_identity(booking, _run(), {"room": "B", "date": "2026-12-24", "note": "window seat"}) != first
    assert idempotency_key_base(booking, _run(), {"room": "A", "date": "2026-12-24"}).startswith("book_room-k-")
    with pytest.raises(TypeError):
        action_identity(_tool("book_room", same_action=lambda ctx, a: ""), _run(), {})


@pytest.mark.parametrize("same_action", ["tenant", None, 3])
def test_same_action_is_the_session_the_run_or_a_function(same_action):
    with pytest.raises(ImproperlyConfigured):
        _tool(same_action=same_action)


def test_only_side_effecting_tools_take_another_same_action():
    with pytest.raises(ImproperlyConfigured):
        Tool(name="lookup", description="", parameters={"type": "object"}, handler=lambda ctx, a: None,
             same_action="run")


def test_idempotency_key_is_the_session_and_action():
    refund = _tool()
    key = idempotency_key_base(refund, _run(), {"order_id": 123, "amount": 80})
    assert key == idempotency_key_base(refund, _run(), {"amount": 80.0, "order_id": 123})
    assert key.startswith("refund-s7-") and len(key) == len("refund-s7-") + 32
    assert idempotency_key_base(refund, _run(session=8), {"order_id": 123, "amount": 80}) != key


@pytest.mark.parametrize(
    ("rule", "earlier", "arguments", "expected"),
    [
        ("sum(amount) per target > 50", [], {"amount": 30}, False),
        ("sum(amount) per target > 50", [{"amount": 50}], {"amount": 45}, True),
        ("sum(amount) per target > 50", [{"amount": 20}], {"amount": 30}, False),
        ("sum(amount) per run within 1h >= 50", [{"amount": 20}], {"amount": 30}, True),
        ("count per user within 1d > 2", [{}, {}], {}, True),
        ("count per user within 1d > 2", [{}], {}, False),
        ("amount > 100 or sum(amount) per target > 50", [{"amount": 40}], {"amount": 20}, True),
        ("sum(amount) per target > 50", [{"amount": "NaN"}], {"amount": 1}, True),
    ],
)
def test_cumulative_rules_count_earlier_calls_and_this_one(rule, earlier, arguments, expected):
    assert approval_required(rule, arguments, lambda clause: earlier) is expected


def test_cumulative_rule_without_history_judges_this_call_alone():
    assert approval_required("sum(amount) per target > 50", {"amount": 60}) is True
    assert approval_required("sum(amount) per target > 50", {"amount": 40}) is False


@pytest.mark.parametrize("rule", [
    "sum(amount) per order > 50", "sum(amount) per target < 50", "sum(amount) per target within 3w > 5",
    "count per run > x", "amount > 50 or", "sum(__import__) per run > 1 and 1",
])
def test_malformed_cumulative_rules_are_refused(rule):
    with pytest.raises(InvalidRule):
        check_rule(rule, target_key="order_id")


def test_per_target_rule_needs_a_tool_with_a_target_key():
    check_rule("sum(amount) per target > 50", target_key="order_id")
    with pytest.raises(InvalidRule):
        check_rule("sum(amount) per target > 50")
