"""Issue 22: agents have versions. PATCH makes a new version (checked as creation is), runs keep theirs,
DELETE archives, and the versions can be listed (docs/design.md#agent-versions)."""

import logging
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse
from django.utils import timezone

from runs.engine.sweep_jobs import fail_waiting_runs_past_deadline
from runs.models import Agent, Run
from runs.providers.scripted import ScriptedClient
from tests.support.api import error_of, field_errors, get_run, pending_interrupts, start_run
from tests.support.core import core_agent, transfer

OLD_TURNS = [{"tool_calls": [transfer("acme", 80)]}, {"content": "Old version."}]
NEW_TURNS = [{"content": "New version."}]


@pytest.fixture
def editor(people):
    """Staff who may add and change agents but not loosen approval rules."""
    user = get_user_model().objects.create_user("editor", password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="runs", codename__in=["add_agent", "change_agent", "delete_agent"]))
    return user


@pytest.fixture
def model_calls(monkeypatch):
    """``[(run_id, instructions, tool names)]`` of every scripted model call, in order."""
    calls = []
    complete = ScriptedClient.complete

    async def recording(self, request):
        calls.append((request.run_id, request.instructions, sorted(tool["name"] for tool in request.tools)))
        return await complete(self, request)

    monkeypatch.setattr(ScriptedClient, "complete", recording)
    return calls


def patch(client, slug: str, body: dict):
    return client.patch(f"/api/agents/{slug}/", body, format="json")


def versions(client, slug: str) -> list[dict]:
    response = client.get(f"/api/agents/{slug}/versions/")
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def test_a_run_finishes_on_its_version_and_a_run_started_after_a_patch_uses_the_new_one(
        people, api, worker, model_calls):
    admin, requester, approver = api(people["admin"]), api(people["requester"]), api(people["approver"])
    core_agent(admin, "versioned", OLD_TURNS, instructions="Old instructions.")
    before = start_run(requester, "versioned")
    worker.drain()
    assert get_run(requester, before["id"])["status"] == "waiting"  # the transfer waits for its approval

    response = patch(admin, "versioned", {"instructions": "New instructions.", "tools": ["fake_lookup"],
                                          "completion_check": "default",
                                          "model": {"provider": "scripted", "turns": NEW_TURNS}})
    assert response.status_code == 200, response.json()
    assert (response.json()["version"], response.json()["is_current"]) == (2, True)
    interrupt, = pending_interrupts(approver, before["id"])
    assert approver.post(f"/api/interrupts/{interrupt['id']}/approve/", {}, format="json").status_code == 200
    after = start_run(requester, "versioned")
    worker.drain()

    before, after = get_run(requester, before["id"]), get_run(requester, after["id"])
    assert (before["status"], before["final_output"], before["agent_version"]) == ("completed", "Old version.", 1)
    assert (after["status"], after["final_output"], after["agent_version"]) == ("completed", "New version.", 2)
    seen = {run_id: {(instructions, tuple(tools)) for rid, instructions, tools in model_calls if rid == run_id}
            for run_id in (before["id"], after["id"])}
    assert seen == {before["id"]: {("Old instructions.", ("fake_lookup", "fake_transfer"))},
                    after["id"]: {("New instructions.", ("fake_lookup",))}}
    assert before["agent"] == after["agent"] == "versioned"


