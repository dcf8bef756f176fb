"""Fixtures of the REST API tests, on the tests' own tools (``tests.support.core``) rather than the demo.

* ``asking``: the slug of ``asking_agent()`` (send-80): a run of it looks acme
  up, then waits for the approval of a transfer of 80 (the demo's
  refund-order, on the tests' own tools);
* ``refused``: the slug of ``refused_agent()`` (send-500): another stored
  agent, whose run completes ``not_achieved`` without waiting;
* ``outsider``: a user with no permissions, who sees only their own runs.

Users come from ``people`` (``tests/conftest.py``).
"""

import pytest
from django.contrib.auth import get_user_model

from tests.support.core import asking_agent, refused_agent


@pytest.fixture
def asking(people) -> str:
    """The slug of ``tests.support.core.asking_agent`` (made now)."""
    return asking_agent().slug


@pytest.fixture
def refused(people) -> str:
    """The slug of ``tests.support.core.refused_agent`` (made now)."""
    return refused_agent().slug


@pytest.fixture
def outsider(people):
    """A user without permissions, besides ``people``."""
    return get_user_model().objects.create_user("outsider", password="x")
