"""Tools of a real MCP server process (tests/support/fakes/mcp_server.py, the SDK's server side) under Tollgate's rules.

The server runs on loopback behind a proxy that can cut its connections
(tests/support/mcp.py); agents are scripted (runs/providers/scripted.py).
"""

import io
import threading

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.core.exceptions import ImproperlyConfigured

from approvals.models import Interrupt, InterruptKind, InterruptStatus
from tests.support.api import create_agent, error_of, events, field_errors, get_run, pending_interrupts, start_run, tool_calls
from runs.sweeping import sweep
from tests.support.webhooks import wait_until
from tests.support.mcp import TOKEN_ENV, CuttingProxy, McpServer
from tools.mcp.discovery import accept, refresh
from tools.mcp.startup import check_servers
from tools.models import McpTool, McpToolEvent
from tools.registry import get_tool

LOOKUP = {"name": "files.lookup", "arguments": {"key": "a"}}
DELETE_7 = {"name": "files.delete_record", "arguments": {"record_id": 7, "reason": "duplicate"}}


@pytest.fixture(scope="module")
def mcp_process(tmp_path_factory):
    server = McpServer(tmp_path_factory.mktemp("mcp")).start()
    proxy = CuttingProxy(server.port)
    yield server, proxy
    proxy.close()
    server.stop()


@pytest.fixture
def mcp(mcp_process, settings, monkeypatch, transactional_db):
    """The fake server configured as ``files`` (through the proxy) and its tools listed; yields the ``McpServer``."""
    server, proxy = mcp_process
    if server.process is None or server.process.poll() is not None:
        server.start()
    monkeypatch.setenv(TOKEN_ENV, "Bearer s3cret")
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "WEBHOOK_ALLOW_HTTP": True,
                         "MCP_SERVERS": {"files": {"url": f"http://127.0.0.1:{proxy.port}/mcp",
                                                   "auth_header_env": TOKEN_ENV, "timeout_s": 10,
                                                   "max_attempts": 8, "backoff_s": 0.5}}}
    check_servers()
    refresh("files")
    server.proxy = proxy
    yield server
    server.journal_path.unlink(missing_ok=True)
    if server.listing != (False, False):  # a test that changed the listing failed before restoring it
        server.start()


def mcp_agent(api, people, slug, turns, tools=("files.*",)):
    return create_agent(api(people["admin"]), slug, turns, tools=list(tools), completion_check="default")


def test_listing_is_cached_with_annotations_and_the_annotations_only_make_tools_safer(mcp):
    assert set(McpTool.objects.values_list("name", flat=True)) == {
        "lookup", "delete_record", "tag_record", "failing", "picture"}
    assert set(McpToolEvent.objects.values_list("kind", flat=True)) == {"discovered"}
    lookup, delete, tag = get_tool("files.lookup"), get_tool("files.delete_record"), get_tool("files.tag_record")
    assert (lookup.side_effect, lookup.approval, lookup.idempotent) == (False, "never", False)
    assert (delete.side_effect, delete.approval, delete.idempotent) == (True, "always", False)
    assert (tag.side_effect, tag.approval, tag.idempotent, tag.max_attempts) == (True, "never", True, 2)
    assert delete.schema_errors({"record_id": 500, "reason": "x"}) == ["record_id: 500 is greater than the maximum of 100"]
    assert get_tool("files.nope") is None and get_tool("other.lookup") is None


def test_the_api_lists_the_mcp_tools_as_it_lists_in_process_tools(mcp, people, api):
    listed = {tool["name"]: tool for tool in api(people["requester"]).get("/api/tools/").json()["results"]}
    assert {"fake_transfer", "files.lookup", "files.delete_record", "files.tag_record"} <= set(listed)
    assert (listed["files.lookup"]["side_effect"], listed["files.lookup"]["approval"]) == (False, "never")
    assert (listed["files.delete_record"]["side_effect"], listed["files.delete_record"]["approval"]) == (True, "always")
    assert (listed["files.lookup"]["location"], listed["fake_transfer"]["location"]) == ("MCP server files", "")


def test_an_operator_rule_replaces_the_rule_the_annotations_give(mcp, settings):
    profile = settings.TOLLGATE["MCP_SERVERS"]["files"]
    settings.TOLLGATE = {**settings.TOLLGATE, "MCP_SERVERS": {"files": {
        **profile, "rules": {"delete_record": "never", "lookup": "always"}}}}
    assert get_tool("files.delete_record").approval == "never"
    assert get_tool("files.lookup").approval == "always"


