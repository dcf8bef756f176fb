"""Hostile JSON text is refused by the strict parser and the admin's agent form, without a 500 (issue 9, item 7).

``config.strict_json.loads`` refuses each kind (non-finite numbers, NUL,
huge integers, deep nesting, bytes that are not UTF-8); the admin's
``AgentAdminForm`` shows a field error. The same text sent to every write
endpoint and inbox form is tests/attack/test_input.py.
"""

import pytest

from config.strict_json import StrictJSONError, loads
from tests.support.security import DEEP


def test_strict_loads_refuses_each_kind_and_accepts_ordinary_json():
    assert loads('{"a": [1, 2.5, "x", null, true], "b": {"c": -9223372036854775807}}') == {
        "a": [1, 2.5, "x", None, True], "b": {"c": -9223372036854775807}}
    for text in ("NaN", "[Infinity]", "-Infinity", "1e309", "-1e400", '"\\u0000"', '{"\\u0000": 1}',
                 "9223372036854775808", "[" * 33 + "]" * 33, "{", b"\xff"):
        with pytest.raises(StrictJSONError):
            loads(text)
    assert loads("[" * 32 + "]" * 32) is not None


@pytest.mark.parametrize("text", [DEEP, '{"provider": "scripted", "turns": [], "x": NaN}', '{"a": "\\u0000"}'])
def test_admin_agent_form_refuses_hostile_json_without_a_500(text):
    from runs.admin import AgentAdminForm

    form = AgentAdminForm(data={"slug": "admin-form", "name": "Form", "model": text, "tools": "[]",
                                "approval_policy": "{}", "completion_check": "default", "max_turns": 20})
    assert not form.is_valid() and "model" in form.errors
    form.as_p()  # redisplaying the bound form does not parse the text unguarded
