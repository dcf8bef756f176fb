"""The Django admin: every page renders, nothing is written but through services."""

import json
import re
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import WARNING
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils.html import escape

from approvals.models import AnswerFile, Interrupt, InterruptStatus
from approvals.services import decide_interrupt
from runs.admin.base import folded_json
from runs.admin.inlines import SessionRunInline
from runs.engine.completion import check_names
from runs.models import Agent, Run, RunEvent, RunStatus, Session
from runs.engine.lifecycle import start_run
from tests.support.answer_files import CSV, answered_with_file
from tests.support.core import CORE_TOOLS, asking_agent, refused_agent
from tests.support.web import core_runs, finished_transfer, waiting_transfer
from tools.mcp.conf import ServerProfile
from tools.mcp.discovery import store_listing
from tools.models import McpTool
from tools.registry import all_tools, get_tool

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_web(client, people):
    """A test client logged in as the superuser ``admin``."""
    client.force_login(people["admin"])
    return client


@pytest.fixture
def media_root(settings, tmp_path):
    """Answer files stored under a fresh folder."""
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def changelist_url(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def change_url(obj) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


def action(client, model, name: str, objects):
    return client.post(
        changelist_url(model),
        {"action": name, "_selected_action": [obj.pk for obj in objects]},
        follow=True,
    )


def warnings_of(response) -> list[str]:
    return [m.message for m in response.context["messages"] if m.level == WARNING]


def held_mcp_tool() -> McpTool:
    """An MCP tool of a server ``files`` listed, then listed with another schema: held for an operator."""
    profile = ServerProfile(name="files", url="https://files.example.com/mcp")
    for maximum in (100, 1000):
        store_listing(profile, {"delete_record": {
            "description": "Delete a record.", "annotations": {"readOnlyHint": False},
            "inputSchema": {"type": "object", "properties": {"record_id": {"type": "integer", "maximum": maximum}}}}},
            actor="test")
    return McpTool.objects.get(server="files", name="delete_record")


def test_the_run_list_filters_by_what_a_run_waits_for(admin_web, people, worker):
    waiting, done = waiting_transfer(people, worker), finished_transfer(people, worker)

    def listed(reason: str) -> set[int]:
        response = admin_web.get(changelist_url(Run), {"waiting_reason": reason})
        assert response.status_code == 200
        return {run.pk for run in response.context["cl"].result_list}

    assert waiting.pk in listed("approval") and done.pk not in listed("approval")
    assert listed("external_event") == set()


def test_every_changelist_and_change_page_answers_200(admin_web, people, worker, api, media_root):
    held_mcp_tool()
    finished_transfer(people, worker)
    core_runs(people, worker)
    answered_with_file(worker, people, api)

    for model in admin.site._registry:
        response = admin_web.get(changelist_url(model))
        assert response.status_code == 200, model
        obj = model._default_manager.first()
        if obj is None:
            assert model._meta.app_label not in ("runs", "tools", "approvals"), model
            continue
        response = admin_web.get(change_url(obj))
        assert response.status_code == 200, model


def changelist_query_counts(client) -> dict[str, int]:
    counts = {}
    for model in admin.site._registry:
        if model._meta.app_label in ("runs", "tools", "approvals"):
            with CaptureQueriesContext(connection) as queries:
                assert client.get(changelist_url(model)).status_code == 200
            counts[model.__name__] = len(queries)
    return counts


def test_changelists_do_not_query_per_row(admin_web, people, worker, api, media_root):
    finished_transfer(people, worker)
    answered_with_file(worker, people, api, "asks-first")
    with_one_run = changelist_query_counts(admin_web)
    core_runs(people, worker)
    core_runs(people, worker)
    answered_with_file(worker, people, api, "asks-second")

    assert changelist_query_counts(admin_web) == with_one_run


def test_run_page_shows_the_timeline_in_order_and_the_tool_calls(admin_web, people, worker):
    run = waiting_transfer(people, worker)

    response = admin_web.get(change_url(run))

    assert response.status_code == 200
    html = response.content.decode()
    assert "Timeline" in html
    reasons = [event.reason for event in run.events.order_by("seq")]
    assert "created" in reasons and "approval requested" in reasons
    positions = [html.index(f">{reason}<") for reason in ("created", "approval requested")]
    assert positions == sorted(positions)
    assert "awaiting_approval" in html  # the transfer, inline
    assert 'name="_save"' not in html  # view-only: nothing to save


def test_run_form_cannot_change_the_status(admin_web, people, worker):
    run = waiting_transfer(people, worker)

    response = admin_web.post(change_url(run), {"status": RunStatus.COMPLETED, "phase": "", "input": "x"})

    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


def test_cancel_action_cancels_a_waiting_run_and_its_inbox_item(admin_web, people, worker):
    run = waiting_transfer(people, worker)

    response = action(admin_web, Run, "cancel_selected_runs", [run])

    assert response.status_code == 200
    assert warnings_of(response) == []
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.interrupts.get().status == InterruptStatus.CANCELLED
    assert run.tool_calls.get(name="fake_transfer").status == "cancelled"
    last = run.events.order_by("seq").last()
    assert (last.from_status, last.to_status, last.actor) == ("waiting", "cancelled", "user:admin")


def test_cancel_action_leaves_a_completed_run_completed_and_warns(admin_web, people, worker):
    run = finished_transfer(people, worker)
    events_before = run.events.count()

    response = action(admin_web, Run, "cancel_selected_runs", [run])

    assert response.status_code == 200
    assert warnings_of(response) == [f"Run {run.pk} was not cancelled: it is completed."]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.events.count() == events_before


def test_cancel_action_on_a_cancelled_run_says_so_and_changes_nothing(admin_web, people, worker):
    run = waiting_transfer(people, worker)
    action(admin_web, Run, "cancel_selected_runs", [run])
    events_before = run.events.count()

    response = action(admin_web, Run, "cancel_selected_runs", [run])

    assert warnings_of(response) == []
    assert [m.message for m in response.context["messages"]] == [f"Run {run.pk} was already cancelled."]
    assert run.events.count() == events_before


def confirm(client, name: str, page, comment: str):
    """POST the admin's confirmation page back as its form would: every hidden field, and ``comment``."""
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.content.decode())
    data = {}
    for key, value in fields:
        data.setdefault(key, []).append(value)
    return client.post(changelist_url(Interrupt), {**data, "comment": comment}, follow=True)