def test_new_work_in_a_session_and_a_retry_use_the_current_version_and_a_key_sent_again_replays(people, api):
    admin, requester = api(people["admin"]), api(people["requester"])
    core_agent(admin, "versioned", OLD_TURNS)
    first = start_run(requester, "versioned", "First.", **{"Idempotency-Key": "k-1"})
    assert requester.post(f"/api/runs/{first['id']}/cancel/", {}, format="json").status_code == 200

    assert patch(admin, "versioned", {"name": "Versioned, second"}).status_code == 200
    in_session = requester.post("/api/runs/", {"agent": "versioned", "input": "Second.", "session": first["session"]},
                                format="json")
    retry = requester.post(f"/api/runs/{first['id']}/retry/", {}, format="json")
    again = requester.post("/api/runs/", {"agent": "versioned", "input": "First."}, format="json",
                           headers={"Idempotency-Key": "k-1"})

    assert in_session.status_code == 201, in_session.json()
    assert (in_session.json()["session"], in_session.json()["agent_version"]) == (first["session"], 2)
    assert retry.status_code == 201, retry.json()
    assert (retry.json()["retry_of"], retry.json()["agent_version"]) == (first["id"], 2)
    assert again.status_code == 201 and again.json()["id"] == first["id"]  # the same request, not a reused key
    assert again.headers["Idempotent-Replayed"] == "true"
    assert get_run(requester, first["id"])["agent_version"] == 1
    assert requester.get(f"/api/sessions/{first['session']}/").json()["agent"] == "versioned"
    filtered = requester.get("/api/runs/", {"agent": "versioned"}).json()["results"]
    assert sorted(run["id"] for run in filtered) == sorted([first["id"], in_session.json()["id"], retry.json()["id"]])


def test_the_admins_agent_filter_offers_each_slug_once_and_matches_every_version(people, api, admin_client, asking):
    admin, requester = api(people["admin"]), api(people["requester"])
    core_agent(admin, "versioned", OLD_TURNS)
    first = start_run(requester, "versioned")
    assert patch(admin, "versioned", {"name": "Versioned, second"}).status_code == 200
    second = start_run(requester, "versioned")
    start_run(requester, asking)

    page = admin_client.get(reverse("admin:runs_run_changelist"), {"agent__slug": "versioned"})

    changelist = page.context["cl"]
    assert sorted(run.pk for run in changelist.result_list) == sorted([first["id"], second["id"]])
    agent_filter, = [spec for spec in changelist.filter_specs if spec.title == "agent"]
    assert [choice["display"] for choice in agent_filter.choices(changelist)].count("versioned") == 1


@pytest.mark.parametrize("body, field", [
    ({"tools": ["fake_lookup", "teleport"]}, "tools"),
    ({"model": {"provider": "no-such-provider"}}, "model"),
    ({"model": {"provider": "scripted"}}, "model"),
    ({"completion_check": "no-such-check"}, "completion_check"),
    ({"approval_policy": {"fake_transfer": "sometimes"}}, "approval_policy"),
    ({"approval_policy": {"teleport": "always"}}, "approval_policy"),
    ({"name": "   "}, "name"),
    ({"max_turns": 0}, "max_turns"),
    ({"max_cost_usd": "-1"}, "max_cost_usd"),
    ({"deadline_s": 10**9}, "deadline_s"),
    ({"slug": "renamed"}, "slug"),
    ({"version": 7}, "version"),
])
def test_an_invalid_change_is_400_and_makes_no_version(people, api, body, field):
    admin = api(people["admin"])
    created = core_agent(admin, "versioned", OLD_TURNS)

    assert field in field_errors(patch(admin, "versioned", body))

    assert versions(admin, "versioned") == [created]
    assert admin.get("/api/agents/versioned/").json() == created


def test_only_staff_with_the_change_permission_may_patch_and_a_change_of_nothing_makes_no_version(
        people, api, editor):
    created = core_agent(api(people["admin"]), "versioned", OLD_TURNS)

    assert error_of(patch(api(people["requester"]), "versioned", {"name": "Mine"}), 403)
    assert error_of(patch(api(editor), "no-such-agent", {"name": "Mine"}), 404)
    assert error_of(api(editor).put("/api/agents/versioned/", {**created, "name": "Mine"}, format="json"), 405)
    unchanged = patch(api(editor), "versioned", {"name": created["name"], "tools": created["tools"]})

    assert unchanged.status_code == 200 and unchanged.json() == created
    assert Agent.objects.filter(slug="versioned").count() == 1


