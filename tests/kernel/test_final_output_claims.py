"""Issue 27: the model's last words are its claim; recorded facts that contradict them are named beside them.

The rule (``runs.selectors.final_output_status``) reads the outcome, the
calls' statuses and the approvers' edits, never the text. The run page,
the API's run and the ``run.completed`` webhook all show its answer.
"""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.api import get_run, pending_interrupts, start_run, tool_calls
from tests.support.core import core_agent, lookup, transfer, transfer_run
from tests.support.webhooks import subscribe, wait_settled

# How the run page marks a final text the records differ from.
MARK = "the records differ from a plain success: check it against them"
SENT_CLAIM = "60 has been sent to acme."
TRANSFER_CLAIM = "80 has been sent to acme."
REJECTION = "Finance wants the invoice first."


def rejected_transfer_run(people, api, worker, slug="claims-rejected") -> dict:
    """A finished run whose transfer a person rejected while the model's last words say it was sent."""
    agent = core_agent(api(people["admin"]), slug, [{"tool_calls": [lookup()]}, {"tool_calls": [transfer()]},
                                                    {"content": SENT_CLAIM}])
    run = start_run(api(people["requester"]), agent["slug"], "Send 60 to acme.")
    worker.drain()
    approver = api(people["approver"])
    item, = pending_interrupts(approver, run["id"])
    response = approver.post(f"/api/interrupts/{item['id']}/reject/", {"comment": REJECTION}, format="json")
    assert response.status_code == 200, response.json()
    worker.drain()
    return get_run(api(people["requester"]), run["id"])


def claimed_transfer_run(people, api, worker, slug: str, decide: dict | None = None, turns=None,
                         account: str = "acme") -> dict:
    """A run of a transfer of 80 to ``account`` with the claim ``TRANSFER_CLAIM``; ``decide``: the approval's
    body (approve as proposed if None)."""
    return transfer_run(people, api, worker, slug, turns or [
        {"tool_calls": [lookup()]}, {"tool_calls": [transfer(account, 80)]}, {"content": TRANSFER_CLAIM}],
        decide=decide)


def test_a_rejected_transfer_makes_the_models_sent_claim_contradicted_in_the_api(worker, people, api):
    run = rejected_transfer_run(people, api, worker)

    assert (run["status"], run["outcome"], run["final_output"]) == ("completed", "not_achieved", SENT_CLAIM)
    send, = [call for call in tool_calls(api(people["requester"]), run["id"]) if call["name"] == "fake_transfer"]
    status = run["final_output_status"]
    assert status["code"] == "contradicted"
    outcome, call = status["conflicts"]
    assert outcome == {"code": "outcome_not_achieved", "status": "not_achieved", "detail": run["outcome_reason"],
                       "tool_call": None, "tool": "", "changes": []}
    assert {key: call[key] for key in ("code", "status", "tool_call", "tool", "changes")} == {
        "code": "call_without_effect", "status": "rejected", "tool_call": send["id"], "tool": "fake_transfer",
        "changes": []}
    assert REJECTION in call["detail"]


def test_the_run_page_shows_the_rejected_transfers_claim_as_contradicted_beside_the_facts(worker, people, api,
                                                                                        client):
    run = rejected_transfer_run(people, api, worker)
    send, = [call for call in tool_calls(api(people["requester"]), run["id"]) if call["name"] == "fake_transfer"]

    client.force_login(people["requester"])
    page = client.get(f"/runs/{run['id']}/").content.decode()

    start = page.index('id="run-final"')
    final = page[start:page.index("</section>", start)]  # the summary card's end
    assert 'data-final-output-status="contradicted"' in final
    assert "The model's claim" in final and MARK in final
    claim = final[final.index('id="run-final-output"'):final.index('id="run-facts"')]
    assert SENT_CLAIM in claim
    facts = final[final.index('id="run-facts"'):]
    assert 'data-code="outcome_not_achieved"' in facts and "not achieved" in facts
    call_fact = facts[facts.index(f'data-tool-call="{send["id"]}"'):]
    assert 'data-code="call_without_effect"' in facts
    assert "fake_transfer" in call_fact and "rejected" in call_fact and REJECTION in call_fact


