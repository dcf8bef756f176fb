"""Issue 22: an agent saved without a ``tools`` list calls no tools, never every registered tool.

Every write path (the API, the admin's form, the service behind both)
stores an empty list, which offers the model nothing; a call the model
makes anyway is ``invalid`` and has no effect. Agents saved before, when
an empty list meant every tool, keep what they had, listed by name
(migration ``runs`` 0015).
"""

import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from runs.models import Agent
from tests.support.api import get_run, start_run
from tests.support.fake_tools import transfers
from tests.support.fakes.llm_server import ReplayServer
from tests.support.provider import TRANSFER_80, model_config
from tools.models import ToolCall
from tools.registry import all_tools, tools_for_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def model_server(settings, monkeypatch):
    """An OpenAI-compatible server whose model calls ``fake_transfer`` first, then answers; with its endpoint
    profile."""
    monkeypatch.setenv("TEST_KEY", "x")
    server = ReplayServer("openai", [{"tool_calls": [TRANSFER_80]}, {"content": "I cannot send it."}]).start()
    server.config = model_config(settings, server, "tools-default", stream=False)
    yield server
    server.stop()


@pytest.mark.parametrize("tools", ["omitted", []])
def test_an_agent_created_over_the_api_without_tools_offers_the_model_none_and_its_calls_do_nothing(
        worker, people, api, model_server, tools):
    body = {"slug": "no-tools", "name": "No tools", "model": model_server.config}
    if tools != "omitted":
        body["tools"] = tools
    created = api(people["admin"]).post("/api/agents/", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["tools"] == []

    run = start_run(api(people["requester"]), "no-tools", "Send 80 to acme.")
    worker.drain()

    first = model_server.bodies()[0]
    assert "tools" not in first, "the model is offered no tool"
    call = ToolCall.objects.get(run_id=run["id"], name="fake_transfer")
    assert call.status == "invalid" and "Unknown tool 'fake_transfer'" in call.error
    assert transfers() == []
    assert get_run(api(people["requester"]), run["id"])["status"] == "completed"


def test_an_agent_added_in_the_admin_with_no_tool_ticked_has_none(admin_client):
    response = admin_client.post(reverse("admin:runs_agent_add"), {
        "slug": "admin-no-tools", "name": "Admin, no tools", "instructions": "",
        "model": json.dumps({"provider": "scripted", "turns": [{"content": "Hello."}]}),
        "approval_policy": "{}", "completion_check": "default", "max_turns": 20})

    assert response.status_code == 302, response.context["adminform"].form.errors
    agent = Agent.objects.get(slug="admin-no-tools")
    assert agent.tools == [] and tools_for_agent(agent) == []
    changelist = admin_client.get(reverse("admin:runs_agent_changelist"), {"q": "admin-no-tools"})
    assert '<td class="field-tool_list">none</td>' in changelist.content.decode()


def test_agents_saved_before_keep_every_tool_they_had_listed_by_name():
    """The data migration: an empty list saved under the old meaning becomes the registered tools' names."""
    executor = MigrationExecutor(connection)
    before = [("runs", "0014_stored_json_decoder")]
    after = executor.loader.graph.leaf_nodes()  # every app back where it is now, runs through 0015 and on
    executor.migrate(before)
    old_agent = executor.loader.project_state(before).apps.get_model("runs", "Agent")
    old_agent.objects.create(slug="old-all", name="Old", model={"provider": "scripted", "turns": []}, tools=[])
    old_agent.objects.create(slug="old-some", name="Old", model={"provider": "scripted", "turns": []},
                             tools=["fake_lookup"])

    executor = MigrationExecutor(connection)
    executor.migrate(after)

    assert Agent.objects.get(slug="old-all").tools == [tool.name for tool in all_tools()]
    assert Agent.objects.get(slug="old-some").tools == ["fake_lookup"]
