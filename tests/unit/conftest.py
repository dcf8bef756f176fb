"""Fixtures of the unit tests."""

import pytest

from tests.support.fakes.llm_server import ReplayServer
from tests.support.provider import model_config


@pytest.fixture
def endpoint(monkeypatch, settings):
    """``endpoint(provider, script, **model)`` -> ``(server, model config)``: a ``ReplayServer`` started as an
    operator's endpoint profile (stopped after the test)."""
    monkeypatch.setenv("TEST_KEY", "x")
    servers = []

    def make(provider: str, script: list[dict], **model):
        server = ReplayServer(provider, script).start()
        servers.append(server)
        return server, model_config(settings, server, f"replay-{len(servers)}", **model)

    yield make
    for server in servers:
        server.stop()
