"""One business action is one action: a re-proposal is linked to the original, never done or asked twice."""

import json

from approvals.models import Interrupt
from runs.engine.lifecycle import start_run as start_run_as
from runs.models import Message
from tests.support.durability import make_agent
from tools import registry
from tools.registry import Tool
from tests.support.api import error_of, events, get_run, pending_interrupts, start_run, tool_calls
from tests.support.core import core_agent, transfer
from tests.support.fake_tools import transfers
from tools.models import ToolCall

TRANSFER_60 = transfer("acme", 60)
TRANSFER_60_REORDERED = {"name": "fake_transfer", "arguments": "{\"amount\": 60.0, \"account\": \"acme\"}"}


def approve_all(approver, run_id):
    items = pending_interrupts(approver, run_id)
    for item in items:
        response = approver.post(f"/api/interrupts/{item['id']}/approve/", {}, format="json")
        assert response.status_code == 200, response.json()
    return items


def test_transfer_proposed_again_after_it_succeeded_reuses_the_result_one_item_one_charge(worker, people, api):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = core_agent(admin, "twice-in-sequence", [
        {"tool_calls": [TRANSFER_60]}, {"tool_calls": [TRANSFER_60_REORDERED]}, {"content": "Sent 60."}],
        completion_check="default")
    run = start_run(requester, agent["slug"])
    worker.drain()
    assert len(approve_all(approver, run["id"])) == 1
    worker.drain()

    run = get_run(requester, run["id"])
    first, second = tool_calls(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "achieved")
    assert (first["status"], second["status"]) == ("succeeded", "succeeded")
    assert second["duplicate_of"] == first["id"] and first["duplicate_of"] is None
    assert second["result"] == first["result"] and second["attempts"] == 0
    assert Interrupt.objects.filter(run_id=run["id"]).count() == 1
    assert len(transfers()) == 1
    assert any(e["reason"] == f"same action as #{first['id']}: result reused" for e in events(requester, run["id"]))
    # The model's next request was told the result is the earlier call's, not a new effect.
    told = json.loads(Message.objects.get(run_id=run["id"], role="tool", tool_call_id=second["provider_call_id"]).content)
    assert told["reused"]["tool_call"] == first["id"] and told["reused"]["run"] == run["id"]
    assert told["result"] == first["result"]
    assert run["outcome_reason"] == (f"done: fake_transfer #{first['id']} succeeded; "
                                     f"reused: fake_transfer #{second['id']} (result of #{first['id']})")


def test_transfer_proposed_twice_in_one_turn_waits_on_one_decision(worker, people, api):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = core_agent(admin, "twice-in-a-turn", [
        {"tool_calls": [TRANSFER_60, TRANSFER_60_REORDERED]}, {"content": "Sent 60."}], completion_check="default")
    run = start_run(requester, agent["slug"])
    worker.drain()

    first, second = tool_calls(requester, run["id"])
    assert (first["status"], second["status"]) == ("awaiting_approval", "proposed")
    assert second["duplicate_of"] == first["id"]
    assert len(approve_all(approver, run["id"])) == 1
    worker.drain()

    run = get_run(requester, run["id"])
    first, second = tool_calls(requester, run["id"])
    assert (run["status"], run["outcome"]) == ("completed", "achieved")
    assert (first["status"], second["status"]) == ("succeeded", "succeeded")
    assert len(transfers()) == 1


def test_rejected_twin_in_one_turn_ends_rejected_too(worker, people, api):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = core_agent(admin, "twins-rejected", [
        {"tool_calls": [TRANSFER_60, TRANSFER_60]}, {"content": "Sorry."}], completion_check="default")
    run = start_run(requester, agent["slug"])
    worker.drain()
    item, = pending_interrupts(approver, run["id"])
    approver.post(f"/api/interrupts/{item['id']}/reject/", {"comment": "no"}, format="json")
    worker.drain()

    first, second = tool_calls(requester, run["id"])
    assert (first["status"], second["status"]) == ("rejected", "rejected")
    assert f"Same action as call #{first['id']}" in second["error"]
    assert get_run(requester, run["id"])["outcome"] == "not_achieved"


