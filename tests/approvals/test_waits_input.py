"""ask_user: a run waits ``input`` on a question to its requester; the answer is the tool result."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from approvals.models import Interrupt
from runs.models import Run, Step
from tests.support.api import events, field_errors, get_run, pending_interrupts, start_run, tool_calls
from tests.support.waits import sweep_later, tool_result, waiting_agent
from tools.models import Wait

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = {"name": "ask_user", "arguments": {"question": "Which account, A or B?", "options": ["A", "B"]}}


@pytest.fixture
def asking_agent(people, api):
    return waiting_agent(api(people["admin"]), "asks-account", QUESTION, final="Using the account you chose.")


def _asked(worker, requester, agent) -> tuple[dict, dict]:
    run = start_run(requester, agent, "Move my savings.")
    worker.drain()
    run = get_run(requester, run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "input")
    item, = pending_interrupts(requester, run["id"])
    return run, item


def _answered_with(run_id: int, answer: str, by: str) -> None:
    """The run completed, and the model's second turn read the answer as the question's tool result."""
    run = Run.objects.get(pk=run_id)
    assert (run.status, run.outcome) == ("completed", "achieved")
    assert tool_result(run_id, "ask_user") == {"status": "succeeded", "result": {"answer": answer, "answered_by": by}}
    answer_message = run.messages.get(role="tool")
    second_turn = Step.objects.get(run=run, index=1)
    assert second_turn.request["last_message_id"] >= answer_message.pk  # sent to the model with the answer


def test_question_answered_through_the_api_resumes_the_run_with_the_answer(worker, people, api, asking_agent):
    requester = api(people["requester"])
    run, item = _asked(worker, requester, asking_agent)
    assert (item["kind"], item["title"], item["can_decide"]) == ("input", "Which account, A or B?", True)
    assert item["tool_call"]["arguments"]["options"] == ["A", "B"]
    assert (run["waiting_for"]["kind"], run["waiting_for"]["interrupt"]) == ("input", item["id"])

    refused = requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": "C"}, format="json")
    assert refused.status_code == 400
    assert "answer" in field_errors(refused)
    assert Interrupt.objects.get(pk=item["id"]).status == "pending"

    answered = requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": "B"}, format="json")
    assert answered.status_code == 200, answered.json()
    assert (answered.json()["status"], answered.json()["decision"]) == ("resolved", "answered")
    worker.drain()

    _answered_with(run["id"], "B", "requester")
    again = requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": "A"}, format="json")
    assert again.status_code == 409
    kinds = [e["type"] for e in events(requester, run["id"])]
    assert kinds.count("wait") == 2  # opened, done


def test_question_answered_on_the_item_page(worker, people, api, asking_agent):
    run, item = _asked(worker, api(people["requester"]), asking_agent)
    browser = Client()
    browser.force_login(people["requester"])
    assert f'href="/inbox/{item["id"]}/"' in browser.get("/inbox/").content.decode()  # addressed to the requester
    assert "Which account, A or B?" in browser.get(f"/runs/{run['id']}/").content.decode()

    page = browser.get(f"/inbox/{item['id']}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Which account, A or B?" in html
    assert 'name="answer" value="A"' in html and 'name="answer" value="B"' in html

    wrong = browser.post(f"/inbox/{item['id']}/", {"answer": "Z"})
    assert wrong.status_code == 400
    assert "Choose one of: A, B." in wrong.content.decode()

    chosen = browser.post(f"/inbox/{item['id']}/", {"answer": "A"})
    assert chosen.status_code == 302
    assert chosen["Location"] == f"/runs/{run['id']}/"
    worker.drain()
    _answered_with(run["id"], "A", "requester")


def test_staff_may_answer_but_other_users_and_approvals_may_not(worker, people, api, asking_agent):
    run, item = _asked(worker, api(people["requester"]), asking_agent)
    stranger = get_user_model().objects.create_user("stranger", password="a-long-and-unusual-passphrase-42")

    assert api(stranger).post(f"/api/interrupts/{item['id']}/respond/", {"answer": "A"},
                              format="json").status_code == 404
    assert api(people["approver"]).post(f"/api/interrupts/{item['id']}/respond/", {"answer": "A"},
                                      format="json").status_code == 403
    assert api(people["admin"]).post(f"/api/interrupts/{item['id']}/approve/", {}, format="json").status_code == 400
    assert Interrupt.objects.get(pk=item["id"]).status == "pending"

    answered = api(people["admin"]).post(f"/api/interrupts/{item['id']}/respond/", {"answer": "A"}, format="json")
    assert answered.status_code == 200
    worker.drain()
    _answered_with(run["id"], "A", "admin")


def test_free_text_question_takes_any_non_empty_answer(worker, people, api):
    requester = api(people["requester"])
    agent = waiting_agent(api(people["admin"]), "asks-freely", {"name": "ask_user", "arguments": {"question": "Why?"}})
    run, item = _asked(worker, requester, agent)
    assert requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": "  "}, format="json").status_code == 400
    assert requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": "Gift", "file": "x"},
                          format="json").status_code == 400  # unknown field
    assert requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": " Gift "},
                          format="json").status_code == 200
    worker.drain()
    _answered_with(run["id"], "Gift", "requester")


def test_unanswered_question_expires_and_the_run_goes_on_without_the_answer(worker, people, api, asking_agent,
                                                                             settings):
    requester = api(people["requester"])
    run, item = _asked(worker, requester, asking_agent)
    ttl_s = settings.TOLLGATE["INPUT_TTL_HOURS"] * 3600

    assert sweep_later(ttl_s - 60)["woken"] == 0  # not due yet
    assert Run.objects.get(pk=run["id"]).status == "waiting"
    assert sweep_later(ttl_s + 60)["woken"] == 1
    worker.drain()

    assert Interrupt.objects.get(pk=item["id"]).status == "expired"
    assert Wait.objects.get(run_id=run["id"]).status == "timed_out"
    call, = tool_calls(requester, run["id"])
    assert (call["status"], call["error"]) == ("failed", "No answer came before the question expired.")
    assert tool_result(run["id"], "ask_user")["error"] == "No answer came before the question expired."
    run = get_run(requester, run["id"])
    # The run went on: the model answered after reading the failure; the unanswered question is what it lacked.
    assert (run["status"], run["outcome"], run["model_calls"]) == ("completed", "not_achieved", 2)
    assert "ask_user" in run["outcome_reason"] and "No answer came" in run["outcome_reason"]
    late = requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": "A"}, format="json")
    assert late.status_code == 409


def test_cancelling_a_run_that_waits_for_an_answer_closes_the_question(worker, people, api, asking_agent):
    requester = api(people["requester"])
    run, item = _asked(worker, requester, asking_agent)
    assert requester.post(f"/api/runs/{run['id']}/cancel/", {}, format="json").status_code == 200
    assert Interrupt.objects.get(pk=item["id"]).status == "cancelled"
    assert Wait.objects.get(run_id=run["id"]).status == "cancelled"
    assert requester.post(f"/api/interrupts/{item['id']}/respond/", {"answer": "A"},
                          format="json").status_code == 409
