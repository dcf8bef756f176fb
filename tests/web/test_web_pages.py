"""Browser pages through Django's test client: login, inbox, item, run pages.

Model-produced text must always reach the page escaped; these tests put
``<script>`` into the model's answer and its tool-call arguments.
"""

import re

import pytest
from bs4 import BeautifulSoup
from django.urls import reverse

from approvals.models import Interrupt, InterruptStatus
from runs.models import Agent, Run, RunStatus
from runs.engine.lifecycle import start_run
from tests.support.core import asking_agent, refused_agent
from tests.support.web import unanswered_agent, unanswered_transfer, waiting_transfer  # noqa: F401 (a fixture)

SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def xss_agent(people):
    """An agent whose scripted model writes markup into its answer and into approval arguments."""
    return Agent.objects.create(
        slug="xss", name="Markup", tools=["fake_lookup"], completion_check="default",
        approval_policy={"fake_lookup": "always"},
        model={"provider": "scripted", "turns": [
            {"content": f"Checking {SCRIPT}", "tool_calls": [{"name": "fake_lookup", "arguments": {"key": SCRIPT}}]},
            {"content": f"Done {SCRIPT}"},
        ]},
    )


def test_pages_require_login(client, people):
    for name in ["inbox", "run-list", "run-start"]:
        response = client.get(reverse(name))
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert client.get("/").status_code == 302


def test_root_redirects_to_inbox(client, people):
    client.force_login(people["approver"])
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == reverse("inbox")


@pytest.mark.parametrize(("username", "landing"), [("approver", "inbox"), ("admin", "inbox"),
                                                     ("requester", "run-list")])
def test_login_lands_deciders_on_the_inbox_and_requesters_on_their_runs(client, people, username, landing):
    people[username].set_password(f"{username}-secret")
    people[username].save()
    assert client.get(reverse("login")).status_code == 200
    response = client.post(reverse("login"), {"username": username, "password": f"{username}-secret"})
    assert response.status_code == 302
    response = client.get(response["Location"])  # "/" decides who lands where
    assert response.status_code == 302 and response["Location"] == reverse(landing)
    assert client.get(reverse(landing)).status_code == 200


def test_the_start_form_names_the_agents_and_preselects_none(client, people):
    agent = asking_agent()
    Agent.objects.filter(pk=agent.pk).update(name="Send 80", instructions="Look acme up, then send it 80.")
    agent.refresh_from_db()
    client.force_login(people["requester"])
    body = client.get(reverse("run-start")).content.decode()
    assert re.search(r'<option value="" selected>\s*Choose an agent\s*</option>', body), body
    assert '<option value="send-80">' in body
    assert "selected" not in body.split('<option value="" selected>')[1].split("</select>")[0]
    assert f"{agent.name} (send-80)" in body
    # Each agent is described under the list: its name and what it does (its instructions).
    described = BeautifulSoup(body, "html.parser").select_one("#agent-descriptions")
    term = described.select_one('dt[data-agent="send-80"]')
    assert agent.name in term.get_text() and term.find_next_sibling("dd").get_text() == agent.instructions
    # Nothing chosen is refused, not started with some agent.
    response = client.post(reverse("run-start"), {"agent": "", "input": "please"})
    assert response.status_code in (200, 400) and "This field is required." in response.content.decode()


def test_inbox_lists_the_pending_approval_for_the_approver_only(client, people, worker):
    run = waiting_transfer(people, worker)
    item = run.interrupts.get()
    client.force_login(people["approver"])
    response = client.get(reverse("inbox"))
    assert response.status_code == 200
    body = response.content.decode()
    assert f'data-interrupt-id="{item.pk}"' in body and "fake_transfer" in body
    assert reverse("inbox-item", args=[item.pk]) in body

    client.force_login(people["requester"])  # no decide permission
    assert f'data-interrupt-id="{item.pk}"' not in client.get(reverse("inbox")).content.decode()


def test_approving_in_the_browser_resumes_the_run_to_completed(client, people, worker):
    run = waiting_transfer(people, worker)
    item = run.interrupts.get()
    client.force_login(people["approver"])
    page = client.get(reverse("inbox-item", args=[item.pk]))
    assert page.status_code == 200 and 'id="approve"' in page.content.decode()
    response = client.post(reverse("inbox-item", args=[item.pk]), {"decision": "approved", "comment": "ok",
                                                                  "edited_arguments": ""})
    assert response.status_code == 302 and response["Location"] == reverse("run-detail", args=[run.pk])
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    page = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert 'id="run-status" class="badge status-completed" data-status="completed"' in page

    again = client.post(reverse("inbox-item", args=[item.pk]), {"decision": "rejected", "comment": "late"})
    assert again.status_code == 409
    assert "already resolved" in again.content.decode()