def test_approve_action_asks_for_confirmation_then_decides_with_the_comment(admin_web, people, worker):
    run = waiting_transfer(people, worker)
    interrupt = run.interrupts.get()

    page = action(admin_web, Interrupt, "approve_selected", [interrupt])

    assert page.status_code == 200
    assert page.templates[0].name == "admin/approvals/interrupt/bulk_confirm.html"
    assert f'name="fingerprint-{interrupt.pk}"' in page.content.decode()
    interrupt.refresh_from_db()
    assert interrupt.status == InterruptStatus.PENDING  # nothing decided before the confirmation

    response = confirm(admin_web, "approve_selected", page, "checked the account")

    assert warnings_of(response) == []
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.decision, interrupt.comment) == (
        InterruptStatus.RESOLVED, "approved", "checked the account")
    assert interrupt.resolved_by == people["admin"]
    assert run.events.filter(type="interrupt", actor="user:admin", reason="approved").count() == 1
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


def test_reject_action_needs_a_comment_and_skips_an_item_decided_meanwhile(admin_web, people, worker):
    first, second = waiting_transfer(people, worker), waiting_transfer(people, worker)
    items = [first.interrupts.get(), second.interrupts.get()]
    page = action(admin_web, Interrupt, "reject_selected", items)

    again = confirm(admin_web, "reject_selected", page, "   ")
    assert "a rejection needs a comment" in again.content.decode()
    assert Interrupt.objects.filter(pk__in=[i.pk for i in items], status=InterruptStatus.PENDING).count() == 2

    worker.worker.pause()  # the approved run must not have ended (transfer made) by the time the action runs
    decide_interrupt(interrupt=items[0], user=people["approver"], decision="approved")  # after the page was shown
    response = confirm(admin_web, "reject_selected", again, "wrong account")
    worker.worker.resume()

    assert warnings_of(response) == [f"Item {items[0].pk} was not rejected: it is resolved."]
    for item in items:
        item.refresh_from_db()
    assert (items[0].decision, items[0].resolved_by) == ("approved", people["approver"])
    assert (items[1].decision, items[1].comment, items[1].resolved_by) == ("rejected", "wrong account", people["admin"])
    worker.drain()  # both runs go on (one approved, one told why not) before the worker stops


