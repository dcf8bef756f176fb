"""Approval policy under attack (issue 9, items 2-4).

* An agent's approval rules only add approvals; replacing (loosening) a
  tool's rule needs ``runs.loosen_approval_policy``, and each use is logged
  with who granted it.
* A cumulative rule (a refund's: the sum per target within 30 days over
  50, here on the tests' own ``fake_transfer``, per account) holds:
  splitting a transfer into small ones, in one turn, across turns or
  across runs, still reaches a person; two proposals at once cannot both
  slip under.
* Four eyes: the requester of a run does not decide its side-effecting
  calls unless the tool opts out, and the opt-out is recorded.
"""

import dataclasses
import json
import threading
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection, transaction
from django.urls import reverse

from runs.engine.agents import create_agent
from runs.models import Agent, Run, Step
from runs.engine.lifecycle import start_run
from tests.support.core import asking_agent
from tests.support.fake_tools import FAKE_NOTICE, FAKE_TRANSFER, transfers
from tools import registry
from tools.registry import Tool, ToolTimeout, register
from runs.base.awaiting import drive
from tools.services import assess_tool_calls, propose_tool_calls
from tools.services.targets import target_key

pytestmark = pytest.mark.django_db(transaction=True)


CUMULATIVE_RULE = "sum(amount) per target within 30d > 50"


def send(amount, account="acme", call_id=None) -> dict:
    call = {"name": "fake_transfer", "arguments": json.dumps({"account": account, "amount": amount})}
    return {**call, "id": call_id} if call_id else call


@pytest.fixture
def cumulative(monkeypatch):
    """``fake_transfer`` asks a person by ``CUMULATIVE_RULE`` (instead of ``amount > 10``) in this test."""
    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(FAKE_TRANSFER, approval=CUMULATIVE_RULE))


def scripted_agent(slug: str, turns: list[dict], **fields) -> Agent:
    return create_agent(slug=slug, name=slug, model={"provider": "scripted", "turns": turns},
                        tools=["fake_lookup", "fake_transfer"], completion_check="default", **fields)


def sent() -> list[Decimal]:
    """The amounts ``fake_transfer`` transferred, oldest first."""
    return [Decimal(str(t["amount"])) for t in transfers()]


def run_to_rest(worker, agent: Agent, user) -> Run:
    run = start_run(agent=agent, user=user, input="Send 80 to acme.")
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


# --- item 2: an agent's rules only tighten --------------------------------------------


def test_staff_without_loosen_permission_cannot_switch_transfer_approval_off(people, api):
    staff = staff_user("staff", "runs.add_agent")
    body = {"slug": "no-approval", "name": "No approval", "model": {"provider": "scripted", "turns": []},
            "tools": ["fake_transfer"], "approval_policy": {"fake_transfer": "never"}}

    response = api(staff).post("/api/agents/", body, format="json")

    assert response.status_code == 400
    assert "loosen_approval_policy" in json.dumps(response.json())
    assert not Agent.objects.filter(slug="no-approval").exists()


def test_agent_rule_adds_to_the_tool_rule_instead_of_replacing_it(people, worker):
    agent = scripted_agent("lenient", [{"tool_calls": [send(80)]}, {"content": "Done."}],
                           approval_policy={"fake_transfer": "amount > 1000"})

    run = run_to_rest(worker, agent, people["requester"])

    assert (run.status, run.waiting_reason) == ("waiting", "approval")
    assert statuses(run) == ["awaiting_approval"]
    assert transfers() == []


def test_agent_rule_may_require_approval_where_the_tool_does_not(people, worker):
    look = {"name": "fake_lookup", "arguments": json.dumps({"key": "acme"})}
    agent = scripted_agent("careful", [{"tool_calls": [look]}, {"content": "Done."}],
                           approval_policy={"fake_lookup": "always"})

    run = run_to_rest(worker, agent, people["requester"])

    assert statuses(run) == ["awaiting_approval"]


