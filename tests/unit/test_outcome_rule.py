"""The floor of every completion check, as a pure rule over tool-call facts (no database)."""

import itertools

import pytest

from runs.engine.completion import CallFact, judge_calls
from tools.models import ToolCallStatus as S
from tools.models.tool_call import NO_EFFECT_STATUSES, PENDING_STATUSES

ALL_STATUSES = list(S.values)


def _fact(id, status, tool="refund", side_effect=True, error=""):
    return CallFact(id=id, tool=tool, side_effect=side_effect, status=status, error=error)


def test_every_status_is_either_pending_succeeded_or_without_effect():
    assert set(PENDING_STATUSES) | set(NO_EFFECT_STATUSES) | {S.SUCCEEDED} == set(ALL_STATUSES)
    assert not set(PENDING_STATUSES) & set(NO_EFFECT_STATUSES)


@pytest.mark.parametrize("status,side_effect,superseded",
                         list(itertools.product(ALL_STATUSES, [True, False], [True, False])))
def test_rule_over_every_end_status_side_effect_and_supersession(status, side_effect, superseded):
    facts = [_fact(1, status, side_effect=side_effect, error="why it ended")]
    if superseded:
        facts.append(_fact(2, S.SUCCEEDED, side_effect=side_effect))
    verdict = judge_calls(facts)

    if status in PENDING_STATUSES:
        assert not verdict.complete
        assert f"refund #1 ({status})" in verdict.reason
    elif status == S.SUCCEEDED or superseded:
        assert (verdict.complete, verdict.outcome) == (True, "achieved")
    else:
        assert (verdict.complete, verdict.outcome) == (True, "not_achieved")
        assert verdict.reason == f"refund #1 {status}: why it ended"


@pytest.mark.parametrize("status", sorted(NO_EFFECT_STATUSES))
def test_an_earlier_success_does_not_excuse_a_later_failure(status):
    verdict = judge_calls([_fact(1, S.SUCCEEDED), _fact(2, status)])
    assert verdict.outcome == "not_achieved"
    assert verdict.reason.startswith(f"refund #2 {status}")


def test_only_a_success_of_the_same_tool_supersedes():
    verdict = judge_calls([_fact(1, S.DENIED), _fact(2, S.SUCCEEDED, tool="cancel_order")])
    assert (verdict.outcome, verdict.reason) == ("not_achieved", "refund #1 denied")


def test_facts_are_judged_in_proposal_order_whatever_order_they_come_in():
    assert judge_calls([_fact(2, S.SUCCEEDED), _fact(1, S.REJECTED)]).outcome == "achieved"
    assert judge_calls([_fact(2, S.REJECTED), _fact(1, S.SUCCEEDED)]).outcome == "not_achieved"


def test_several_unresolved_calls_name_the_first_and_count_the_rest():
    verdict = judge_calls([_fact(3, S.FAILED), _fact(5, S.EXPIRED, tool="send_email"), _fact(7, S.DENIED)])
    assert verdict.reason == "refund #3 failed (and 2 more)"


def test_no_tool_calls_is_achieved_and_says_so():
    verdict = judge_calls([])
    assert (verdict.complete, verdict.outcome, verdict.reason) == (True, "achieved", "answered without tool calls")


def test_an_achieved_verdict_names_the_effects():
    verdict = judge_calls([_fact(1, S.SUCCEEDED, tool="query_order", side_effect=False), _fact(2, S.SUCCEEDED)])
    assert verdict.reason == "done: refund #2 succeeded"


def test_a_long_error_is_clipped_in_the_reason():
    verdict = judge_calls([_fact(1, S.FAILED, error="x" * 5000)])
    assert len(verdict.reason) <= 500


def test_a_call_of_a_tool_that_does_not_exist_names_no_effect_and_is_ignored():
    invented = CallFact(id=1, tool="refund_everything", side_effect=False, status=S.INVALID, registered=False)
    assert judge_calls([invented, _fact(2, S.SUCCEEDED)]).outcome == "achieved"
    assert judge_calls([_fact(1, S.INVALID), _fact(2, S.SUCCEEDED, tool="query_order")]).outcome == "not_achieved"


def test_only_a_success_on_the_same_target_corrects_a_failure():
    denied = CallFact(id=1, tool="refund", side_effect=True, status=S.DENIED, target="105")
    elsewhere = CallFact(id=2, tool="refund", side_effect=True, status=S.SUCCEEDED, target="123")
    same = CallFact(id=3, tool="refund", side_effect=True, status=S.SUCCEEDED, target="105")
    assert judge_calls([denied, elsewhere]).outcome == "not_achieved"
    assert judge_calls([denied, elsewhere, same]).outcome == "achieved"


def test_a_replayed_result_corrects_nothing():
    done = CallFact(id=1, tool="refund", side_effect=True, status=S.SUCCEEDED, target="123")
    denied = CallFact(id=2, tool="refund", side_effect=True, status=S.DENIED, target="123")
    replay = CallFact(id=3, tool="refund", side_effect=True, status=S.SUCCEEDED, target="123", original=1)
    assert judge_calls([done, denied, replay]).outcome == "not_achieved"


def test_a_failed_lookup_does_not_undo_a_booking_that_succeeded_and_the_reason_lists_it():
    lookup = _fact(1, S.FAILED, tool="find_room", side_effect=False, error="timeout")
    verdict = judge_calls([lookup, _fact(2, S.SUCCEEDED, tool="book_room")])
    assert (verdict.outcome, verdict.reason) == (
        "achieved", "done: book_room #2 succeeded; read-only call(s) without their result: find_room #1 failed: timeout")


def test_a_failed_lookup_decides_a_run_with_no_side_effect_that_succeeded():
    lookup = _fact(1, S.FAILED, tool="find_room", side_effect=False)
    assert judge_calls([lookup, _fact(2, S.SUCCEEDED, tool="find_room", side_effect=False)]).outcome == "achieved"
    denied = _fact(2, S.DENIED, tool="book_room")
    verdict = judge_calls([lookup, denied, _fact(3, S.SUCCEEDED, tool="list_rooms", side_effect=False)])
    assert (verdict.outcome, verdict.reason) == ("not_achieved", "find_room #1 failed (and 1 more)")
    assert judge_calls([_fact(1, S.FAILED, tool="find_room", side_effect=False, error="down"),
                        _fact(2, S.SUCCEEDED, tool="list_rooms", side_effect=False)]).reason == "find_room #1 failed: down"


def test_a_reused_result_is_named_as_reused_never_as_a_new_effect():
    done = CallFact(id=1, tool="refund", side_effect=True, status=S.SUCCEEDED, target="123")
    replay = CallFact(id=2, tool="refund", side_effect=True, status=S.SUCCEEDED, target="123", original=1)
    assert judge_calls([done, replay]).reason == "done: refund #1 succeeded; reused: refund #2 (result of #1)"
    assert judge_calls([replay]).reason == "reused: refund #2 (result of #1)"
