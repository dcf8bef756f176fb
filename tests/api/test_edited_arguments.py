"""An approver may edit arguments, but not past the tool's schema or precondition."""

from tests.support.api import error_of, field_errors, pending_interrupts, start_run


def test_approver_cannot_edit_arguments_past_the_precondition(worker, people, api, asking):
    requester, approver = api(people["requester"]), api(people["approver"])
    run = start_run(requester, asking)
    worker.drain()
    interrupt, = pending_interrupts(approver, run["id"])

    response = approver.post(f"/api/interrupts/{interrupt['id']}/approve/",
                             {"arguments": {"account": "acme", "amount": 500}}, format="json")
    assert "Account acme cannot take 500" in error_of(response, 400)["message"]
    assert pending_interrupts(approver, run["id"])[0]["status"] == "pending"


def test_misspelt_edit_field_is_refused_not_ignored(worker, people, api, asking):
    requester, approver = api(people["requester"]), api(people["approver"])
    run = start_run(requester, asking)
    worker.drain()
    interrupt, = pending_interrupts(approver, run["id"])

    response = approver.post(f"/api/interrupts/{interrupt['id']}/approve/",
                             {"edited_arguments": {"account": "acme", "amount": 10}}, format="json")
    assert field_errors(response) == {"edited_arguments": ["Unknown field."]}
    assert pending_interrupts(approver, run["id"])[0]["status"] == "pending"