def test_loosening_needs_the_permission_and_each_use_names_who_granted_it(people, api, worker):
    grantor = staff_user("policy-owner", "runs.add_agent", "runs.loosen_approval_policy")
    body = {"slug": "trusted-transfers", "name": "Trusted transfers", "tools": ["fake_lookup", "fake_transfer"],
            "completion_check": "fake_transfer", "approval_policy": {"fake_transfer": "never"},
            "model": {"provider": "scripted", "turns": [{"tool_calls": [send(80)]}, {"content": "Done."}]}}
    assert api(grantor).post("/api/agents/", body, format="json").status_code == 201
    agent = Agent.objects.get(slug="trusted-transfers")
    assert agent.approval_policy_granted_by == grantor

    run = run_to_rest(worker, agent, people["requester"])

    assert (run.status, run.outcome) == ("completed", "achieved")
    assert sent() == [80]
    event, = run.events.filter(type="policy")
    assert event.reason == "loosened approval rule applied"
    assert event.payload["granted_by"] == "policy-owner"
    assert event.payload["tool_rule"] == "amount > 10"


def _agent_form(agent: Agent, approval_policy: dict) -> dict:
    """The admin change form of ``agent`` as saved, with ``approval_policy`` instead of its own."""
    return {"slug": agent.slug, "name": agent.name, "instructions": "", "model": json.dumps(agent.model),
            "tools": agent.tools, "approval_policy": json.dumps(approval_policy),
            "completion_check": agent.completion_check, "max_turns": 5}


def test_admin_form_refuses_loosening_without_the_permission(people, client):
    editor = staff_user("editor", "runs.change_agent", "runs.view_agent")
    client.force_login(editor)
    agent = asking_agent()

    response = client.post(reverse("admin:runs_agent_change", args=[agent.pk]),
                           _agent_form(agent, {"fake_transfer": "never"}))

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["approval_policy"] and "loosen_approval_policy" in errors["approval_policy"][0]
    agent.refresh_from_db()
    assert agent.approval_policy == {} and agent.approval_policy_granted_by is None


def test_admin_records_who_loosened_a_policy(people, admin_client):
    agent = asking_agent()

    response = admin_client.post(reverse("admin:runs_agent_change", args=[agent.pk]),
                                 _agent_form(agent, {"fake_transfer": "amount > 100"}))

    assert response.status_code == 302
    current = Agent.objects.current().get(slug=agent.slug)  # the change is the next version
    assert (current.version, current.approval_policy_granted_by.username) == (2, "admin")
    assert current.loosened_tools == ["fake_transfer"]  # the tool's own rule no longer applies


# --- item 3: a cumulative rule -----------------------------------------------------


def test_two_transfers_in_one_turn_to_one_account_cannot_both_slip_under(people, worker, cumulative):
    agent = scripted_agent("split-turn", [{"tool_calls": [send(50), send(45)]}, {"content": "Done."}])

    run = run_to_rest(worker, agent, people["requester"])

    assert (run.status, run.waiting_reason) == ("waiting", "approval")
    assert statuses(run) == ["succeeded", "awaiting_approval"]
    assert sent() == [50]
    assert "counting earlier calls" in run.events.get(type="tool_call", to_status="awaiting_approval").reason


def test_transfers_split_across_turns_reach_a_person(people, worker, cumulative):
    agent = scripted_agent("split-turns", [{"tool_calls": [send(50)]}, {"tool_calls": [send(45)]},
                                           {"content": "Done."}])

    run = run_to_rest(worker, agent, people["requester"])

    assert statuses(run) == ["succeeded", "awaiting_approval"]
    assert len(transfers()) == 1


def test_transfers_split_across_runs_of_one_user_reach_a_person(people, worker, cumulative):
    first = run_to_rest(worker, scripted_agent("first", [{"tool_calls": [send(50)]}, {"content": "Done."}]),
                        people["requester"])
    second = run_to_rest(worker, scripted_agent("second", [{"tool_calls": [send(45)]}, {"content": "Done."}]),
                         people["requester"])

    assert (first.status, statuses(first)) == ("completed", ["succeeded"])
    assert (second.waiting_reason, statuses(second)) == ("approval", ["awaiting_approval"])


def test_transfers_to_different_accounts_are_counted_apart(people, worker, cumulative):
    agent = scripted_agent("two-accounts", [{"tool_calls": [send(50), send(45, account="globex")]},
                                            {"content": "Done."}])

    run = run_to_rest(worker, agent, people["requester"])

    assert statuses(run) == ["succeeded", "succeeded"]


