"""The Django admin: every page renders, nothing is written but through services."""

import json
import re

import pytest
from django.contrib import admin
from django.contrib.messages import WARNING
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.test import RequestFactory
from django.urls import reverse

from approvals.models import Interrupt, InterruptStatus
from approvals.services import decide_interrupt
from runs.models import Agent, Run, RunStatus, WaitingReason
from runs.engine.lifecycle import start_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_web(client, demo):
    """A test client logged in as the demo superuser ``admin``."""
    client.force_login(demo["admin"])
    return client


def start_refund(demo, worker) -> Run:
    """A refund run, advanced until it waits for approval of the refund."""
    run = start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"], input="refund please")
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, WaitingReason.APPROVAL)
    return run


def finish_refund(demo, worker) -> Run:
    """A refund run that was approved and ran to completion."""
    run = start_refund(demo, worker)
    decide_interrupt(interrupt=run.interrupts.get(), user=demo["approver"], decision="approved")
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    return run


def start_demo_runs(demo, worker) -> None:
    """One run of each demo agent, drained: rows in several states in every table."""
    for agent in Agent.objects.exclude(slug="refund-order"):
        start_run(agent=agent, user=demo["requester"], input=f"please, {agent.name}")
    worker.drain()


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


def test_every_changelist_and_change_page_answers_200(admin_web, demo, worker):
    finish_refund(demo, worker)
    start_demo_runs(demo, worker)

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


def test_changelists_do_not_query_per_row(admin_web, demo, worker):
    finish_refund(demo, worker)
    with_one_run = changelist_query_counts(admin_web)
    start_demo_runs(demo, worker)
    start_demo_runs(demo, worker)

    assert changelist_query_counts(admin_web) == with_one_run


def test_run_page_shows_the_timeline_in_order_and_the_tool_calls(admin_web, demo, worker):
    run = start_refund(demo, worker)

    response = admin_web.get(change_url(run))

    assert response.status_code == 200
    html = response.content.decode()
    assert "Timeline" in html
    reasons = [event.reason for event in run.events.order_by("seq")]
    assert "created" in reasons and "approval requested" in reasons
    positions = [html.index(f">{reason}<") for reason in ("created", "approval requested")]
    assert positions == sorted(positions)
    assert "awaiting_approval" in html  # the refund call, inline
    assert 'name="_save"' not in html  # view-only: nothing to save


def test_run_form_cannot_change_the_status(admin_web, demo, worker):
    run = start_refund(demo, worker)

    response = admin_web.post(change_url(run), {"status": RunStatus.COMPLETED, "phase": "", "input": "x"})

    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING


def test_cancel_action_cancels_a_waiting_run_and_its_inbox_item(admin_web, demo, worker):
    run = start_refund(demo, worker)

    response = action(admin_web, Run, "cancel_selected_runs", [run])

    assert response.status_code == 200
    assert warnings_of(response) == []
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.interrupts.get().status == InterruptStatus.CANCELLED
    assert run.tool_calls.get(name="refund").status == "cancelled"
    last = run.events.order_by("seq").last()
    assert (last.from_status, last.to_status, last.actor) == ("waiting", "cancelled", "user:admin")


def test_cancel_action_leaves_a_completed_run_completed_and_warns(admin_web, demo, worker):
    run = finish_refund(demo, worker)
    events_before = run.events.count()

    response = action(admin_web, Run, "cancel_selected_runs", [run])

    assert response.status_code == 200
    assert warnings_of(response) == [f"Run {run.pk} was not cancelled: it is completed."]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.events.count() == events_before


def confirm(client, name: str, page, comment: str):
    """POST the admin's confirmation page back as its form would: every hidden field, and ``comment``."""
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.content.decode())
    data = {}
    for key, value in fields:
        data.setdefault(key, []).append(value)
    return client.post(changelist_url(Interrupt), {**data, "comment": comment}, follow=True)


