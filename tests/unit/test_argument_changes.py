"""The diff of an approver's edit (issue 12): ``tools.services.edits.argument_changes``, proposed to approved.

How it is recorded and shown is tests/web/test_item_page.py.
"""

from tools.services.edits import argument_changes


def test_a_changed_top_level_field_is_one_entry_with_both_values():
    assert argument_changes({"order_id": 123, "amount": 60}, {"order_id": 123, "amount": 40}) == [
        {"path": "/amount", "field": "amount", "change": "changed", "proposed": 60, "approved": 40}]


def test_nested_edits_give_one_path_per_changed_leaf():
    proposed = {"to": {"name": "Ann", "email": "a@example.com"}, "lines": [{"sku": "A", "qty": 2}, {"sku": "B", "qty": 1}]}
    approved = {"to": {"name": "Ann", "email": "b@example.com"}, "lines": [{"sku": "A", "qty": 1}], "note": "x"}
    assert argument_changes(proposed, approved) == [
        {"path": "/to/email", "field": "to.email", "change": "changed", "proposed": "a@example.com",
         "approved": "b@example.com"},
        {"path": "/lines/0/qty", "field": "lines[0].qty", "change": "changed", "proposed": 2, "approved": 1},
        {"path": "/lines/1", "field": "lines[1]", "change": "removed", "proposed": {"sku": "B", "qty": 1}},
        {"path": "/note", "field": "note", "change": "added", "approved": "x"},
    ]


def test_equal_numbers_are_no_change_but_a_boolean_is_not_a_number():
    assert argument_changes({"amount": 80, "notify": True}, {"amount": 80.0, "notify": True}) == []
    assert argument_changes({"notify": True}, {"notify": 1}) == [
        {"path": "/notify", "field": "notify", "change": "changed", "proposed": True, "approved": 1}]


def test_a_value_that_changes_type_is_one_entry_and_keys_are_escaped_as_json_pointer():
    assert argument_changes({"a/b~c": {"x": 1}}, {"a/b~c": 5}) == [
        {"path": "/a~1b~0c", "field": "a/b~c", "change": "changed", "proposed": {"x": 1}, "approved": 5}]


def test_nothing_edited_is_no_change():
    assert argument_changes({"amount": 60}, None) == []