def test_read_only_tool_runs_without_approval_and_carries_the_ids_in_meta(mcp, worker, people, api):
    agent = mcp_agent(api, people, "mcp-lookup", [{"tool_calls": [LOOKUP]}, {"content": "Found it."}])
    requester = api(people["requester"])
    run = start_run(requester, agent["slug"], "Look up a.")
    worker.drain()

    run = get_run(requester, run["id"])
    call, = tool_calls(requester, run["id"])
    assert (run["status"], call["status"]) == ("completed", "succeeded")
    assert call["result"] == {"text": '{\n  "key": "a",\n  "value": "value of a"\n}'}
    assert not Interrupt.objects.filter(run_id=run["id"]).exists()
    sent, = mcp.journal("lookup")
    assert sent["meta"]["io.tollgate/runId"] == run["id"]
    assert sent["meta"]["io.tollgate/toolCallId"] == call["id"]


def test_destructive_tool_waits_for_approval_an_edit_the_schema_refuses_is_400_then_a_valid_edit_runs_once(
        mcp, worker, people, api):
    agent = mcp_agent(api, people, "mcp-delete", [{"tool_calls": [DELETE_7]}, {"content": "Deleted."}])
    requester, approver = api(people["requester"]), api(people["approver"])
    run = start_run(requester, agent["slug"], "Delete record 7.")
    worker.drain()
    item, = pending_interrupts(approver, run["id"])
    assert mcp.journal("delete_record") == []

    refused = approver.post(f"/api/interrupts/{item['id']}/approve/",
                            {"arguments": {"record_id": 500, "reason": "duplicate"}}, format="json")
    assert "500 is greater than the maximum of 100" in str(error_of(refused, 400))
    assert [i["id"] for i in pending_interrupts(approver, run["id"])] == [item["id"]]

    approved = approver.post(f"/api/interrupts/{item['id']}/approve/",
                             {"arguments": {"record_id": 8, "reason": "duplicate"}}, format="json")
    assert approved.status_code == 200, approved.json()
    worker.drain()

    run = get_run(requester, run["id"])
    call, = tool_calls(requester, run["id"])
    assert (run["status"], call["status"]) == ("completed", "succeeded")
    sent, = mcp.journal("delete_record")
    assert sent["arguments"] == {"record_id": 8, "reason": "duplicate"}
    assert sent["meta"]["io.tollgate/idempotencyKey"] == call["idempotency_key"] != ""


def test_is_error_is_a_failed_call_the_model_is_told_about(mcp, worker, people, api):
    agent = mcp_agent(api, people, "mcp-failing", [{"tool_calls": [{"name": "files.failing", "arguments": {}}]},
                                                 {"content": "It failed."}])
    requester = api(people["requester"])
    run = start_run(requester, agent["slug"], "Try.")
    worker.drain()
    call, = tool_calls(requester, run["id"])
    assert call["status"] == "failed"
    assert call["error"] == "Error executing tool failing: the record store is read-only today"
    assert len(mcp.journal("failing")) == 1  # an answer, not a transient failure: not sent again


def test_non_text_content_is_kept_as_a_typed_reference(mcp, worker, people, api):
    agent = mcp_agent(api, people, "mcp-picture", [{"tool_calls": [{"name": "files.picture", "arguments": {}}]},
                                                 {"content": "Here."}])
    requester = api(people["requester"])
    run = start_run(requester, agent["slug"], "Show.")
    worker.drain()
    call, = tool_calls(requester, run["id"])
    assert call["result"] == {"text": "here it is", "content": [{"type": "image", "mimeType": "image/png", "size": 32}]}


def test_a_tool_the_agent_was_not_given_gets_the_unknown_tool_refusal(mcp, worker, people, api):
    agent = mcp_agent(api, people, "mcp-narrow", [{"tool_calls": [DELETE_7]}, {"content": "Done."}],
                      tools=["files.lookup"])
    requester = api(people["requester"])
    run = start_run(requester, agent["slug"], "Delete record 7.")
    worker.drain()
    call, = tool_calls(requester, run["id"])
    assert call["status"] == "invalid"
    assert call["error"] == "Unknown tool 'files.delete_record'. Available tools: files.lookup."
    assert mcp.journal("delete_record") == []


