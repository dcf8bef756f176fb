"""An approver may edit arguments, but not past the tool's schema or precondition."""

from tests.support.api import error_of, field_errors, pending_interrupts, start_run


def test_approver_cannot_edit_arguments_past_the_precondition(worker, demo, api):
    requester, approver = api(demo["requester"]), api(demo["approver"])
    run = start_run(requester, "refund-order")
    worker.drain()
    interrupt, = pending_interrupts(approver, run["id"])

    response = approver.post(f"/api/interrupts/{interrupt['id']}/approve/",
                             {"arguments": {"order_id": 123, "amount": 500}}, format="json")
    assert "not refundable" in error_of(response, 400)["message"]
    assert pending_interrupts(approver, run["id"])[0]["status"] == "pending"


def test_misspelt_edit_field_is_refused_not_ignored(worker, demo, api):
    requester, approver = api(demo["requester"]), api(demo["approver"])
    run = start_run(requester, "refund-order")
    worker.drain()
    interrupt, = pending_interrupts(approver, run["id"])

    response = approver.post(f"/api/interrupts/{interrupt['id']}/approve/",
                             {"edited_arguments": {"order_id": 123, "amount": 10}}, format="json")
    assert field_errors(response) == {"edited_arguments": ["Unknown field."]}
    assert pending_interrupts(approver, run["id"])[0]["status"] == "pending"