def test_one_target_written_two_ways_is_counted_as_one(people, worker, cumulative, monkeypatch):
    """Account 7 and account "7" are one target (one lock key, ``Target.lock_key``): a rule per target counts
    them together, so a transfer split between the two spellings still reaches a person."""
    either = {**FAKE_TRANSFER.parameters, "properties": {
        **FAKE_TRANSFER.parameters["properties"], "account": {"type": ["string", "integer"]}}}
    monkeypatch.setitem(registry._TOOLS, "fake_transfer", dataclasses.replace(
        registry._TOOLS["fake_transfer"], parameters=either))
    agent = scripted_agent("two-spellings", [{"tool_calls": [send(50, account=7)]},
                                             {"tool_calls": [send(45, account="7")]}, {"content": "Done."}])

    run = run_to_rest(worker, agent, people["requester"])

    assert statuses(run) == ["succeeded", "awaiting_approval"]
    assert len(set(run.tool_calls.values_list("target", flat=True))) == 1


def test_calls_stored_before_targets_were_kept_are_counted_and_filled_in(people, worker, cumulative):
    """A call stored with no ``target`` (before migration 0014) still counts for its target by its arguments;
    the migration's fill-in gives it the target's key."""
    from importlib import import_module

    from django.apps import apps

    first = run_to_rest(worker, scripted_agent("before", [{"tool_calls": [send(50)]}, {"content": "Done."}]),
                        people["requester"])
    first.tool_calls.update(target="")
    second = run_to_rest(worker, scripted_agent("after", [{"tool_calls": [send(45)]}, {"content": "Done."}]),
                         people["requester"])
    assert (second.waiting_reason, statuses(second)) == ("approval", ["awaiting_approval"])

    import_module("tools.migrations.0014_tool_call_target").fill_targets(apps, None)
    assert first.tool_calls.get().target == second.tool_calls.get().target != ""


def test_an_approvers_edit_of_the_target_moves_the_call_to_the_new_target(people, worker, cumulative):
    from approvals.services import decide_interrupt

    run = run_to_rest(worker, scripted_agent("edited", [{"tool_calls": [send(80)]}, {"content": "Done."}]),
                      people["requester"])
    decide_interrupt(interrupt=run.interrupts.get(), user=people["approver"], decision="approved",
                     edited_arguments={"account": "globex", "amount": 80})
    worker.drain()

    call = run.tool_calls.get()
    assert (call.status, call.target) == ("succeeded", target_key(registry.get_tool("fake_transfer"),
                                                                  {"account": "globex", "amount": 80}))


def test_rejected_transfers_do_not_count(people, worker, cumulative):
    agent = scripted_agent("after-reject", [{"tool_calls": [send(80)]}, {"tool_calls": [send(30)]},
                                            {"content": "Done."}])
    run = run_to_rest(worker, agent, people["requester"])
    from approvals.services import decide_interrupt

    decide_interrupt(interrupt=run.interrupts.get(), user=people["approver"], decision="rejected")
    worker.drain()
    run.refresh_from_db()

    assert statuses(run) == ["rejected", "succeeded"]


def test_a_small_transfer_alone_needs_no_approval(people, worker, cumulative):
    agent = scripted_agent("small", [{"tool_calls": [send(30)]}, {"content": "Done."}])

    run = run_to_rest(worker, agent, people["requester"])

    assert (run.status, statuses(run)) == ("completed", ["succeeded"])


def test_two_runs_proposing_at_once_are_judged_one_after_the_other(people, cumulative):
    """Run A proposes a transfer of 50 and holds its transaction open; run B's 45 must wait and count it."""
    agent = scripted_agent("parallel", [])
    runs = [start_run(agent=agent, user=people["requester"], input=f"Send {n}.") for n in (1, 2)]
    steps = [Step.objects.create(run=run, index=0, request={}) for run in runs]
    calls = [[send(50, call_id="a")], [send(45, call_id="b")]]
    assessments = [drive(assess_tool_calls(run=run, calls=c, truncated=False)) for run, c in zip(runs, calls)]
    a_proposed, b_done = threading.Event(), threading.Event()

    def propose_a():
        try:
            with transaction.atomic():
                propose_tool_calls(run=runs[0], step=steps[0], calls=calls[0], assessments=assessments[0])
                a_proposed.set()
                b_done.wait(timeout=1.5)  # B must not finish while A's call is uncommitted
        finally:
            connection.close()

    def propose_b():
        try:
            propose_tool_calls(run=runs[1], step=steps[1], calls=calls[1], assessments=assessments[1])
            b_done.set()
        finally:
            connection.close()

    first = threading.Thread(target=propose_a)
    first.start()
    assert a_proposed.wait(timeout=10)
    second = threading.Thread(target=propose_b)
    second.start()
    first.join(timeout=30)
    second.join(timeout=30)

    assert statuses(runs[0]) == ["ready"]
    assert statuses(runs[1]) == ["awaiting_approval"]


