"""Issue 13, the waiting set: lists and the sweeper cost the same however many runs wait.

Each list (pages and API, in their default order and with their common
filters, as a user who sees every run and as one who sees their own) and
each sweeper pass (nothing due, and a fixed amount of due work) is run with
5 and then with 50 waiting runs: the number of statements must not change.
On PostgreSQL, the plan of each list and of each sweeper look must read an
index in the list's order, or the rows due, never sort or scan the table
(the indexes of migration ``runs 0012`` / ``approvals 0002``).
"""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals.models import Interrupt
from runs.models import Agent, Run, Session, Step
from runs.sweeping import sweep
from tests.support.inbox import agent as scripted_agent
from tools.models import ToolCall, Wait

AGENT = "scale"  # the agent of every waiting run made here (``tests.support.inbox.agent``)
LISTS = [
    "/api/runs/",
    "/api/runs/?status=waiting",
    "/api/runs/?waiting_reason=input",
    f"/api/runs/?agent={AGENT}",
    "/api/interrupts/",
    "/api/interrupts/?status=pending",
    "/api/sessions/",
]


def add_waiting_runs(count: int, user, *, start: int = 0) -> list[Run]:
    """``count`` waiting runs of ``user`` on ``AGENT``, in rotation: an approval (pending call and item,
    expiring in a day), a question (an input wait and its item) and a retry backoff (a timer in an hour)."""
    agent = scripted_agent(AGENT)
    now, made = timezone.now(), []
    for number in range(start, start + count):
        kind = ("approval", "input", "retry_backoff")[number % 3]
        run = Run.objects.create(session=Session.objects.create(owner=user, agent=agent), agent=agent,
                                 requested_by=user, input=f"scale {number}", status="waiting", waiting_reason=kind,
                                 started_at=now, wake_at=now + timedelta(hours=1) if kind == "retry_backoff" else None)
        made.append(run)
        if kind == "retry_backoff":
            continue
        step = Step.objects.create(run=run, index=0, status="succeeded")
        call = ToolCall.objects.create(
            run=run, step=step, index=0, provider_call_id=f"scale-{number}", side_effect=kind == "approval",
            name="fake_transfer" if kind == "approval" else "ask_user",
            arguments={"account": "acme", "amount": 80} if kind == "approval" else {"question": "Which?"},
            status="awaiting_approval" if kind == "approval" else "running")
        Interrupt.objects.create(run=run, tool_call=call, kind=kind, title="Scale item",
                                 expires_at=now + timedelta(days=1) if kind == "approval" else None)
        if kind == "input":
            Wait.objects.create(run=run, tool_call=call, kind="input", deadline=now + timedelta(days=1))
    return made


@pytest.fixture
def page_clients(people, api):
    """``{who: (page client, API client)}`` for the approver (sees every run) and the requester (their own)."""
    clients = {}
    for who in ("approver", "requester"):
        page = Client()
        page.force_login(people[who])
        clients[who] = (page, api(people[who]))
    return clients


