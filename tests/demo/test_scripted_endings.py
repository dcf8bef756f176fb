"""The demo agents' scripted endings (``content_by_status``): after an approval, an edit, a rejection and a
refusal, each says what happened. The provider itself: tests/engine/test_scripted_endings.py."""

from runs.providers.scripted import config_problems
from tests.support.api import get_run, pending_interrupts, start_run


def test_the_demo_agents_scripts_pass_the_checks():
    from tools.demo.data import DEMO_AGENTS

    assert [config_problems(agent["model"]) for agent in DEMO_AGENTS] == [[]] * len(DEMO_AGENTS)


def finish(demo, api, worker, agent: str, decision: str = "", body: dict | None = None) -> dict:
    """Run demo agent ``agent`` as the requester; decide its approval (``approve`` / ``reject``) if it asks."""
    requester, approver = api(demo["requester"]), api(demo["approver"])
    run = start_run(requester, agent)
    worker.drain()
    if decision:
        item, = pending_interrupts(approver, run["id"])
        response = approver.post(f"/api/interrupts/{item['id']}/{decision}/", body or {}, format="json")
        assert response.status_code == 200, response.json()
        worker.drain()
    run = get_run(requester, run["id"])
    assert run["status"] == "completed", run
    return run


def test_demo_refund_approved_says_what_was_refunded(worker, demo, api):
    run = finish(demo, api, worker, "refund-order", "approve")
    assert (run["outcome"], run["final_output"]) == ("achieved", "A refund of 80.00 for order 123 has been issued.")


def test_demo_refund_edited_down_says_the_amount_actually_refunded(worker, demo, api):
    run = finish(demo, api, worker, "refund-order", "approve", {"arguments": {"order_id": 123, "amount": 20}})
    assert run["outcome"] == "achieved"
    assert run["final_output"] == ("A refund of 20.00 for order 123 has been issued "
                                   "(the approver changed what I proposed).")


def test_demo_refund_rejected_says_nothing_was_refunded(worker, demo, api):
    run = finish(demo, api, worker, "refund-order", "reject", {"comment": "Item was used."})
    assert run["outcome"] == "not_achieved"
    assert run["final_output"] == ("The refund for order 123 was not approved, so nothing has been refunded. "
                                   "A person rejected this call. Comment: Item was used.")


def test_demo_refund_denied_says_why(worker, demo, api):
    finish(demo, api, worker, "refund-order", "approve")  # 80.00 of 120.00 refunded: 40.00 left
    run = finish(demo, api, worker, "refund-order")  # refused by the precondition: no approval asked
    assert run["outcome"] == "not_achieved"
    assert run["final_output"] == ("Order 123 cannot be refunded as asked, so nothing has been refunded: "
                                   "Order 123 is not refundable for 80: at most 40.00 can be refunded.")


def test_demo_contract_email_approved_and_rejected(worker, demo, api):
    sent = finish(demo, api, worker, "send-contract-email", "approve")
    assert sent["final_output"] == "The contract email has been sent to customer@example.com."
    refused = finish(demo, api, worker, "send-contract-email", "reject", {"comment": "Not this week."})
    assert refused["final_output"] == ("The contract email was not sent: it was not approved. "
                                       "A person rejected this call. Comment: Not this week.")


def test_demo_cancel_of_a_shipped_order_is_denied_and_says_so(worker, demo, api):
    run = finish(demo, api, worker, "cancel-order")
    assert run["outcome"] == "not_achieved"
    assert run["final_output"] == ("I'm sorry, I could not cancel order 124: "
                                   "Order 124 has already shipped and cannot be cancelled.")