def test_reject_action_on_a_decided_item_warns_and_changes_nothing(admin_web, people, worker):
    run = waiting_transfer(people, worker)
    interrupt = run.interrupts.get()
    decide_interrupt(interrupt=interrupt, user=people["approver"], decision="approved")

    response = action(admin_web, Interrupt, "reject_selected", [interrupt])

    assert warnings_of(response) == [f"Item {interrupt.pk} was not rejected: no longer pending."]
    assert response.templates[0].name != "admin/approvals/interrupt/bulk_confirm.html"  # nothing left to confirm
    interrupt.refresh_from_db()
    assert (interrupt.decision, interrupt.resolved_by) == ("approved", people["approver"])


def test_audit_records_cannot_be_added_changed_or_deleted(admin_web, people, worker):
    run = waiting_transfer(people, worker)
    for obj in (run.events.first(), run.steps.first(), run.messages.first(), run.tool_calls.first()):
        model = type(obj)
        model_admin = admin.site._registry[model]
        assert admin_web.get(reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_add")).status_code == 403
        assert admin_web.post(change_url(obj), {}).status_code == 403, model
        assert "delete_selected" not in model_admin.get_actions(_request_for(people["admin"])), model


def test_answer_files_are_read_only_and_download_only_through_the_checked_view(admin_web, people, worker, api,
                                                                                media_root):
    answer_file = answered_with_file(worker, people, api)
    model_admin = admin.site._registry[AnswerFile]

    listed = admin_web.get(changelist_url(AnswerFile)).content.decode()
    page = admin_web.get(change_url(answer_file)).content.decode()

    item_url = reverse("admin:approvals_interrupt_change", args=[answer_file.interrupt_id])
    for shown in ("statement.csv", "text/csv", "requester", escape(item_url)):
        assert shown in listed, shown
    download = reverse("inbox-item-file", args=[answer_file.interrupt_id])
    assert f'href="{download}"' in page and answer_file.sha256 in page
    for hidden in (answer_file.file.name, CSV.decode().splitlines()[1]):  # neither the stored path nor the contents
        assert hidden not in listed and hidden not in page, hidden
    assert admin_web.get(reverse("admin:approvals_answerfile_add")).status_code == 403
    assert admin_web.post(change_url(answer_file), {"name": "other.csv"}).status_code == 403
    assert "delete_selected" not in model_admin.get_actions(_request_for(people["admin"]))
    assert AnswerFile.objects.get(pk=answer_file.pk).name == "statement.csv"
    assert b"".join(admin_web.get(download).streaming_content) == CSV  # the admin may see the run
    admin_web.force_login(get_user_model().objects.create_user("stranger"))
    assert admin_web.get(download).status_code == 404  # the link is the item page's: it checks who sees the run


def _request_for(user):
    request = RequestFactory().get("/")
    request.user = user
    return request


def test_agent_is_editable(admin_web, people):
    agent = asking_agent()
    form = admin_web.get(change_url(agent)).context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    data = {name: ("" if value is None else value) for name, value in data.items()}
    data.update({"name": "Send 80 v2", "max_turns": 5})

    response = admin_web.post(change_url(agent), data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    current = Agent.objects.current().get(slug="send-80")  # the change is the next version
    assert (current.version, current.name, current.max_turns) == (2, "Send 80 v2", 5)
    assert current.model["provider"] == "scripted"
    agent.refresh_from_db()
    assert (agent.is_current, agent.name, agent.max_turns) == (False, "send-80", 20)


def agent_form_data(agent: Agent, **changes) -> dict:
    """What the agent's change form posts when nothing is touched, with ``changes`` applied."""
    data = {"slug": agent.slug, "name": agent.name, "instructions": agent.instructions,
            "model": json.dumps(agent.model), "tools": list(agent.tools),
            "approval_policy": json.dumps(agent.approval_policy), "completion_check": agent.completion_check,
            "max_turns": agent.max_turns}
    return {**data, **changes}


def test_agent_admin_refuses_a_config_a_run_would_trip_over(people, admin_client):
    agent = asking_agent()
    form = agent_form_data(agent, tools=["fake_lookup", "teleport"],
                           approval_policy=json.dumps({"fake_transfer": "sometimes"}))
    response = admin_client.post(change_url(agent), form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["tools"] == ["Select a valid choice. teleport is not one of the available choices."]
    assert "sometimes" in errors["approval_policy"][0]
    agent.refresh_from_db()
    assert agent.tools == CORE_TOOLS


# --- issue 12: the run page, "View on site", the agent form, zh-Hans ------


def inline_formset(response, prefix: str):
    """The formset of the inline with ``prefix`` (e.g. ``events``) on an admin change page."""
    return next(inline.formset for inline in response.context["inline_admin_formsets"]
                if inline.formset.prefix == prefix)


def test_run_page_shows_timeline_with_seconds_in_the_browsers_zone_and_folds_long_payloads(admin_web, people, worker):
    run = finished_transfer(people, worker)
    zone = ZoneInfo("Asia/Shanghai")
    admin_web.cookies["tollgate_tz"] = "Asia/Shanghai"

    response = admin_web.get(change_url(run))

    events = list(run.events.order_by("seq"))
    assert [form.instance.seq for form in inline_formset(response, "events").forms] == [e.seq for e in events]
    html = response.content.decode()
    for event in events:  # to the second, in the browser's zone, not UTC
        assert event.created_at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S") in html
    assert 'data-time-zone="Asia/Shanghai"' in html
    long_payload = next(e.payload for e in events if len(json.dumps(e.payload, ensure_ascii=False)) > 60)
    folded = folded_json(long_payload)
    assert folded.startswith('<details class="folded-json"><summary><code>') and folded in html
    short = next(e for e in events if 0 < len(json.dumps(e.payload)) <= 60 and e.payload)
    assert f"<code>{escape(json.dumps(short.payload))}</code>" in html
    assert f'href="/runs/{run.pk}/#timeline"' in html  # the whole timeline on the site


def test_run_page_lists_its_inbox_items_with_decision_who_and_links(admin_web, people, worker):
    run = finished_transfer(people, worker)
    item = run.interrupts.get()

    response = admin_web.get(change_url(run))

    form, = inline_formset(response, "interrupts").forms
    assert form.instance == item
    html = response.content.decode()
    row = html[html.index('id="interrupts-0"'):html.index("</tr>", html.index('id="interrupts-0"'))]
    for text in ("approval", "resolved", "approved", "approver", f'href="{change_url(item)}"',
                 item.resolved_at.strftime("%Y-%m-%d %H:%M:%S")):
        assert text in row, text
    site_link = reverse("admin:view_on_site", args=[ContentType.objects.get_for_model(Interrupt).pk, item.pk])
    assert f'href="{site_link}"' in row
    assert site_path(admin_web.get(site_link)) == f"/inbox/{item.pk}/"
    assert 'name="interrupts-0-status"' not in html  # read-only


def test_timeline_shows_fifty_events_a_page(admin_web, people, worker):
    run = waiting_transfer(people, worker)
    first = run.events.count()
    with CaptureQueriesContext(connection) as few:
        admin_web.get(change_url(run))
    RunEvent.objects.bulk_create(RunEvent(run=run, seq=seq, type="note", actor="system", reason=f"note {seq}")
                                 for seq in range(first + 1, 131))

    def seqs(query=""):
        return [form.instance.seq for form in inline_formset(admin_web.get(change_url(run) + query), "events").forms]

    assert seqs() == list(range(1, 51))
    assert seqs("?events_page=2") == list(range(51, 101))
    assert seqs("?events_page=3") == list(range(101, 131))
    assert seqs("?events_page=99") == seqs("?events_page=3")  # past the end: the last page
    assert seqs("?events_page=x%27") == seqs()  # not a number: the first
    with CaptureQueriesContext(connection) as many:
        html = admin_web.get(change_url(run) + "?events_page=2").content.decode()
    assert len(many) == len(few)  # a page of rows costs the same queries however long the run is
    assert "51–100 of 130" in html
    assert 'href="?events_page=1"' in html and 'href="?events_page=3"' in html


def site_path(response) -> str:
    """Where a redirect of the admin's "View on site" leads, as a path of this site."""
    assert response.status_code == 302
    return urlsplit(response["Location"]).path


@pytest.mark.parametrize("model", [Run, Interrupt, Session])
def test_view_on_site_leads_to_the_page_on_the_site(admin_web, people, worker, model):
    run = finished_transfer(people, worker)
    later = start_run(agent=refused_agent(), user=people["requester"], input="send 500 to acme")
    worker.drain()
    session = Session.objects.create(owner=people["requester"], agent=run.agent)
    Run.objects.filter(pk__in=[run.pk, later.pk]).update(session=session)
    obj = {Run: run, Interrupt: run.interrupts.get(), Session: session}[model]
    expected = {Run: f"/runs/{run.pk}/", Interrupt: f"/inbox/{obj.pk}/", Session: f"/runs/{later.pk}/"}[model]

    link = reverse("admin:view_on_site", args=[ContentType.objects.get_for_model(model).pk, obj.pk])
    assert f'href="{link}"' in admin_web.get(change_url(obj)).content.decode()
    assert site_path(admin_web.get(link)) == expected
    assert admin_web.get(expected).status_code == 200


def test_a_session_without_runs_has_no_view_on_site(admin_web, people):
    session = Session.objects.create(owner=people["requester"], agent=asking_agent())

    html = admin_web.get(change_url(session)).content.decode()

    assert reverse("admin:view_on_site", args=[ContentType.objects.get_for_model(Session).pk, session.pk]) not in html


def test_agent_form_offers_the_registered_checks_and_tools(admin_web, people):
    agent = asking_agent()
    form = admin_web.get(change_url(agent)).context["adminform"].form

    assert [value for value, _ in form.fields["completion_check"].choices] == check_names()
    assert [value for value, _ in form.fields["tools"].choices] == [tool.name for tool in all_tools()]
    labels = dict(form.fields["tools"].choices)
    assert labels["fake_transfer"] == f"fake_transfer (changes things; approval: {get_tool('fake_transfer').approval})"
    assert labels["fake_lookup"] == "fake_lookup (read-only; approval: never)"
    for name in ("model", "approval_policy", "tools", "completion_check"):
        assert form.fields[name].help_text, name

    response = admin_web.post(change_url(agent), agent_form_data(agent, tools=[*CORE_TOOLS, "ask_user"],
                                                                 completion_check="default"))

    assert response.status_code == 302
    agent = Agent.objects.current().get(slug="send-80")
    assert (agent.tools, agent.completion_check) == ([*CORE_TOOLS, "ask_user"], "default")


def test_agent_form_errors_keep_what_was_typed(admin_web, people):
    agent = asking_agent()
    typed_policy = '{\n  "fake_transfer":   "amount >> 5"\n}'
    typed_model = '{"provider": "scripted", "turns": [}'

    response = admin_web.post(change_url(agent), agent_form_data(
        agent, approval_policy=typed_policy, model=typed_model, completion_check="no-such-check",
        tools=["fake_transfer"]))

    assert response.status_code == 200
    form = response.context["adminform"].form
    assert set(form.errors) == {"approval_policy", "model", "completion_check"}
    assert form.errors["model"] == ["Not valid JSON (line 1, column 36)."]
    assert form.errors["approval_policy"][0].startswith("fake_transfer: ")
    assert len(form.errors["completion_check"]) == 1  # the choice's own message, not a second one
    html = response.content.decode()
    assert f">\n{escape(typed_policy)}</textarea>" in html
    assert f">\n{escape(typed_model)}</textarea>" in html
    assert 'value="fake_transfer" id="id_tools_' in html and html.count(" checked>") == 1
    agent.refresh_from_db()
    assert agent.approval_policy == {} and agent.tools == CORE_TOOLS


def test_agent_form_keeps_a_tool_that_is_no_longer_registered_until_removed(admin_web, people):
    agent = asking_agent()
    Agent.objects.filter(pk=agent.pk).update(tools=["fake_transfer", "retired_tool"], completion_check="retired_check")
    agent.refresh_from_db()

    form = admin_web.get(change_url(agent)).context["adminform"].form
    assert form["tools"].value() == ["fake_transfer", "retired_tool"]
    assert dict(form.fields["tools"].choices)["retired_tool"] == "retired_tool (not registered)"
    assert form["completion_check"].value() == "retired_check"

    response = admin_web.post(change_url(agent), agent_form_data(agent))
    errors = response.context["adminform"].form.errors
    assert errors["tools"] == ["Unknown tool 'retired_tool'."]
    assert errors["completion_check"][0].startswith("Unknown completion check 'retired_check'")

    response = admin_web.post(change_url(agent), agent_form_data(agent, tools=["fake_transfer"],
                                                                 completion_check="fake_transfer"))
    assert response.status_code == 302
    assert Agent.objects.current().get(slug="send-80").tools == ["fake_transfer"]


@pytest.mark.parametrize("language, words", [
    ("zh-hans", {"时间线", "收件箱条目", "在站点上查看", "审批", "已批准", "站点管理", "年"}),
    ("en", {"Timeline", "Inbox items", "View on site", "approval", "approved", "Site administration"}),
])
def test_admin_speaks_the_browsers_language(admin_web, people, worker, language, words):
    run = finished_transfer(people, worker)
    agent = run.agent

    run_page = admin_web.get(change_url(run), HTTP_ACCEPT_LANGUAGE=language).content.decode()
    agent_page = admin_web.get(change_url(agent), HTTP_ACCEPT_LANGUAGE=language).content.decode()
    index = admin_web.get(reverse("admin:index"), HTTP_ACCEPT_LANGUAGE=language).content.decode()

    assert f'<html lang="{language}"' in run_page
    for word in words:
        assert word in run_page + index, word
    help_words = {"zh-hans": "人工批准", "en": "need a person's approval"}[language]
    assert help_words in agent_page
    assert ("运行" in index) == (language == "zh-hans")  # the app's name


def test_a_session_with_a_page_of_its_runs_shown_can_still_be_renamed(admin_web, people, worker, monkeypatch):
    monkeypatch.setattr(SessionRunInline, "per_page", 2)
    session = Session.objects.create(owner=people["requester"], agent=refused_agent())
    for text in ("first", "second", "third"):
        start_run(agent=session.agent, user=people["requester"], input=text, session=session)
        worker.drain()
    url = change_url(session) + "?runs_page=2"
    formset = inline_formset(admin_web.get(url), "runs")
    assert [form.instance.input for form in formset.forms] == ["first"]  # newest first, two a page

    data = {"title": "Send 500 to acme", "metadata": "{}"}
    data.update({f"runs-{key}": value for key, value in formset.management_form.initial.items()})
    data.update({"runs-0-id": formset.forms[0].instance.pk, "runs-0-session": session.pk})
    response = admin_web.post(url, data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    session.refresh_from_db()
    assert session.title == "Send 500 to acme" and session.runs.count() == 3


def test_an_operator_accepts_a_held_mcp_tool_with_the_admin_action(admin_web, people):
    tool = held_mcp_tool()
    assert tool.held
    approver = Client()
    approver.force_login(people["approver"])  # no change permission on MCP tools: nothing accepted
    action(approver, McpTool, "accept_selected", [tool])
    tool.refresh_from_db()
    assert tool.held

    response = action(admin_web, McpTool, "accept_selected", [tool])
    assert [m.message for m in response.context["messages"]] == ["Accepted 1 tool."]
    tool.refresh_from_db()
    assert not tool.held and tool.accepted_by == people["admin"]
    assert list(tool.events.values_list("kind", "actor")) == [
        ("accepted", "admin"), ("changed", "test"), ("discovered", "test")]
    response = action(admin_web, McpTool, "accept_selected", [tool])
    assert [m.message for m in response.context["messages"]] == ["None of the selected tools was held."]