def test_approve_action_asks_for_confirmation_then_decides_with_the_comment(admin_web, demo, worker):
    run = start_refund(demo, worker)
    interrupt = run.interrupts.get()

    page = action(admin_web, Interrupt, "approve_selected", [interrupt])

    assert page.status_code == 200
    assert page.templates[0].name == "admin/approvals/interrupt/bulk_confirm.html"
    assert f'name="fingerprint-{interrupt.pk}"' in page.content.decode()
    interrupt.refresh_from_db()
    assert interrupt.status == InterruptStatus.PENDING  # nothing decided before the confirmation

    response = confirm(admin_web, "approve_selected", page, "checked the order")

    assert warnings_of(response) == []
    interrupt.refresh_from_db()
    assert (interrupt.status, interrupt.decision, interrupt.comment) == (
        InterruptStatus.RESOLVED, "approved", "checked the order")
    assert interrupt.resolved_by == demo["admin"]
    assert run.events.filter(type="interrupt", actor="user:admin", reason="approved").count() == 1
    worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


def test_reject_action_needs_a_comment_and_skips_an_item_decided_meanwhile(admin_web, demo, worker):
    first, second = start_refund(demo, worker), start_refund(demo, worker)
    items = [first.interrupts.get(), second.interrupts.get()]
    page = action(admin_web, Interrupt, "reject_selected", items)

    again = confirm(admin_web, "reject_selected", page, "   ")
    assert "a rejection needs a comment" in again.content.decode()
    assert Interrupt.objects.filter(pk__in=[i.pk for i in items], status=InterruptStatus.PENDING).count() == 2

    decide_interrupt(interrupt=items[0], user=demo["approver"], decision="approved")  # after the page was shown
    response = confirm(admin_web, "reject_selected", again, "wrong order")

    assert warnings_of(response) == [f"Item {items[0].pk} was not rejected: it is resolved."]
    for item in items:
        item.refresh_from_db()
    assert (items[0].decision, items[0].resolved_by) == ("approved", demo["approver"])
    assert (items[1].decision, items[1].comment, items[1].resolved_by) == ("rejected", "wrong order", demo["admin"])
    worker.drain()  # both runs go on (one approved, one told why not) before the worker stops


def test_reject_action_on_a_decided_item_warns_and_changes_nothing(admin_web, demo, worker):
    run = start_refund(demo, worker)
    interrupt = run.interrupts.get()
    decide_interrupt(interrupt=interrupt, user=demo["approver"], decision="approved")

    response = action(admin_web, Interrupt, "reject_selected", [interrupt])

    assert warnings_of(response) == [f"Item {interrupt.pk} was not rejected: no longer pending."]
    assert response.templates[0].name != "admin/approvals/interrupt/bulk_confirm.html"  # nothing left to confirm
    interrupt.refresh_from_db()
    assert (interrupt.decision, interrupt.resolved_by) == ("approved", demo["approver"])


def test_audit_records_cannot_be_added_changed_or_deleted(admin_web, demo, worker):
    run = start_refund(demo, worker)
    for obj in (run.events.first(), run.steps.first(), run.messages.first(), run.tool_calls.first()):
        model = type(obj)
        model_admin = admin.site._registry[model]
        assert admin_web.get(reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_add")).status_code == 403
        assert admin_web.post(change_url(obj), {}).status_code == 403, model
        assert "delete_selected" not in model_admin.get_actions(_request_for(demo["admin"])), model


def _request_for(user):
    request = RequestFactory().get("/")
    request.user = user
    return request


def test_agent_is_editable(admin_web, demo):
    agent = Agent.objects.get(slug="refund-order")
    form = admin_web.get(change_url(agent)).context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    data = {name: ("" if value is None else value) for name, value in data.items()}
    data.update({"name": "Refund order v2", "max_turns": 5})

    response = admin_web.post(change_url(agent), data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    agent.refresh_from_db()
    assert (agent.name, agent.max_turns) == ("Refund order v2", 5)
    assert agent.model["provider"] == "scripted"


def test_agent_admin_refuses_a_config_a_run_would_trip_over(demo, admin_client):
    agent = Agent.objects.get(slug="refund-order")
    url = reverse("admin:runs_agent_change", args=[agent.pk])
    form = {"slug": agent.slug, "name": agent.name, "instructions": "", "model": json.dumps(agent.model),
            "tools": json.dumps(["query_order", "teleport"]), "approval_policy": json.dumps({"refund": "sometimes"}),
            "completion_check": "refund", "max_turns": 5}
    response = admin_client.post(url, form)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Unknown tool &#x27;teleport&#x27;" in page and "sometimes" in page
    agent.refresh_from_db()
    assert agent.tools == ["query_order", "refund"]