def test_versions_are_listed_oldest_first_and_only_the_newest_is_current(people, api, editor):
    admin = api(people["admin"])
    core_agent(admin, "versioned", OLD_TURNS, max_turns=5)
    assert patch(api(editor), "versioned", {"max_turns": 6}).status_code == 200
    assert patch(admin, "versioned", {"instructions": "Third.", "deadline_s": 600}).status_code == 200

    listed = versions(admin, "versioned")

    assert [(v["version"], v["is_current"], v["max_turns"], v["created_by"]) for v in listed] == [
        (1, False, 5, "admin"), (2, False, 6, "editor"), (3, True, 6, "admin")]
    assert (listed[2]["instructions"], listed[2]["deadline_s"], listed[1]["deadline_s"]) == ("Third.", 600, None)
    assert admin.get("/api/agents/versioned/").json() == listed[2]
    assert [a["version"] for a in admin.get("/api/agents/").json()["results"] if a["slug"] == "versioned"] == [3]


def test_loosening_without_the_permission_is_400_and_makes_no_version(people, api, editor):
    # The editor's rule adds to the tools' own: query_order (never asks by itself) now always asks.
    core_agent(api(editor), "versioned", OLD_TURNS, approval_policy={"fake_lookup": "always"})

    dropped = field_errors(patch(api(editor), "versioned", {"approval_policy": {}}))
    never = field_errors(patch(api(editor), "versioned", {"approval_policy": {"fake_transfer": "never"}}))
    other_change = patch(api(editor), "versioned", {"name": "Renamed"})  # the policy stays: no loosening

    assert "fake_lookup" in dropped["approval_policy"][0] and "runs.loosen_approval_policy" in dropped["approval_policy"][0]
    assert "runs.loosen_approval_policy" in never["approval_policy"][0]
    assert other_change.status_code == 200, other_change.json()
    assert [(v["version"], v["approval_policy"]) for v in versions(api(editor), "versioned")] == [
        (1, {"fake_lookup": "always"}), (2, {"fake_lookup": "always"})]


def test_loosening_with_the_permission_makes_a_version_that_records_it_and_the_admin_warns(
        people, api, admin_client, caplog):
    admin = api(people["admin"])
    core_agent(admin, "versioned", OLD_TURNS)

    with caplog.at_level(logging.WARNING, logger="runs.engine.agents"):
        response = patch(admin, "versioned", {"approval_policy": {"fake_transfer": "never"}})

    assert response.status_code == 200, response.json()
    assert (response.json()["version"], response.json()["loosened_tools"], response.json()["created_by"]) == (
        2, ["fake_transfer"], "admin")
    assert "versioned version 2 loosens the approval of fake_transfer (by admin)" in caplog.text
    version_2 = Agent.objects.get(slug="versioned", version=2)
    assert version_2.approval_policy_granted_by == people["admin"]
    warning = ("Version 2 of versioned asks for approval less often than the version before for: fake_transfer "
               "(made by admin).")
    page = admin_client.get(reverse("admin:runs_agent_change", args=[version_2.pk])).content.decode()
    assert warning in page
    assert warning not in admin_client.get(reverse("admin:runs_agent_change",
                                                   args=[Agent.objects.get(slug="versioned", version=1).pk])
                                           ).content.decode()
    changelist = admin_client.get(reverse("admin:runs_agent_changelist"), {"q": "versioned"}).content.decode()
    assert '<td class="field-loosening">⚠ fake_transfer</td>' in changelist
    assert changelist.count('<td class="field-loosening">-</td>') == 1  # version 1 loosened nothing


def test_a_change_in_the_admin_is_a_new_version_through_the_same_checks_and_warns_when_it_loosens(
        people, api, admin_client):
    core_agent(api(people["admin"]), "versioned", OLD_TURNS)
    version_1 = Agent.objects.get(slug="versioned")
    form = admin_client.get(reverse("admin:runs_agent_change", args=[version_1.pk])).context["adminform"].form
    data = {name: ("" if form[name].value() is None else form[name].value()) for name in form.fields}

    too_costly = admin_client.post(reverse("admin:runs_agent_change", args=[version_1.pk]),
                                   {**data, "max_cost_usd": "200000"})
    saved = admin_client.post(reverse("admin:runs_agent_change", args=[version_1.pk]),
                              {**data, "approval_policy": '{"fake_transfer": "never"}'}, follow=True)
    stale = admin_client.get(reverse("admin:runs_agent_change", args=[version_1.pk]))

    assert "max_cost_usd" in too_costly.context["adminform"].form.errors  # the budget limit, as the API checks it
    assert "asks for approval less often than the version before for: fake_transfer" in saved.content.decode()
    current = Agent.objects.current().get(slug="versioned")
    assert (current.version, current.approval_policy, current.loosened_tools) == (
        2, {"fake_transfer": "never"}, ["fake_transfer"])
    assert stale.context["has_change_permission"] is False  # an older version is view-only


