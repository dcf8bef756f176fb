"""Approval policy under attack (issue 9, items 2-4).

* An agent's approval rules only add approvals; replacing (loosening) a
  tool's rule needs ``runs.loosen_approval_policy``, and each use is logged
  with who granted it.
* The refund rule is cumulative per order: splitting a refund into small
  ones, in one turn, across turns or across runs, still reaches a person;
  two proposals at once cannot both slip under.
* Four eyes: the requester of a run does not decide its side-effecting
  calls unless the tool opts out, and the opt-out is recorded.
"""

import json
import threading
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection, transaction
from django.urls import reverse

from runs.agents import create_agent
from runs.models import Agent, Run, Step
from runs.services import start_run
from tests.api_helpers import gateway_refunds
from tools.registry import Tool, register
from tools.services import assess_tool_calls, propose_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


def refund(amount, order_id=123, call_id=None) -> dict:
    call = {"name": "refund", "arguments": json.dumps({"order_id": order_id, "amount": amount})}
    return {**call, "id": call_id} if call_id else call


def scripted_agent(slug: str, turns: list[dict], **fields) -> Agent:
    return create_agent(slug=slug, name=slug, model={"provider": "scripted", "turns": turns},
                        tools=["query_order", "refund"], completion_check="default", **fields)


def run_to_rest(worker, agent: Agent, user) -> Run:
    run = start_run(agent=agent, user=user, input="Refund order 123.")
    worker.drain()
    run.refresh_from_db()
    return run


def statuses(run: Run) -> list[str]:
    return list(run.tool_calls.order_by("id").values_list("status", flat=True))


def staff_user(username: str, *permissions: str):
    user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
    for name in permissions:
        app_label, codename = name.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return get_user_model().objects.get(pk=user.pk)  # fresh permission cache


# --- item 4: four eyes -----------------------------------------------------------------


def test_an_approver_cannot_approve_the_refund_of_their_own_run(demo, api, worker):
    demo["requester"].groups.add(Group.objects.get(name="approvers"))
    agent = scripted_agent("own-refund", [{"tool_calls": [refund(80)]}, {"content": "Done."}])
    run = run_to_rest(worker, agent, demo["requester"])
    interrupt = run.interrupts.get()
    assert interrupt.allow_requester is False

    own = api(demo["requester"]).post(f"/api/interrupts/{interrupt.pk}/approve/", {}, format="json")
    other = api(demo["approver"]).post(f"/api/interrupts/{interrupt.pk}/approve/", {}, format="json")

    assert (own.status_code, other.status_code) == (403, 200)


register(Tool(
    name="test_self_service_note",
    description="Test tool: a side effect whose requester may approve it (four eyes waived).",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": False},
    handler=lambda ctx, args: {"noted": args.get("text", "")},
    side_effect=True,
    approval="always",
    allow_requester_approval=True,
))


def test_a_tool_that_waives_four_eyes_lets_the_requester_decide_and_says_so(demo, api, worker):
    demo["requester"].groups.add(Group.objects.get(name="approvers"))
    call = {"name": "test_self_service_note", "arguments": json.dumps({"text": "hi"})}
    agent = create_agent(slug="self-service", name="Self service", tools=["test_self_service_note"],
                         model={"provider": "scripted", "turns": [{"tool_calls": [call]}, {"content": "Noted."}]})
    run = run_to_rest(worker, agent, demo["requester"])
    interrupt = run.interrupts.get()

    response = api(demo["requester"]).post(f"/api/interrupts/{interrupt.pk}/approve/", {}, format="json")

    assert response.status_code == 200
    requested = run.events.get(type="interrupt", to_status="pending")
    assert "no four eyes" in requested.reason and requested.payload["allow_requester"] is True


def test_read_only_tools_keep_letting_the_requester_decide(demo):
    from tools.registry import get_tool

    assert get_tool("query_order").requester_may_decide is True
    assert get_tool("refund").requester_may_decide is False
    assert get_tool("send_email").requester_may_decide is False