# --- item 4: four eyes -----------------------------------------------------------------


def test_an_approver_cannot_approve_the_transfer_of_their_own_run(people, api, worker):
    people["requester"].groups.add(Group.objects.get(name="approvers"))
    agent = scripted_agent("own-transfer", [{"tool_calls": [send(80)]}, {"content": "Done."}])
    run = run_to_rest(worker, agent, people["requester"])
    interrupt = run.interrupts.get()
    assert interrupt.allow_requester is False

    own = api(people["requester"]).post(f"/api/interrupts/{interrupt.pk}/approve/", {}, format="json")
    other = api(people["approver"]).post(f"/api/interrupts/{interrupt.pk}/approve/", {}, format="json")

    assert (own.status_code, other.status_code) == (403, 200)


def test_an_approver_cannot_settle_the_unknown_outcome_of_their_own_run(people, worker, monkeypatch):
    from django.core.exceptions import PermissionDenied

    from approvals.services import reconcile_interrupt

    def times_out(ctx, args):
        raise ToolTimeout("bank did not answer")

    monkeypatch.setitem(registry._TOOLS, "wire_transfer", Tool(
        name="wire_transfer", description="Send money.", handler=times_out, side_effect=True,
        parameters={"type": "object", "properties": {"amount": {"type": "number"}}}))
    people["requester"].groups.add(Group.objects.get(name="approvers"))
    call = {"name": "wire_transfer", "arguments": json.dumps({"amount": 10})}
    agent = create_agent(slug="wire", name="Wire", tools=["wire_transfer"],
                         model={"provider": "scripted", "turns": [{"tool_calls": [call]}, {"content": "Sent."}]})
    run = run_to_rest(worker, agent, people["requester"])
    item = run.interrupts.get(kind="reconciliation")

    with pytest.raises(PermissionDenied):
        reconcile_interrupt(interrupt=item, user=people["requester"], succeeded=True, evidence="trust me")
    reconcile_interrupt(interrupt=item, user=people["approver"], succeeded=False, evidence="bank statement")
    assert item.allow_requester is False


register(Tool(
    name="test_self_service_note",
    description="Test tool: a side effect whose requester may approve it (four eyes waived).",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "additionalProperties": False},
    handler=lambda ctx, args: {"noted": args.get("text", "")},
    side_effect=True,
    approval="always",
    allow_requester_approval=True,
))


def test_a_tool_that_waives_four_eyes_lets_the_requester_decide_and_says_so(people, api, worker):
    people["requester"].groups.add(Group.objects.get(name="approvers"))
    call = {"name": "test_self_service_note", "arguments": json.dumps({"text": "hi"})}
    agent = create_agent(slug="self-service", name="Self service", tools=["test_self_service_note"],
                         model={"provider": "scripted", "turns": [{"tool_calls": [call]}, {"content": "Noted."}]})
    run = run_to_rest(worker, agent, people["requester"])
    interrupt = run.interrupts.get()

    response = api(people["requester"]).post(f"/api/interrupts/{interrupt.pk}/approve/", {}, format="json")

    assert response.status_code == 200
    requested = run.events.get(type="interrupt", to_status="pending")
    assert "no four eyes" in requested.reason and requested.payload["allow_requester"] is True


def test_read_only_tools_keep_letting_the_requester_decide():
    from tools.registry import get_tool

    assert get_tool("fake_lookup").requester_may_decide is True
    assert get_tool("fake_transfer").requester_may_decide is False
    assert FAKE_NOTICE.requester_may_decide is False
