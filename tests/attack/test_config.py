"""Issue 9, items 1, 2 (API permission) and 6: secrets by allow-list, agent creation rights, safe defaults.

Each test reproduces what an attacker or a careless operator did in the
issue and checks it no longer works: an agent config naming any server
variable and any host, a staff user without permissions creating agents,
the debug page and the public key (``manage.py demo`` on a real database:
tests/demo/test_demo_command.py),
the gateway's test controls from afar. Run on SQLite and PostgreSQL.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.utils import get_random_secret_key
from django.urls import reverse

from runs.admin import AgentAdminForm
from runs.models import Agent
from runs.engine.lifecycle import start_run
from tests.support.api import field_errors
from tests.support.core import asking_agent
from tests.support.fakes.llm_server import ReplayServer
from tests.support.provider import core_llm, run_to_rest  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
SECRET = "postgres://tollgate:hunter2-very-secret@db.internal/tollgate"


@pytest.fixture
def listener():
    """A local endpoint that would receive whatever a run sends (the issue's listener on 8499)."""
    with ReplayServer("openai", [{"content": "never"}]) as server:
        yield server


# --- 1. secrets and endpoints by allow-list --------------------------------------

def test_agent_config_naming_a_server_variable_and_host_is_refused(people, api, listener, monkeypatch):
    monkeypatch.setenv("DATABASE_URL_COPY", SECRET)
    model = {"provider": "openai", "model": "m", "base_url": listener.base_url, "api_key_env": "DATABASE_URL_COPY"}
    response = api(people["admin"]).post("/api/agents/", {"slug": "exfil", "name": "Exfil", "model": model},
                                       format="json")
    assert "endpoint" in field_errors(response)["model"][0]
    assert not Agent.objects.filter(slug="exfil").exists()

    form = AgentAdminForm(data={"slug": "exfil", "name": "Exfil", "model": json.dumps(model), "tools": "[]",
                                "approval_policy": "{}", "completion_check": "default", "max_turns": 20})
    assert not form.is_valid() and "model" in form.errors


def test_a_stored_raw_endpoint_sends_nothing_and_says_nothing(people, worker, listener, monkeypatch):
    # A row written before profiles (or straight into the database): refused at run time too.
    monkeypatch.setenv("DATABASE_URL_COPY", SECRET)
    agent = Agent.objects.create(slug="old", name="Old", tools=["fake_lookup"], model={
        "provider": "openai", "model": "m", "base_url": listener.base_url, "api_key_env": "DATABASE_URL_COPY"})
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert listener.requests == []
    assert "hunter2" not in run.error and "DATABASE_URL_COPY" not in run.error


def test_raw_endpoints_only_where_settings_allow_them(people, api, listener, settings):
    model = {"provider": "openai", "model": "m", "base_url": listener.base_url, "api_key_env": "TEST_KEY"}
    settings.TOLLGATE = {**settings.TOLLGATE, "ALLOW_AGENT_ENDPOINTS": True}
    response = api(people["admin"]).post("/api/agents/", {"slug": "raw", "name": "Raw", "model": model}, format="json")
    assert response.status_code == 201, response.json()
    bad = api(people["admin"]).post("/api/agents/", {"slug": "raw5", "name": "Raw", "model": {**model, "base_url": 5}},
                                  format="json")
    assert "base_url" in field_errors(bad)["model"][0]


def test_base_url_of_the_wrong_type_is_400(people, api):
    response = api(people["admin"]).post("/api/agents/", {"slug": "five", "name": "Five", "model": {
        "provider": "openai", "model": "m", "base_url": 5}}, format="json")
    assert response.status_code == 400 and not Agent.objects.filter(slug="five").exists()


def test_profiles_come_from_settings_and_unknown_ones_are_refused(people, api, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "MODEL_ENDPOINTS": {
        **settings.TOLLGATE["MODEL_ENDPOINTS"], "local": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1"}}}
    admin = api(people["admin"])
    ok = admin.post("/api/agents/", {"slug": "local", "name": "Local", "model": {
        "provider": "openai", "model": "m", "endpoint": "local"}}, format="json")
    assert ok.status_code == 201, ok.json()
    for model in ({"provider": "openai", "model": "m", "endpoint": "elsewhere"},
                  {"provider": "anthropic", "model": "m", "endpoint": "local"}):
        response = admin.post("/api/agents/", {"slug": "nope", "name": "Nope", "model": model}, format="json")
        assert response.status_code == 400, model


def test_provider_error_messages_reach_the_log_and_the_requester_masked(people, worker, core_llm, api, caplog):
    server, agent = core_llm("openai", [{"status": 401, "message": f"invalid key; by the way {SECRET}"}])
    run = run_to_rest(worker, agent, people["requester"])
    shown = api(people["requester"]).get(f"/api/runs/{run.pk}/").content.decode()
    events = api(people["requester"]).get(f"/api/runs/{run.pk}/events/").content.decode()
    steps = api(people["requester"]).get(f"/api/runs/{run.pk}/steps/").content.decode()
    assert run.error.startswith("OpenAI API error 401 (AuthenticationError): invalid key; by the way postgres://")
    assert "hunter2" not in shown + events + steps + run.error
    assert "invalid key; by the way" in caplog.text and "hunter2" not in caplog.text  # runs.base.masking



def test_an_error_event_type_echoing_the_key_is_not_kept_in_the_run(people, worker, core_llm, api, monkeypatch):
    # rev2: the "type" of an error event inside a 200 answer names the ModelError as it came (sdk_calls.
    # _error_in_answer): unlike the server's message (server_message) it is neither masked nor cut, so a key the
    # server echoes there is kept in the step, the run's error and its events, shown to every reader.
    key = "tollgate_live_key_4f7c1e9a2b"
    raw = ('data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
           'data: {"error": {"type": "%s", "message": "bad request"}}\n\n' % key)
    server, agent = core_llm("openai", [{"raw": raw, "content_type": "text/event-stream"}])
    monkeypatch.setenv("TEST_KEY", key)
    run = run_to_rest(worker, agent, people["requester"])
    shown = api(people["requester"]).get(f"/api/runs/{run.pk}/").content.decode()
    events = api(people["requester"]).get(f"/api/runs/{run.pk}/events/").content.decode()
    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert "bad request" in run.error
    assert key not in run.error + shown + events

# --- 2. agent creation needs the model permission, strict and bounded body --------

def test_staff_without_the_add_permission_cannot_create_agents(people, api):
    staff = get_user_model().objects.create_user("staff-only", password="x", is_staff=True)
    body = {"slug": "s", "name": "S", "model": {"provider": "scripted", "turns": []}}
    assert api(staff).post("/api/agents/", body, format="json").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="add_agent"))
    staff = get_user_model().objects.get(pk=staff.pk)  # drop the permission cache
    assert api(staff).post("/api/agents/", body, format="json").status_code == 201
    plain = get_user_model().objects.create_user("perm-no-staff", password="x")
    plain.user_permissions.add(Permission.objects.get(codename="add_agent"))
    assert api(plain).post("/api/agents/", {**body, "slug": "t"}, format="json").status_code == 403


def test_budgets_are_accepted_at_creation_within_bounds(people, api):
    admin = api(people["admin"])
    base = {"name": "B", "model": {"provider": "scripted", "turns": []}}
    budgets = {"max_model_calls": 5, "max_total_tokens": 10_000, "max_cost_usd": "0.25", "deadline_s": 600}
    response = admin.post("/api/agents/", {"slug": "budgeted", **base, **budgets}, format="json")
    assert response.status_code == 201, response.json()
    agent = Agent.objects.get(slug="budgeted")
    assert (agent.max_model_calls, agent.max_total_tokens, str(agent.max_cost_usd), agent.deadline_s) == (
        5, 10_000, "0.250000", 600)
    for field, value in (("max_model_calls", 0), ("max_total_tokens", 10**13), ("max_cost_usd", "-1"),
                         ("deadline_s", 10**9), ("deadline_s", "soon"), ("max_turns", 10**6)):
        response = admin.post("/api/agents/", {"slug": "over", **base, field: value}, format="json")
        assert field in field_errors(response), (field, value)
    assert not Agent.objects.filter(slug="over").exists()


# --- 6. safe defaults --------------------------------------------------------------

def _settings_probe(env: dict, code: str = "") -> subprocess.CompletedProcess:
    code = "import django; django.setup(); from django.conf import settings; print('DEBUG', settings.DEBUG)\n" + code
    clean = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings",
                                                            **env}, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_debug_is_off_unless_set_and_nothing_serves_or_signs_without_a_key(tmp_path):
    unkeyed = _settings_probe({}, "from django.core import signing; signing.dumps('session')")
    assert unkeyed.stdout.startswith("DEBUG False") and "SECRET_KEY setting must not be empty" in unkeyed.stderr
    asgi = _settings_probe({}, "import config.asgi")
    assert asgi.returncode != 0 and "SECRET_KEY must be set" in asgi.stderr
    serve = subprocess.run([sys.executable, "manage.py", "serve", "127.0.0.1:1"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60,
                           env={**{k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")},
                                "DJANGO_SETTINGS_MODULE": "config.settings",
                                "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
                                "GATEWAY_URL": "http://192.0.2.1:9"})  # a host serve would never start one on
    assert serve.returncode != 0 and "SECRET_KEY must be set" in serve.stderr
    assert "started" not in serve.stdout and "Traceback" not in serve.stderr
    public = _settings_probe({"SECRET_KEY": "tollgate-insecure-development-key"})
    assert public.returncode != 0 and "ImproperlyConfigured" in public.stderr
    keyed = _settings_probe({"SECRET_KEY": get_random_secret_key()}, "import config.asgi")
    assert keyed.returncode == 0 and keyed.stdout.strip() == "DEBUG False", keyed.stderr
    debug = _settings_probe({"DEBUG": "true"})
    assert debug.stdout.strip() == "DEBUG True", debug.stderr


@pytest.mark.parametrize("command", [["--help"], ["check"], ["demo", "--help"], ["serve", "--help"]],
                         ids=" ".join)
def test_help_and_check_run_from_a_new_shell_without_a_secret_key(command, tmp_path):
    """Nothing is served or signed, so no key is needed (issue 22): no traceback, exit 0."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    result = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    expected = "System check identified no issues" if command == ["check"] else "usage:"
    assert expected in result.stdout or (command == ["--help"] and "Available subcommands" in result.stdout)


def test_a_body_limit_below_what_an_answer_file_needs_is_refused_at_start():
    key = {"SECRET_KEY": get_random_secret_key()}
    too_small = _settings_probe({**key, "TOLLGATE_REQUEST_BODY_MAX_BYTES": "1000000"})
    assert too_small.returncode != 0 and "TOLLGATE_REQUEST_BODY_MAX_BYTES must be at least" in too_small.stderr
    enough = _settings_probe({**key, "TOLLGATE_ANSWER_FILE_MAX_BYTES": "10", "TOLLGATE_REQUEST_BODY_MAX_BYTES": "2000000"})
    assert enough.returncode == 0, enough.stderr


def readme_production_environment() -> dict[str, str]:
    """The ``export NAME=value`` lines of README's "Production environment" block."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Production environment", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    env = {}
    for line in block.splitlines():
        match = re.match(r"export (\w+)=(.*)$", line.strip())
        if match:
            env[match.group(1)] = match.group(2).strip().strip("'\"")
    return env


def test_check_deploy_is_clean_with_the_readme_production_environment():
    env = readme_production_environment()
    assert {"DEBUG", "SECRET_KEY", "SECURE_HSTS_SECONDS", "SESSION_COOKIE_SECURE", "SECURE_SSL_REDIRECT"} <= set(env)
    env["SECRET_KEY"] = "$" + get_random_secret_key()  # the README shows a placeholder; keys may start with $
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY")}
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            env={**clean, **env, "DJANGO_SETTINGS_MODULE": "config.settings"}, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNING" not in result.stdout + result.stderr


def test_pages_carry_a_content_security_policy_and_no_inline_script(client, people):
    client.force_login(people["requester"])
    run = start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme.")
    for url in ("/accounts/login/", "/inbox/", "/runs/", f"/runs/{run.pk}/", reverse("run-start")):
        response = client.get(url)
        assert response.status_code == 200, url
        policy = response["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "'unsafe-inline'" not in policy
        page = response.content.decode()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page), url
        assert not re.search(r"\son[a-z]+\s*=", page), url
        assert " style=" not in page, url


def test_password_validators_are_on():
    for weak in ("password", "12345678901234", "short"):
        with pytest.raises(ValidationError):
            validate_password(weak)
    validate_password("a-long-and-unusual-passphrase-42")