def test_delete_archives_the_agent_no_new_runs_or_sessions_and_its_runs_stay_readable(people, api, editor, asking):
    admin, requester = api(people["admin"]), api(people["requester"])
    core_agent(admin, "versioned", OLD_TURNS)
    old_run = start_run(requester, "versioned")

    assert error_of(api(people["requester"]).delete("/api/agents/versioned/"), 403)
    assert api(editor).delete("/api/agents/versioned/").status_code == 204
    archived = admin.get("/api/agents/versioned/").json()
    assert admin.delete("/api/agents/versioned/").status_code == 204  # again: the same answer, nothing changes

    assert archived["archived_at"] is not None and archived["version"] == 1
    assert admin.get("/api/agents/versioned/").json() == archived
    refused = [
        requester.post("/api/runs/", {"agent": "versioned", "input": "Again."}, format="json"),
        requester.post("/api/runs/", {"agent": "versioned", "input": "Again.", "session": old_run["session"]},
                       format="json"),
        requester.post("/api/sessions/", {"agent": "versioned"}, format="json"),
    ]
    for response in refused:
        error = error_of(response, 409)
        assert error["code"] == "agent_archived" and error["details"]["agent"] == "versioned"
        assert error["message"] == "Agent 'versioned' was archived; it takes no new runs or sessions."
    assert Run.objects.filter(agent__slug="versioned").count() == 1
    assert error_of(patch(admin, "versioned", {"name": "Back"}), 409)["code"] == "agent_archived"
    assert get_run(requester, old_run["id"])["agent"] == "versioned"
    assert requester.get(f"/api/runs/{old_run['id']}/events/").status_code == 200
    assert "versioned" not in [a["slug"] for a in requester.get("/api/agents/").json()["results"]]
    assert requester.get(f"/api/agents/{asking}/").status_code == 200
    assert error_of(admin.post("/api/agents/", {"slug": "versioned", "name": "New", "model": {
        "provider": "scripted", "turns": NEW_TURNS}}, format="json"), 400)["details"]["fields"]["slug"]


def test_the_admins_archive_action_archives_the_current_version_of_each_selected_agent(people, api, admin_client,
                                                                                       asking):
    admin = api(people["admin"])
    core_agent(admin, "versioned", OLD_TURNS)
    assert patch(admin, "versioned", {"name": "Versioned, second"}).status_code == 200

    response = admin_client.post(reverse("admin:runs_agent_changelist"), {
        "action": "archive_selected_agents", "_selected_action": list(
            Agent.objects.filter(slug__in=["versioned", asking]).values_list("pk", flat=True))}, follow=True)

    assert "Archived 2 agents." in [str(message) for message in response.context["messages"]]
    assert [(a.version, a.archived_at is not None) for a in Agent.objects.filter(slug="versioned")] == [
        (1, False), (2, True)]
    assert Agent.objects.current().get(slug=asking).archived_at is not None
    assert error_of(api(people["requester"]).post("/api/runs/", {"agent": asking, "input": "Hi."},
                                                  format="json"), 409)["code"] == "agent_archived"


def test_the_sweeper_keeps_the_deadline_of_an_older_versions_runs(people, api, worker):
    admin, requester = api(people["admin"]), api(people["requester"])
    core_agent(admin, "versioned", OLD_TURNS, deadline_s=60)
    run = start_run(requester, "versioned")
    worker.drain()
    assert patch(admin, "versioned", {"deadline_s": None}).status_code == 200

    assert fail_waiting_runs_past_deadline(now=timezone.now() + timedelta(seconds=120)) == {"past_deadline": 1}

    assert (get_run(requester, run["id"])["status"], get_run(requester, run["id"])["failure_type"]) == (
        "failed", "deadline_exceeded")