def test_an_agent_naming_an_unlisted_tool_or_server_is_refused_at_creation(mcp, people, api):
    response = api(people["admin"]).post("/api/agents/", {
        "slug": "mcp-bad", "name": "Bad", "model": {"provider": "scripted", "turns": []},
        "tools": ["files.nope", "elsewhere.*", "files.*"]}, format="json")
    assert field_errors(response)["tools"] == ["Unknown tool 'files.nope'.", "Unknown tool 'elsewhere.*'."]


def test_a_changed_schema_is_held_for_an_operator_until_accepted(mcp, worker, people, api, settings):
    mcp.start(changed=True)
    out = io.StringIO()
    call_command("mcp_refresh", stdout=out)
    assert out.getvalue().splitlines() == ["files.delete_record: changed", "files: refreshed, 1 change(s)."]
    change = McpToolEvent.objects.get(kind="changed")
    assert change.detail["before"]["inputSchema"]["properties"]["record_id"]["maximum"] == 100
    assert change.detail["after"]["inputSchema"]["properties"]["record_id"]["maximum"] == 1000
    assert get_tool("files.delete_record") is None  # not offered, not callable

    agent = mcp_agent(api, people, "mcp-held", [{"tool_calls": [DELETE_7]}, {"content": "Done."}])
    requester = api(people["requester"])
    run = start_run(requester, agent["slug"], "Delete record 7.")
    worker.drain()
    call, = tool_calls(requester, run["id"])
    assert call["status"] == "invalid" and call["error"].startswith("Unknown tool 'files.delete_record'.")

    assert accept(McpTool.objects.get(name="delete_record"), user=people["admin"])
    assert get_tool("files.delete_record").schema_errors({"record_id": 500, "reason": "x"}) == []
    assert McpToolEvent.objects.filter(kind="accepted", actor=people["admin"].username).exists()
    mcp.start()  # the original listing for the next tests


def test_a_call_awaiting_approval_when_its_schema_changes_is_not_sent(mcp, worker, people, api):
    agent = mcp_agent(api, people, "mcp-held-pending", [{"tool_calls": [DELETE_7]}, {"content": "Done."}])
    requester, approver = api(people["requester"]), api(people["approver"])
    run = start_run(requester, agent["slug"], "Delete record 7.")
    worker.drain()
    item, = pending_interrupts(approver, run["id"])
    mcp.start(changed=True)
    refresh("files")

    edited = approver.post(f"/api/interrupts/{item['id']}/approve/",
                           {"arguments": {"record_id": 8, "reason": "duplicate"}}, format="json")
    assert error_of(edited, 400)["message"] == ("The tool 'files.delete_record' is not available now; edited "
                                                "arguments cannot be checked.")
    assert approver.post(f"/api/interrupts/{item['id']}/approve/", {}, format="json").status_code == 200
    worker.drain()
    call, = tool_calls(requester, run["id"])
    assert (call["status"], call["error"]) == ("denied", "The tool 'files.delete_record' is no longer available.")
    assert mcp.journal("delete_record") == []
    mcp.start()


def test_a_profile_pointing_at_a_refused_address_or_missing_its_secret_stops_the_start(settings, monkeypatch):
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": [], "WEBHOOK_ALLOW_HTTP": True,
                         "MCP_SERVERS": {"files": {"url": "http://169.254.169.254/mcp"}}}
    with pytest.raises(ImproperlyConfigured, match="server 'files': Refused: 169.254.169.254 is a link-local or cloud "
                                                   "metadata address"):
        check_servers()
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "MCP_SERVERS": {
        "files": {"url": "http://127.0.0.1:9/mcp", "auth_header_env": TOKEN_ENV}}}
    with pytest.raises(ImproperlyConfigured, match=f"the environment variable {TOKEN_ENV} .* is not set"):
        check_servers()
    settings.TOLLGATE = {**settings.TOLLGATE, "MCP_SERVERS": {"files.x": {"url": "http://127.0.0.1:9/mcp"}}}
    with pytest.raises(ImproperlyConfigured, match="no '.'"):
        check_servers()


def cut_when_called(mcp, tool: str, count: int = 1) -> threading.Thread:
    """A thread that cuts the proxy's connections once the server received ``count`` calls of ``tool``."""
    def cut():
        mcp.wait_for_call(tool, count)
        mcp.proxy.cut()

    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    return thread