def test_invalid_edited_arguments_keep_the_form_and_decide_nothing(client, people, worker):
    run = waiting_transfer(people, worker)
    item = run.interrupts.get()
    client.force_login(people["approver"])
    url = reverse("inbox-item", args=[item.pk])
    response = client.post(url, {"decision": "approved", "comment": "my comment", "edited_arguments": "{not json"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "Not valid JSON" in body and "my comment" in body and "{not json" in body
    response = client.post(url, {"decision": "approved", "edited_arguments": '{"account": "acme", "amount": "x"}'})
    assert response.status_code == 400 and "schema" in response.content.decode()
    item.refresh_from_db()
    assert item.status == InterruptStatus.PENDING


def test_approving_with_edited_arguments_records_them(client, people, worker):
    run = waiting_transfer(people, worker)
    item = run.interrupts.get()
    client.force_login(people["approver"])
    client.post(reverse("inbox-item", args=[item.pk]),
                {"decision": "approved", "edited_arguments": '{"account": "acme", "amount": 60}'})
    item.refresh_from_db()
    assert item.edited_arguments == {"account": "acme", "amount": 60}
    assert item.tool_call.arguments == {"account": "acme", "amount": 60}


def test_user_without_permission_gets_403_when_deciding(client, people, worker):
    run = waiting_transfer(people, worker)
    item = run.interrupts.get()
    client.force_login(people["requester"])  # sees the run (own), may not decide
    page = client.get(reverse("inbox-item", args=[item.pk]))
    assert page.status_code == 200 and 'id="approve"' not in page.content.decode()
    response = client.post(reverse("inbox-item", args=[item.pk]), {"decision": "approved"})
    assert response.status_code == 403
    item.refresh_from_db()
    assert item.status == InterruptStatus.PENDING


def test_model_text_is_escaped_on_every_page(client, people, worker, xss_agent):
    run = start_run(agent=xss_agent, user=people["requester"], input=f"user says {SCRIPT}")
    worker.drain()
    item = Interrupt.objects.get(run=run)
    client.force_login(people["approver"])
    for url in [reverse("inbox"), reverse("inbox-item", args=[item.pk]), reverse("run-detail", args=[run.pk]),
                reverse("run-list")]:
        body = client.get(url).content.decode()
        assert SCRIPT not in body, url
    item_page = client.get(reverse("inbox-item", args=[item.pk])).content.decode()
    assert ESCAPED in item_page  # in the arguments, the assistant's text and the user's input
    assert item_page.count("&lt;script&gt;") >= 3


def test_run_list_shows_own_runs_to_requesters_and_all_to_approvers(client, people, worker):
    from django.contrib.auth import get_user_model

    other = get_user_model().objects.create_user("other", password="x")
    mine = start_run(agent=refused_agent(), user=people["requester"], input="send 500 to acme")
    theirs = start_run(agent=refused_agent(), user=other, input="send 500 to acme")
    worker.drain()
    client.force_login(other)
    body = client.get(reverse("run-list")).content.decode()
    assert f'data-run-id="{theirs.pk}"' in body and f'data-run-id="{mine.pk}"' not in body
    assert client.get(reverse("run-detail", args=[mine.pk])).status_code == 404
    assert client.get(reverse("run-status", args=[mine.pk])).status_code == 404
    client.force_login(people["approver"])
    body = client.get(reverse("run-list")).content.decode()
    assert f'data-run-id="{theirs.pk}"' in body and f'data-run-id="{mine.pk}"' in body


def test_start_run_page_starts_a_run_and_shows_it(client, people, worker):
    client.force_login(people["requester"])
    asking_agent()
    page = client.get(reverse("run-start")).content.decode()
    assert 'value="send-80"' in page
    response = client.post(reverse("run-start"), {"agent": "send-80", "input": "Send 80 to acme"})
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run-detail", args=[run.pk])
    worker.drain()
    body = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    assert 'data-status="waiting"' in body and "Waiting in the inbox" in body
    status = client.get(reverse("run-status", args=[run.pk])).json()
    assert status["run"]["status"] == "waiting" and status["run"]["waiting_reason"] == "approval"

    empty = client.post(reverse("run-start"), {"agent": "send-80", "input": "   "})
    assert empty.status_code == 400 and Run.objects.count() == 1


def test_cancel_button_cancels_and_a_second_cancel_shows_the_cancelled_run(client, people, worker):
    run = waiting_transfer(people, worker)
    client.force_login(people["requester"])
    response = client.post(reverse("run-cancel", args=[run.pk]))
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.interrupts.get().status == InterruptStatus.CANCELLED
    events = run.events.count()
    again = client.post(reverse("run-cancel", args=[run.pk]))  # a second tab's button: nothing changes
    assert (again.status_code, again["Location"]) == (302, reverse("run-detail", args=[run.pk]))
    assert run.events.count() == events


def test_reconciliation_item_is_settled_in_the_browser_with_evidence(client, people, worker, unanswered_transfer,
                                                                     settings):
    from approvals.models import InterruptKind
    from tools.models import ToolCall, ToolCallStatus

    settings.TOLLGATE = {**settings.TOLLGATE, "RECONCILE_MAX_TRIES": 1}
    run = start_run(agent=unanswered_agent(), user=people["requester"], input="send 30 to acme")
    worker.drain()  # the bank errs, the hook finds nothing: the outcome is unknown, a person settles it
    item = Interrupt.objects.get(run=run, kind=InterruptKind.RECONCILIATION, status=InterruptStatus.PENDING)

    client.force_login(people["approver"])
    url = reverse("inbox-item", args=[item.pk])
    page = client.get(url).content.decode()
    assert 'id="reconcile-succeeded"' in page and 'id="approve"' not in page
    missing = client.post(url, {"outcome": "succeeded", "evidence": "  "})
    assert missing.status_code == 400
    response = client.post(url, {"outcome": "succeeded", "evidence": "bank statement shows the transfer",
                                 "result": '{"transfer_id": 7}'})
    assert response.status_code == 302
    worker.drain()
    run.refresh_from_db()
    assert ToolCall.objects.get(run=run, name="unanswered_transfer").status == ToolCallStatus.SUCCEEDED
    assert run.status == RunStatus.COMPLETED