def test_an_amount_edited_by_the_approver_contradicts_the_claimed_amount(worker, people, api, client):
    run = claimed_transfer_run(people, api, worker, "claims-edited",
                               decide={"arguments": {"account": "acme", "amount": 20}})

    assert (run["status"], run["outcome"], run["final_output"]) == ("completed", "achieved", TRANSFER_CLAIM)
    sent, = [call for call in tool_calls(api(people["requester"]), run["id"]) if call["name"] == "fake_transfer"]
    assert sent["result"]["amount"] == 20
    status = run["final_output_status"]
    assert status["code"] == "contradicted"
    edited, = status["conflicts"]
    assert (edited["code"], edited["status"], edited["tool_call"], edited["tool"]) == (
        "arguments_edited", "succeeded", sent["id"], "fake_transfer")
    assert edited["changes"] == [{"path": "/amount", "field": "amount", "change": "changed",
                                  "proposed": 80, "approved": 20}]

    client.force_login(people["requester"])
    page = client.get(f"/runs/{run['id']}/").content.decode()
    start = page.index('id="run-facts"')
    facts = page[start:page.index("</section>", start)]
    assert 'data-code="arguments_edited"' in facts and "executed with arguments a person changed" in facts
    assert '<del class="proposed">80</del>' in facts and '<ins class="approved">20</ins>' in facts


def test_a_transfer_approved_as_proposed_leaves_the_claim_uncontradicted(worker, people, api, client):
    run = claimed_transfer_run(people, api, worker, "claims-approved")

    assert (run["status"], run["outcome"]) == ("completed", "achieved")
    assert run["final_output_status"] == {"code": "not_contradicted", "conflicts": []}
    client.force_login(people["requester"])
    page = client.get(f"/runs/{run['id']}/").content.decode()
    assert 'data-final-output-status="not_contradicted"' in page
    assert "The model's final words" in page and 'id="run-facts"' not in page
    assert MARK not in page


def test_a_refused_transfer_the_model_then_corrected_on_the_same_account_contradicts_nothing(worker, people, api):
    too_much = transfer(amount=500)  # over the account's limit: denied
    fits = transfer(amount=5)  # under 10: no approval
    run = claimed_transfer_run(people, api, worker, "claims-corrected",
                               turns=[{"tool_calls": [too_much]}, {"tool_calls": [fits]}, {"content": "Sent 5."}])

    first, second = tool_calls(api(people["requester"]), run["id"])
    assert (first["status"], second["status"]) == ("denied", "succeeded")
    assert (run["outcome"], run["final_output_status"]) == ("achieved", {"code": "not_contradicted", "conflicts": []})


def test_a_run_without_final_text_has_nothing_to_contradict(worker, people, api):
    agent = core_agent(api(people["admin"]), "claims-waiting", [{"tool_calls": [transfer(amount=80)]},
                                                                {"content": TRANSFER_CLAIM}])
    run = start_run(api(people["requester"]), agent["slug"])
    worker.drain()
    run = get_run(api(people["requester"]), run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "approval")
    assert run["final_output_status"] == {"code": "absent", "conflicts": []}


def test_the_run_completed_webhook_carries_the_contradicted_claim(worker, people, api, receiver, webhook_settings):
    subscription = subscribe(people["requester"], receiver, "run.completed")
    run = rejected_transfer_run(people, api, worker, slug="wh-claims-rejected")

    delivery, = wait_settled(subscription, 1)
    body, = receiver.bodies()
    assert body["type"] == "run.completed" and body["data"]["run"] == run["id"]
    assert body["data"]["outcome"] == "not_achieved"
    assert body["data"]["final_output_status"] == run["final_output_status"]
    assert [c["code"] for c in body["data"]["final_output_status"]["conflicts"]] == [
        "outcome_not_achieved", "call_without_effect"]


def test_listing_runs_with_claims_costs_the_same_queries_for_two_runs_or_five(worker, people, api):
    requester = api(people["requester"])

    def listing() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            page = requester.get("/api/runs/").json()["results"]
        assert {run["final_output_status"]["code"] for run in page} == {"contradicted"}
        return len(page), len(queries)

    for number in range(5):  # an account each: one account takes at most 100 in all
        account = f"acct-{number}"
        claimed_transfer_run(people, api, worker, f"claims-list-{number}", account=account,
                             decide={"arguments": {"account": account, "amount": 10}})
        if number == 1:
            two = listing()
    five = listing()
    assert (two[0], five[0]) == (2, 5)
    assert two[1] == five[1]
