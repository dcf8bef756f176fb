"""The demo's fixtures: its real payment gateway (one process for the session, a fresh ledger for every
test here) and its data (``demo``: the demo users, orders and agents)."""

import pytest

from tests.demo.gateway import GatewayProcess


@pytest.fixture(scope="session")
def gateway_process(tmp_path_factory):
    """The demo's payment gateway, one process for the session (``tests.demo.gateway.GatewayProcess``)."""
    process = GatewayProcess(tmp_path_factory.mktemp("gateway"))
    process.start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def payment_gateway(gateway_process, settings):
    """The demo's gateway with a fresh ledger and no faults, named by ``settings.GATEWAY_URL``: for every test here."""
    gateway_process.ensure_running()
    settings.GATEWAY_URL = gateway_process.url
    gateway_process.reset()
    return gateway_process


@pytest.fixture
def demo(transactional_db, payment_gateway):
    """Load the demo data; return ``{username: User}``. The demo's tools talk to ``payment_gateway``."""
    from django.contrib.auth import get_user_model

    from tools.demo.data import load_demo

    load_demo()
    return {u.username: u for u in get_user_model().objects.filter(username__in=["requester", "approver", "admin"])}