def test_a_cut_connection_during_the_destructive_call_opens_a_reconciliation_item(mcp, worker, people, api):
    held = {"name": "files.delete_record", "arguments": {"record_id": 7, "reason": "duplicate", "hold_s": 5}}
    agent = mcp_agent(api, people, "mcp-cut", [{"tool_calls": [held]}, {"content": "Deleted."}])
    requester, approver = api(people["requester"]), api(people["approver"])
    run = start_run(requester, agent["slug"], "Delete record 7.")
    worker.drain()
    item, = pending_interrupts(approver, run["id"])
    cutter = cut_when_called(mcp, "delete_record")
    assert approver.post(f"/api/interrupts/{item['id']}/approve/", {}, format="json").status_code == 200
    worker.drain()
    cutter.join(5)

    call, = tool_calls(requester, run["id"])
    assert (call["status"], call["attempts"]) == ("unknown", 1)  # never sent again blindly
    assert len(mcp.journal("delete_record")) == 1
    run = get_run(requester, run["id"])
    assert (run["status"], run["waiting_reason"]) == ("waiting", "reconciliation")
    assert Interrupt.objects.filter(run_id=run["id"], kind=InterruptKind.RECONCILIATION,
                                    status=InterruptStatus.PENDING).count() == 1


def test_a_cut_connection_during_the_idempotent_call_sends_it_once_more_under_the_same_key(mcp, worker, people, api):
    tag = {"name": "files.tag_record", "arguments": {"record_id": 7, "tag": "vip", "hold_s": 1}}
    agent = mcp_agent(api, people, "mcp-tag", [{"tool_calls": [tag]}, {"content": "Tagged."}])
    requester = api(people["requester"])
    cutter = cut_when_called(mcp, "tag_record")
    run = start_run(requester, agent["slug"], "Tag record 7.")
    worker.drain()
    cutter.join(5)

    run = get_run(requester, run["id"])
    call, = tool_calls(requester, run["id"])
    assert (run["status"], call["status"], call["attempts"]) == ("completed", "succeeded", 2)
    first, second = mcp.journal("tag_record")
    assert first["meta"]["io.tollgate/idempotencyKey"] == second["meta"]["io.tollgate/idempotencyKey"] \
        == call["idempotency_key"]
    assert call["result"]["structured"] == {"record_id": 7, "tag": "vip", "keys_seen": 1}


def test_a_server_stopped_mid_run_means_backoff_then_the_run_completes(mcp, worker, people, api, settings):
    agent = mcp_agent(api, people, "mcp-down", [{"tool_calls": [LOOKUP]}, {"content": "Found it."}])
    requester = api(people["requester"])
    mcp.stop()
    restarter = threading.Timer(1.0, mcp.start)
    restarter.start()
    run = start_run(requester, agent["slug"], "Look up a.")
    worker.drain()
    restarter.join()

    def completed():  # a longer backoff is a timer the sweeper wakes
        sweep()
        worker.drain()
        return get_run(requester, run["id"])["status"] == "completed"

    wait_until(completed, 60, "the run to complete")

    run = get_run(requester, run["id"])
    call, = tool_calls(requester, run["id"])
    assert (run["status"], call["status"]) == ("completed", "succeeded")
    assert call["attempts"] >= 2  # refused while the server was down, sent again after a backoff
    assert len(mcp.journal("lookup")) == 1
    assert any(event["type"] == "tool_call" and event["reason"] == "retrying"
               for event in events(requester, run["id"]))


def test_an_operator_sets_a_tools_rule_in_the_admin_and_loosening_it_needs_the_permission(mcp, people, client):
    """The rule replaces the annotations' (the admin's over the settings'); each change is a ``rule`` event."""
    from django.contrib.auth.models import Permission

    tool = McpTool.objects.get(name="delete_record")
    url = f"/admin/tools/mcptool/{tool.pk}/change/"
    operator = people["approver"]
    operator.is_staff = True
    operator.save()
    operator.user_permissions.add(Permission.objects.get(codename="change_mcptool"),
                                  Permission.objects.get(codename="view_mcptool"))
    client.force_login(operator)

    refused = client.post(url, {"approval_rule": "never"})
    assert refused.status_code == 200 and "runs.loosen_approval_policy" in refused.content.decode()
    tool.refresh_from_db()
    assert tool.approval_rule == "" and get_tool("files.delete_record").approval == "always"
    assert client.post(url, {"approval_rule": "sum(record_id) per target within 1d > 3"}).status_code == 200  # no target key
    assert client.post(url, {"approval_rule": "always"}).status_code == 302  # not looser: anyone with the change right

    client.force_login(people["admin"])  # a superuser holds the loosen permission, and sees the events inline
    inline = client.get(url).context["inline_admin_formsets"][0].formset
    posted = {f"{inline.prefix}-{key}": value for key, value in inline.management_form.initial.items()}
    posted.update({f"{form.prefix}-id": form.instance.pk for form in inline.forms})
    answer = client.post(url, {"approval_rule": "record_id > 50", **posted})
    assert answer.status_code == 302, answer.context["adminform"].form.errors
    tool.refresh_from_db()
    assert tool.approval_rule == "record_id > 50" and get_tool("files.delete_record").approval == "record_id > 50"
    assert list(McpToolEvent.objects.filter(tool=tool, kind="rule").order_by("pk").values_list("actor", "detail")) == [
        (operator.username, {"before": "", "after": "always"}),
        (people["admin"].username, {"before": "always", "after": "record_id > 50"})]
    page = client.get(url).content.decode()
    assert 'name="approval_rule"' in page and 'name="description"' not in page  # only the rule is editable


