"""A model's tool arguments are parsed strictly (``runs.base.model_output.parse_arguments``, issue 9, item 5).

Non-finite numbers, NUL, lone UTF-16 surrogates, keys named twice, nesting
too deep and anything but an object are ``UnsafeArguments``; ordinary
objects come through. What a run does with such a call is
tests/attack/test_model_output.py and tests/attack/test_untrusted_edges.py.
"""

import pytest

from runs.base.model_output import UnsafeArguments, parse_arguments


@pytest.mark.parametrize("raw", [
    '{"amount": NaN}', '{"amount": Infinity}', '{"amount": -Infinity}', '{"amount": 1e309}',
    '{"amount": -1e309}', '{"note": "a\\u0000b"}', '{"a\\u0000": 1}', '{"list": ["\\u0000"]}',
    "[" * 100_000 + "]" * 100_000, '{"a": ' + "[" * 40 + "]" * 40 + "}", "[1, 2]", "{not json",
])
def test_arguments_parser_refuses_non_finite_numbers_nul_and_non_objects(raw):
    with pytest.raises(UnsafeArguments):
        parse_arguments(raw)


def test_arguments_parser_keeps_ordinary_objects():
    assert parse_arguments('{"order_id": 123, "amount": 1e3, "note": "ok \\u00e9"}') == {
        "order_id": 123, "amount": 1000.0, "note": "ok \u00e9"}
    nested = '{"a": ' + "[" * 31 + "]" * 31 + "}"
    assert parse_arguments(nested)["a"]


@pytest.mark.parametrize("raw", ['{"note": "customer \\ud800 request"}', '{"\\udfff": 1}', '{"a": ["x\\udbff"]}'])
def test_arguments_parser_refuses_escaped_lone_surrogates(raw):
    with pytest.raises(UnsafeArguments, match="lone surrogate"):
        parse_arguments(raw)


def test_arguments_parser_keeps_a_surrogate_pair():
    assert parse_arguments('{"note": "\\ud83d\\ude00"}') == {"note": "\U0001F600"}


def test_arguments_naming_a_key_twice_are_refused():
    with pytest.raises(UnsafeArguments, match="more than once"):
        parse_arguments('{"order_id": 123, "amount": 10, "amount": 1000}')
    with pytest.raises(UnsafeArguments, match="more than once"):
        parse_arguments('{"lines": [{"sku": "a", "sku": "b"}]}')
    assert parse_arguments('{"a": {"x": 1}, "b": {"x": 2}}') == {"a": {"x": 1}, "b": {"x": 2}}
