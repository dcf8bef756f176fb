"""Per-tool summaries of pending calls (``tools.services.summary``) and the facts kept on an inbox item.

The demo refund tool's own summaries: tests/demo/test_summaries.py."""

import pytest

from runs.engine.actors import advance_run
from runs.engine.lifecycle import start_run
from runs.models import Run
from tests.support.core import lookup, transfer
from tests.support.durability import make_agent
from tools.models import ToolCall
from tools.services.summary import Description, describe


def _call(name, arguments):
    return ToolCall(name=name, arguments=arguments)


def test_a_tool_without_a_hook_reads_as_its_name_and_top_level_arguments(people):
    long_text = "word " * 40
    description = describe(_call("fake_transfer", {"to": "acct-9", "amount": 12.0, "note": long_text}))
    # the schema's keys first, in its order (amount), then the others by name: the same on every database
    assert description.text.startswith("fake_transfer(amount=12, note=word word")
    assert (description.risk_fields[0], description.risk_fields[2]) == (("amount", "12"), ("to", "acct-9"))
    assert len(description.risk_fields[1][1]) == 60
    assert describe(_call("no_such_tool", None)) == Description(text="no_such_tool")


def test_the_fallback_line_masks_credentials(people):
    description = describe(_call("fake_transfer", {"to": "acct-9", "api_key": "sk-live-0123456789abcdef"}))
    assert "sk-live-0123456789abcdef" not in description.text
    assert dict(description.risk_fields)["api_key"] == "***"


def test_the_fallback_line_shows_a_lookup_key_as_it_is(people):
    """A tool's ``key`` argument is the row it looks up, which the approver must see (not a credential)."""
    description = describe(_call("fake_lookup", {"key": "order-7"}))
    assert description.text == "fake_lookup(key=order-7)"
    assert description.risk_fields == (("key", "order-7"),)


@pytest.mark.django_db(transaction=True)
def test_the_rule_that_fired_and_the_target_are_kept_on_the_item(people, worker):
    agent = make_agent("transfer-80", [{"tool_calls": [lookup("acme")]}, {"tool_calls": [transfer("acme", 80)]},
                                       {"content": "Sent."}], tools=["fake_lookup", "fake_transfer"],
                       check="fake_transfer")
    run = start_run(agent=agent, user=people["requester"], input="send 80 to acme")
    advance_run.send(run.pk)
    worker.drain()

    item = Run.objects.get(pk=run.pk).interrupts.get()
    assert (item.rule, item.target) == ("amount > 10", 'fake_transfer:"acme"')