@pytest.mark.parametrize("settings_rule, posted, needs_permission", [
    ("always", "never", True),  # the settings ask for every call: switching that off is loosening
    ("record_id > 50", "record_id > 90", True),  # asks less often than the settings' rule
    ("record_id > 50", "record_id > 50 or record_id < 3", False),  # asks whenever the settings' rule does
    ("never", "record_id > 90", False),  # the settings switched approval off: any rule asks at least as often
])
def test_loosening_is_judged_against_the_rule_in_force_without_the_operators_the_settings_included(
        settings_rule, posted, needs_permission, mcp, people, client, settings):
    """A staff user without ``runs.loosen_approval_policy`` cannot ask less often than the server profile's
    ``rules`` do, whatever the annotations say (``lookup`` is read-only: they ask never)."""
    from django.contrib.auth.models import Permission

    profile = settings.TOLLGATE["MCP_SERVERS"]["files"]
    settings.TOLLGATE = {**settings.TOLLGATE, "MCP_SERVERS": {"files": {
        **profile, "rules": {"lookup": settings_rule, "delete_record": settings_rule}}}}
    operator = people["approver"]
    operator.is_staff = True
    operator.save()
    operator.user_permissions.add(Permission.objects.get(codename="change_mcptool"),
                                  Permission.objects.get(codename="view_mcptool"))
    client.force_login(operator)
    for name in ("lookup", "delete_record"):
        tool = McpTool.objects.get(name=name)
        answer = client.post(f"/admin/tools/mcptool/{tool.pk}/change/", {"approval_rule": posted})
        tool.refresh_from_db()
        if needs_permission:
            assert answer.status_code == 200 and "runs.loosen_approval_policy" in answer.content.decode()
            assert tool.approval_rule == "" and get_tool(f"files.{name}").approval == settings_rule
        else:
            assert answer.status_code == 302
            assert tool.approval_rule == posted and get_tool(f"files.{name}").approval == posted


def mcp_operator(people, client):
    """The approver made staff with the MCP tools' view and change permissions (not the loosen one), logged in."""
    from django.contrib.auth.models import Permission

    operator = people["approver"]
    operator.is_staff = True
    operator.save()
    operator.user_permissions.add(Permission.objects.get(codename="change_mcptool"),
                                  Permission.objects.get(codename="view_mcptool"))
    client.force_login(operator)
    return operator


def accept_in_admin(client, tool: McpTool) -> str:
    """Run the admin's accept action on ``tool``; returns the page's messages, joined."""
    page = client.post("/admin/tools/mcptool/", {"action": "accept_selected", "_selected_action": [tool.pk]},
                       follow=True)
    assert page.status_code == 200
    return " ".join(str(message) for message in page.context["messages"])


def test_accepting_a_listing_that_claims_read_only_needs_the_loosen_permission(mcp, people, client):
    """A destructive tool relisted as ``readOnlyHint: true`` would run without approval and be retried blindly:
    accepting that loosens its policy, so ``change_mcptool`` alone is not enough."""
    mcp.start(read_only=True)
    refresh("files")
    tool = McpTool.objects.get(name="delete_record")
    assert tool.held and tool.annotations == {"readOnlyHint": True}
    operator = mcp_operator(people, client)

    said = accept_in_admin(client, tool)
    assert "runs.loosen_approval_policy" in said and "files.delete_record" in said
    tool.refresh_from_db()
    assert tool.held and get_tool("files.delete_record") is None
    assert not McpToolEvent.objects.filter(kind="accepted").exists()

    client.force_login(people["admin"])  # a superuser holds the loosen permission
    assert "Accepted 1 tool." in accept_in_admin(client, tool)
    accepted = get_tool("files.delete_record")
    assert (accepted.side_effect, accepted.approval) == (False, "never")
    assert McpToolEvent.objects.get(kind="accepted").actor == people["admin"].username
    assert operator.username != people["admin"].username
    mcp.start()