def _statements(client, url: str) -> tuple[int, int]:
    """(statements, rows listed; 0 for a page) of one GET of ``url``."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    rows = len(response.json()["results"]) if url.startswith("/api/") else 0
    return len(captured.captured_queries), rows


@pytest.mark.parametrize("who", ["approver", "requester"])
def test_every_list_costs_the_same_statements_for_5_or_50_waiting_runs(people, page_clients, who):
    page, api = page_clients[who]
    add_waiting_runs(5, people["requester"])
    urls = [(api, url) for url in LISTS] + [(page, reverse("run-list"))]
    few = {url: _statements(client, url) for client, url in urls}
    add_waiting_runs(45, people["requester"], start=5)
    many = {url: _statements(client, url) for client, url in urls}
    for _client, url in urls:
        assert many[url][0] == few[url][0], (url, few[url], many[url])
    assert many["/api/runs/"][1] == few["/api/runs/"][1] + 45  # the new runs are listed
    assert many["/api/runs/?waiting_reason=input"][1] == few["/api/runs/?waiting_reason=input"][1] + 15


def test_a_waiting_run_in_a_list_says_what_it_waits_for(people, page_clients):
    """The pending waits are loaded for the whole page: each run still shows its own."""
    runs = add_waiting_runs(3, people["requester"])
    listed = {row["id"]: row for row in page_clients["approver"][1].get("/api/runs/").json()["results"]}
    question = runs[1]
    wait = question.waits.get()
    assert listed[question.pk]["waiting_for"] == {
        "kind": "input", "deadline": wait.deadline.isoformat(), "tool_call": wait.tool_call_id,
        "interrupt": Interrupt.objects.get(run=question).pk}
    assert listed[runs[0].pk]["waiting_for"] is None and listed[runs[2].pk]["waiting_for"] is None
    single = page_clients["approver"][1].get(f"/api/runs/{question.pk}/").json()
    assert single["waiting_for"] == listed[question.pk]["waiting_for"]


def _sweep_statements(now) -> tuple[int, dict]:
    with CaptureQueriesContext(connection) as captured:
        found = sweep(now=now)
    return len(captured.captured_queries), found


def _make_due(runs: list[Run], now) -> None:
    """Expire the first approval item and make the first backoff due, among ``runs``."""
    approval = next(run for run in runs if run.waiting_reason == "approval")
    Interrupt.objects.filter(run=approval).update(expires_at=now - timedelta(minutes=1))
    backoff = next(run for run in runs if run.waiting_reason == "retry_backoff")
    Run.objects.filter(pk=backoff.pk).update(wake_at=now - timedelta(seconds=1))


def _idle_and_due_pass(runs: list[Run]) -> tuple[int, int]:
    """Statements of a sweeper pass with nothing due, then of one with an expired item and a due timer among ``runs``."""
    idle, found = _sweep_statements(timezone.now())
    assert set(found.values()) == {0}, found  # no job of the pass did anything
    now = timezone.now()
    _make_due(runs, now)
    due, found = _sweep_statements(now)
    assert (found["woken"], found["expired"]) == (1, 1)
    return idle, due


def test_a_sweeper_pass_costs_the_same_statements_for_5_or_50_waiting_runs(people, idle_worker):
    scripted_agent(AGENT)
    Agent.objects.filter(slug=AGENT).update(deadline_s=30 * 86400)  # the deadline check runs, none passes
    few = _idle_and_due_pass(add_waiting_runs(5, people["requester"]))
    many = _idle_and_due_pass(add_waiting_runs(45, people["requester"], start=5))
    assert many == few


def test_a_waiting_run_past_its_agents_deadline_fails_and_one_before_it_waits_on(people, idle_worker):
    """The deadline check asks per agent in SQL; it still fails exactly the runs whose deadline passed."""
    scripted_agent(AGENT)
    Agent.objects.filter(slug=AGENT).update(deadline_s=3600)
    late, on_time = add_waiting_runs(2, people["requester"])
    Run.objects.filter(pk=late.pk).update(started_at=timezone.now() - timedelta(hours=2))
    assert sweep()["past_deadline"] == 1
    late.refresh_from_db()
    on_time.refresh_from_db()
    assert (late.status, late.failure_type) == ("failed", "deadline_exceeded")
    assert on_time.status == "waiting"


def _plan(sql: str, params) -> str:
    """PostgreSQL's plan for a statement with the table scan and sorting priced out, so an index in
    the right order is used when there is one (the tables of a test are too small to prefer it)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(line for (line,) in cursor.fetchall())


def _uses_an_index_without_sorting(plan: str, table: str) -> bool:
    return f"Seq Scan on {table}" not in plan and "Sort" not in plan and f"on {table}" in plan


LIST_QUERIES = {
    "runs, newest first": lambda user: Run.objects.order_by("-created_at", "-id")[:100],
    "runs a requester sees": lambda user: Run.objects.visible_to(user).order_by("-created_at", "-id")[:100],
    "runs by status": lambda user: Run.objects.filter(status="waiting").order_by("-created_at", "-id")[:100],
    "runs by waiting reason": lambda user: Run.objects.filter(waiting_reason="input").order_by("-created_at", "-id")[:100],
    "runs of an agent": lambda user: Run.objects.filter(agent_id=1).order_by("-created_at", "-id")[:100],
    "sessions, newest first": lambda user: Session.objects.order_by("-created_at", "-id")[:100],
    "sessions a requester sees": lambda user: Session.objects.filter(owner=user).order_by("-created_at", "-id")[:100],
    "items, newest first": lambda user: Interrupt.objects.order_by("-created_at", "-id")[:100],
    "pending items": lambda user: Interrupt.objects.filter(status="pending").order_by("-created_at", "-id")[:100],
    "sweeper: timers due": lambda user: Run.objects.filter(
        status="waiting", wake_at__lte=timezone.now()).order_by("wake_at")[:200],
    "sweeper: scheduled starts due": lambda user: Run.objects.filter(
        status="queued", wake_at__lte=timezone.now()).order_by("wake_at")[:200],
    "sweeper: items past expiry": lambda user: Interrupt.objects.filter(
        status="pending", expires_at__lte=timezone.now()).exclude(kind="input").order_by("expires_at")[:200],
    "decided items (history)": lambda user: Interrupt.objects.filter(status="resolved").order_by(
        "-resolved_at", "-id")[:50],
    "items one person decided": lambda user: Interrupt.objects.filter(status="resolved", resolved_by=user).order_by(
        "-resolved_at", "-id")[:50],
    "sweeper: claimed items about to expire": lambda user: Interrupt.objects.filter(
        status="pending", claimed_by__isnull=False, expiry_warning_sent_at__isnull=True,
        expires_at__gt=timezone.now(), expires_at__lte=timezone.now() + timedelta(hours=4)),
    "sweeper: waiting runs past a deadline": lambda user: Run.objects.filter(
        status="waiting", agent_id=1, started_at__lte=timezone.now()).order_by("started_at")[:200],
}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="plans are PostgreSQL's")
@pytest.mark.parametrize("name", list(LIST_QUERIES))
def test_lists_and_sweeper_looks_read_an_index_in_their_order(people, name):
    query = LIST_QUERIES[name](people["requester"])
    sql, params = query.query.sql_with_params()
    with transaction.atomic():
        plan = _plan(sql, params)
    assert _uses_an_index_without_sorting(plan, query.model._meta.db_table), plan