def test_transfer_proposed_again_after_a_rejection_is_a_new_attempt_with_its_own_item(worker, people, api):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = core_agent(admin, "again-after-rejection", [
        {"tool_calls": [TRANSFER_60]}, {"tool_calls": [TRANSFER_60]}, {"content": "Sent 60."}],
        completion_check="default")
    run = start_run(requester, agent["slug"])
    worker.drain()
    item, = pending_interrupts(approver, run["id"])
    approver.post(f"/api/interrupts/{item['id']}/reject/", {"comment": "check with the customer"}, format="json")
    worker.drain()
    assert len(approve_all(approver, run["id"])) == 1  # a second item, for the second proposal
    worker.drain()

    run = get_run(requester, run["id"])
    first, second = tool_calls(requester, run["id"])
    assert (first["status"], second["status"]) == ("rejected", "succeeded")
    assert second["duplicate_of"] is None
    assert Interrupt.objects.filter(run_id=run["id"]).count() == 2
    assert len(transfers()) == 1
    assert (run["status"], run["outcome"]) == ("completed", "achieved")  # the later success supersedes


def test_a_follow_up_run_in_the_same_session_does_not_transfer_again(worker, people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    small = transfer("acme", 5)
    agent = core_agent(admin, "follow-up", [
        {"tool_calls": [small]}, {"content": "Sent."}, {"tool_calls": [small]}, {"content": "Sent again?"}],
        completion_check="default")
    first_run = start_run(requester, agent["slug"])
    worker.drain()
    response = requester.post("/api/runs/", {"agent": agent["slug"], "input": "Send 5 to acme please.",
                                             "session": first_run["session"]}, format="json")
    assert response.status_code == 201, response.json()
    worker.drain()

    second_run = get_run(requester, response.json()["id"])
    original, = tool_calls(requester, first_run["id"])
    repeat, = tool_calls(requester, second_run["id"])
    assert repeat["duplicate_of"] == original["id"] and repeat["status"] == "succeeded"
    assert len(transfers()) == 1
    assert second_run["outcome"] == "achieved"


def test_the_inbox_item_says_the_action_was_proposed_again(worker, people, api, client):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = core_agent(admin, "inbox-twins", [{"tool_calls": [TRANSFER_60, TRANSFER_60]}, {"content": "ok"}],
                         completion_check="default")
    run = start_run(requester, agent["slug"])
    worker.drain()
    item, = pending_interrupts(approver, run["id"])
    twin = ToolCall.objects.get(run_id=run["id"], duplicate_of__isnull=False)

    client.force_login(people["approver"])
    page = client.get(f"/inbox/{item['id']}/").content.decode()
    assert f"again as call #{twin.pk}" in page
    assert "×2" in client.get("/inbox/").content.decode()
    client.force_login(people["requester"])
    assert f"same action as #{twin.duplicate_of_id}" in client.get(f"/runs/{run['id']}/").content.decode()


def approve_with(approver, run_id, arguments):
    item, = pending_interrupts(approver, run_id)
    response = approver.post(f"/api/interrupts/{item['id']}/approve/", {"arguments": arguments}, format="json")
    assert response.status_code == 200, response.json()


def test_after_an_edit_the_approved_arguments_are_the_action_and_are_not_asked_for_again(worker, people, api):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = core_agent(admin, "edited-identity", [
        {"tool_calls": [TRANSFER_60]}, {"tool_calls": [transfer("acme", 40)]},
        {"content": "Sent 40."}], completion_check="default")
    run = start_run(requester, agent["slug"])
    worker.drain()
    approve_with(approver, run["id"], {"account": "acme", "amount": 40})
    worker.drain()

    first, second = tool_calls(requester, run["id"])
    assert second["duplicate_of"] == first["id"] and second["status"] == "succeeded"
    assert Interrupt.objects.filter(run_id=run["id"]).count() == 1, "the approver is not asked twice"
    assert len(transfers()) == 1


def test_after_an_edit_the_proposed_arguments_are_a_new_action_that_needs_a_person(worker, people, api):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    agent = core_agent(admin, "edited-then-original", [
        {"tool_calls": [TRANSFER_60]}, {"content": "Sent 40."}, {"tool_calls": [TRANSFER_60]}, {"content": "ok"}],
        completion_check="default")
    run = start_run(requester, agent["slug"])
    worker.drain()
    approve_with(approver, run["id"], {"account": "acme", "amount": 40})
    worker.drain()
    response = requester.post("/api/runs/", {"agent": agent["slug"], "input": "I need 60 sent to acme.",
                                             "session": run["session"]}, format="json")
    worker.drain()

    call, = tool_calls(requester, response.json()["id"])
    assert call["duplicate_of"] is None and call["status"] == "awaiting_approval"
    assert len(pending_interrupts(approver, response.json()["id"])) == 1


def _counting_tool(monkeypatch, name: str, same_action, approval: str = "never") -> list:
    """Register side-effecting tool ``name`` (arguments room, date, note) deduplicated by ``same_action``;
    returns the list of the arguments it was called with."""
    sent = []

    def handler(ctx, arguments):
        sent.append(arguments)
        return {"booked": arguments["room"], "number": len(sent)}

    parameters = {"type": "object", "properties": {key: {"type": "string"} for key in ("room", "date", "note")},
                  "required": ["room", "date"], "additionalProperties": False}
    monkeypatch.setitem(registry._TOOLS, name, Tool(name=name, description=name, parameters=parameters,
                                                    handler=handler, side_effect=True, same_action=same_action,
                                                    approval=approval))
    return sent


def _booking(tool: str, note: str) -> dict:
    return {"tool_calls": [{"name": tool, "arguments": {"room": "A", "date": "2026-12-24", "note": note}}]}


def test_a_business_key_makes_calls_with_other_arguments_one_action_and_other_keys_two(worker, people, monkeypatch):
    """Room A on 24 Dec is booked once per user, whatever the note says, in any session."""
    sent = _counting_tool(monkeypatch, "book_room", lambda ctx, a: f"{ctx.user.pk}/{a['room']}/{a['date']}")
    agent = make_agent("booker", [_booking("book_room", "window"), _booking("book_room", "aisle"), {"content": "Booked."}],
                       tools=["book_room"])
    first_run = start_run_as(agent=agent, user=people["requester"], input="book")
    worker.drain()
    first, again = ToolCall.objects.filter(run=first_run).order_by("id")
    assert (first.status, again.status, again.duplicate_of_id) == ("succeeded", "succeeded", first.pk)
    assert len(sent) == 1  # other arguments (the note), the same key: one action

    other_session = start_run_as(agent=agent, user=people["requester"], input="book again")
    worker.drain()
    assert {call.duplicate_of_id for call in ToolCall.objects.filter(run=other_session)} == {first.pk}
    assert len(sent) == 1  # the key spans sessions

    other_user = start_run_as(agent=agent, user=people["approver"], input="book for me")
    worker.drain()
    mine, mine_again = ToolCall.objects.filter(run=other_user).order_by("id")
    assert (mine.duplicate_of_id, mine_again.duplicate_of_id) == (None, mine.pk)
    assert len(sent) == 2  # the same arguments, another key: a second action
    assert mine.idempotency_key.startswith("book_room-k-") and mine.idempotency_key != first.idempotency_key


def test_a_run_scoped_action_is_done_once_per_run_and_again_in_a_later_run_of_the_session(worker, people,
                                                                                        monkeypatch):
    sent = _counting_tool(monkeypatch, "send_report", "run")
    agent = make_agent("reporter", [_booking("send_report", "x"), _booking("send_report", "x"), {"content": "Sent."}],
                       tools=["send_report"])
    run = start_run_as(agent=agent, user=people["requester"], input="report")
    worker.drain()
    first, again = ToolCall.objects.filter(run=run).order_by("id")
    assert again.duplicate_of_id == first.pk and len(sent) == 1

    follow_up = start_run_as(agent=agent, user=people["requester"], input="report again", session=run.session)
    worker.drain()
    calls = list(ToolCall.objects.filter(run=follow_up).order_by("id"))
    assert calls[0].duplicate_of_id is None and calls[1].duplicate_of_id == calls[0].pk
    assert len(sent) == 2  # a later run of the session sends it again


def test_an_edit_whose_business_key_cannot_be_computed_is_refused_and_the_item_stays_pending(worker, people, api,
                                                                                          monkeypatch):
    """The key function is the integrator's code: what it raises on an approver's edit is a 400, not a 500."""
    sent = _counting_tool(monkeypatch, "book_hall", lambda ctx, a: {"x": "hall"}[a["note"]], approval="always")
    agent = make_agent("hall-booker", [_booking("book_hall", "x"), {"content": "Booked."}], tools=["book_hall"])
    run = start_run_as(agent=agent, user=people["requester"], input="book the hall")
    worker.drain()
    approver = api(people["approver"])
    item, = pending_interrupts(approver, run.pk)

    response = approver.post(f"/api/interrupts/{item['id']}/approve/",
                             {"arguments": {"room": "A", "date": "2026-12-24", "note": "y"}}, format="json")
    message = error_of(response, 400)["message"]
    assert "business key could not be computed" in message and "KeyError" in message and "'y'" not in message
    assert pending_interrupts(approver, run.pk)[0]["status"] == "pending" and sent == []