def test_agents_made_before_versions_become_version_1_current(transactional_db):
    executor = MigrationExecutor(connection)
    before = [("runs", "0015_agent_tools_listed")]
    executor.migrate(before)
    old_agent = executor.loader.project_state(before).apps.get_model("runs", "Agent")
    old_agent.objects.create(slug="old", name="Old", model={"provider": "scripted", "turns": []})

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # every app, not only runs: later tests need the whole schema

    agent = Agent.objects.get(slug="old")
    assert (agent.version, agent.is_current, agent.archived_at, agent.loosened_tools) == (1, True, None, [])


@pytest.fixture
def held_mcp_tool(settings):
    """The MCP server ``files`` configured (never connected to) with ``delete_record`` and ``lookup`` in its
    cached listing (``tools.mcp.discovery.store_listing``); returns a function that holds ``delete_record``
    (a later listing changed its schema)."""
    from tools.mcp.conf import servers
    from tools.mcp.discovery import store_listing

    settings.TOLLGATE = {**settings.TOLLGATE, "MCP_SERVERS": {"files": {"url": "https://files.example.com/mcp"}}}
    schema = {"type": "object", "properties": {"record_id": {"type": "integer", "maximum": 100}}}
    listing = {"delete_record": {"description": "Delete a record.", "inputSchema": schema, "annotations": {}},
               "lookup": {"description": "Look up.", "inputSchema": {"type": "object"},
                          "annotations": {"readOnlyHint": True}}}
    store_listing(servers()["files"], listing, actor="test")

    def hold():
        changed = {**listing, "delete_record": {**listing["delete_record"], "inputSchema": {
            **schema, "properties": {"record_id": {"type": "integer", "maximum": 1000}}}}}
        store_listing(servers()["files"], changed, actor="test")

    return hold


def test_a_patch_not_touching_a_held_mcp_tool_succeeds_and_one_touching_it_is_a_clear_400(people, api, held_mcp_tool):
    admin = api(people["admin"])
    core_agent(admin, "versioned", OLD_TURNS, tools=["fake_lookup", "files.delete_record", "files.lookup"],
               approval_policy={"files.delete_record": "always", "files.lookup": "always"},
               completion_check="default")
    held_mcp_tool()

    renamed = patch(admin, "versioned", {"name": "Renamed", "approval_policy": {
        "files.delete_record": "always", "files.lookup": "always", "fake_lookup": "always"}})
    dropped = patch(admin, "versioned", {"tools": ["fake_lookup", "files.lookup"]})
    assert renamed.status_code == 200, renamed.json()
    assert dropped.status_code == 200, dropped.json()  # giving the held tool up does not need it
    unruled = field_errors(patch(admin, "versioned", {"approval_policy": {"files.lookup": "always"}}))
    assert unruled["approval_policy"][0].endswith("before its rule can be changed.")
    added = field_errors(patch(admin, "versioned", {"tools": ["fake_lookup", "files.lookup", "files.delete_record"]}))
    assert added == {"tools": ["The tool 'files.delete_record' is held for an operator: its definition changed "
                               "since it was accepted, and an operator must accept it before it can be given."]}

    core_agent(admin, "second", OLD_TURNS, tools=["files.lookup"], completion_check="default")
    assert patch(admin, "versioned", {"tools": ["files.delete_record"], "approval_policy": {}}).status_code == 400
    ruled = field_errors(patch(admin, "second", {"approval_policy": {"files.delete_record": "always"}}))
    assert ruled == {"approval_policy": ["The tool 'files.delete_record' is held for an operator: its definition "
                                         "changed since it was accepted, and an operator must accept it before its "
                                         "rule can be changed."]}
    assert [v["version"] for v in versions(admin, "versioned")] == [1, 2, 3]
