"""Shared fixtures: demo users and data, a real Dramatiq worker, API clients.

Tests run against whatever ``DATABASE_URL`` / ``REDIS_URL`` say: PostgreSQL
and Redis in CI's production-shape pass, SQLite and the stub broker in the
embedded pass. The worker is a real ``dramatiq.Worker`` consuming the
configured broker in this process.
"""

import dramatiq
import pytest
from dramatiq import Worker
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from runs.actors import advance_run
from tools.demo_data import load_demo


def pytest_configure(config):
    from django.conf import settings

    # Demo users are created in many tests; PBKDF2 would dominate the runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class RunWorker:
    """A started Dramatiq worker; ``drain()`` waits until every queued message is processed."""

    def __init__(self, broker):
        self.broker = broker
        self.worker = Worker(broker, worker_timeout=20, worker_threads=1)

    def drain(self, timeout_s: float = 30) -> None:
        self.broker.join(advance_run.queue_name, timeout=int(timeout_s * 1000))
        self.worker.join()


@pytest.fixture
def worker(transactional_db):
    broker = dramatiq.get_broker()
    broker.flush_all()
    run_worker = RunWorker(broker)
    run_worker.worker.start()
    yield run_worker
    run_worker.worker.stop()
    broker.flush_all()


@pytest.fixture
def demo(transactional_db):
    """Load the demo data; return ``{username: User}``."""
    from django.contrib.auth import get_user_model

    load_demo()
    return {u.username: u for u in get_user_model().objects.filter(username__in=["requester", "approver", "admin"])}


@pytest.fixture
def api():
    """``api(user)`` -> a DRF ``APIClient`` authenticated with the user's token."""

    def client_for(user):
        client = APIClient()
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client

    return client_for
