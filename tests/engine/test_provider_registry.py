"""Issue 10: a provider is one module plus one line in runs/providers/registry.py.

A provider that exists only in the tests (tests/support/fake_provider.py) is
registered, an agent naming it is checked by its own rules before it is
saved, and a run of it completes; a provider nobody declared is a 400.
"""

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs.engine.lifecycle import start_run
from runs.models import Agent, Run
from runs.providers import registry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def echo_provider(monkeypatch):
    monkeypatch.setattr(registry, "PROVIDER_MODULES", dict(registry.PROVIDER_MODULES))
    registry.register_provider("echo", "tests.support.fake_provider")
    return registry.get_provider("echo")


def _create(api, user, model):
    return api(user).post("/api/agents/", {"slug": "echo-agent", "name": "Echo", "model": model}, format="json")


def test_a_registered_provider_checks_its_config_and_runs(people, api, worker, echo_provider):
    refused = _create(api, people["admin"], {"provider": "echo", "reply": 5, "base_url": "http://elsewhere"})
    assert refused.status_code == 400
    body = refused.content.decode()
    assert "echo model config needs a 'reply' string" in body and "Unknown key(s) in the echo model config: base_url" in body
    assert not Agent.objects.filter(slug="echo-agent").exists()

    created = _create(api, people["admin"], {"provider": "echo", "reply": "Heard you"})
    assert created.status_code == 201, created.content
    run = start_run(agent=Agent.objects.get(slug="echo-agent"), user=people["requester"], input="hello there")
    worker.drain()
    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.final_output) == ("completed", "Heard you [hello there]")


def test_an_unknown_provider_is_a_clear_400_naming_the_known_ones(people, api, echo_provider):
    response = _create(api, people["admin"], {"provider": "oracle", "reply": "x"})
    assert response.status_code == 400
    assert "Unknown model provider 'oracle'; known: scripted, openai, anthropic, echo." in response.content.decode()
    assert not Agent.objects.filter(slug="echo-agent").exists()


def test_a_name_is_declared_once(echo_provider, monkeypatch):
    with pytest.raises(ImproperlyConfigured, match="already declared"):
        registry.register_provider("echo", "runs.providers.scripted")
    registry.register_provider("echo", "tests.support.fake_provider")  # the same line twice is harmless
    monkeypatch.setitem(registry.PROVIDER_MODULES, "mislabelled", "tests.support.fake_provider")
    with pytest.raises(ImproperlyConfigured, match="declares provider 'echo', listed as 'mislabelled'"):
        registry.get_provider("mislabelled")


def test_every_listed_provider_declares_itself_under_its_name():
    for name in registry.PROVIDER_MODULES:
        assert registry.get_provider(name).name == name
