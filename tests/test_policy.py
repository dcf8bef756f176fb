"""Approval rules and idempotency keys: pure functions, decided by code."""

import pytest

from tools.policy import InvalidRule, approval_required, check_rule
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


def test_action_identity_names_the_logical_action_not_the_call():
    first = action_identity(7, "refund", {"order_id": 123, "amount": 80})
    reordered = action_identity(7, "refund", {"amount": 80, "order_id": 123})
    assert first == reordered
    assert action_identity(7, "refund", {"order_id": 123.0, "amount": 8e1}) == first
    assert action_identity(8, "refund", {"order_id": 123, "amount": 80}) != first
    assert action_identity(7, "refund", {"order_id": 123, "amount": 81}) != first
    assert action_identity(7, "cancel_order", {"order_id": 123, "amount": 80}) != first


def test_idempotency_key_is_the_session_and_action():
    key = idempotency_key_base(7, "refund", {"order_id": 123, "amount": 80})
    assert key == idempotency_key_base(7, "refund", {"amount": 80.0, "order_id": 123})
    assert key.startswith("refund-s7-") and len(key) == len("refund-s7-") + 32
    assert idempotency_key_base(8, "refund", {"order_id": 123, "amount": 80}) != key


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