def test_accepting_a_change_that_loosens_nothing_needs_only_the_change_permission(mcp, people, client):
    mcp.start(changed=True)  # a wider schema: the approval and the retries stay as they were
    refresh("files")
    tool = McpTool.objects.get(name="delete_record")
    mcp_operator(people, client)
    assert "Accepted 1 tool." in accept_in_admin(client, tool)
    assert get_tool("files.delete_record").approval == "always"
    mcp.start()


def test_an_operator_rule_on_a_held_tool_is_judged_against_the_accepted_definition_too(mcp, people, client):
    """While ``delete_record`` is held with a read-only listing, ``never`` is what that listing would ask; the
    accepted (destructive) definition asks ``always``, and is back in force when the server reverts."""
    mcp.start(read_only=True)
    refresh("files")
    tool = McpTool.objects.get(name="delete_record")
    mcp_operator(people, client)

    refused = client.post(f"/admin/tools/mcptool/{tool.pk}/change/", {"approval_rule": "never"})
    assert refused.status_code == 200 and "runs.loosen_approval_policy" in refused.content.decode()
    mcp.start()
    refresh("files")
    tool.refresh_from_db()
    assert not tool.held and tool.approval_rule == ""
    assert get_tool("files.delete_record").approval == "always"


def served_as(mcp, monkeypatch, settings, address: str, *, trusted: list[str], name="mcp.example.com") -> dict:
    """Reach the fake server as ``name``, which resolves to ``address`` (on the proxy's port) until the test
    changes the returned ``{name: getaddrinfo answer, or an exception to raise}``; ``trusted``: the webhooks'
    allowed hosts. (The server answers only requests naming it ``localhost`` or ``127.0.0.1``.)"""
    import socket

    real = socket.getaddrinfo
    answers = {name: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, mcp.proxy.port))]}

    def resolve(host, *args, **kwargs):  # asyncio's resolver passes the name IDNA-encoded
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(answers.get(name), Exception):
            raise answers[name]
        return answers[name] if name in answers else real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    profile = settings.TOLLGATE["MCP_SERVERS"]["files"]
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": trusted, "MCP_SERVERS": {"files": {
        **profile, "url": f"http://{name}:{mcp.proxy.port}/mcp"}}}
    return answers


def test_a_server_name_resolving_to_a_refused_address_at_connection_time_gets_nothing(mcp, monkeypatch, settings):
    """DNS rebinding: the profile's name resolved to a public address when it was checked, to loopback (not
    trusted) when a listing or a call connects. The connection goes through the webhooks' guard: refused."""
    import socket

    from tools.mcp.source import SOURCE
    from tools.registry import ToolError

    answers = served_as(mcp, monkeypatch, settings, "93.184.216.34", trusted=[])
    check_servers()
    answers["mcp.example.com"] = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", mcp.proxy.port))]

    with pytest.raises(ToolError, match="may not call; nothing was sent") as refused:
        refresh("files")
    assert type(refused.value) is ToolError  # definite: not a transient failure sent again
    context = type("Context", (), {"idempotency_key": "k-1", "timeout_s": 5, "tool_call": None,
                                   "run": type("Run", (), {"pk": 1, "session_id": 2})})()
    with pytest.raises(ToolError, match="may not call; nothing was sent"):
        async_to_sync(SOURCE.get("files.lookup").handler)(context, {"key": "a"})
    assert mcp.journal() == []


def test_a_server_name_that_does_not_resolve_for_a_while_is_not_sent_then_listed(mcp, monkeypatch, settings):
    """A temporary DNS failure is ``ToolNotSent`` (no connection was made: a call is sent again after a
    backoff), not a refusal."""
    import socket

    from tools.registry import ToolNotSent

    answers = served_as(mcp, monkeypatch, settings, "127.0.0.1", trusted=["localhost"], name="localhost")
    check_servers()
    resolved = answers["localhost"]
    answers["localhost"] = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    with pytest.raises(ToolNotSent, match="its name did not resolve"):
        refresh("files")
    answers["localhost"] = resolved
    assert refresh("files").changes == ()
