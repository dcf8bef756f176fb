"""Helpers shared by the durability tests: scripted agents and waiting for leases."""

import time

from runs.models import Agent, Run


def make_agent(slug: str, turns: list[dict], *, tools: list[str], check: str = "default") -> Agent:
    """A scripted agent with the given turns (see runs/providers/scripted.py)."""
    return Agent.objects.create(slug=slug, name=slug, model={"provider": "scripted", "turns": turns},
                                tools=tools, completion_check=check)


def lookup_agent(slug: str = "lookup") -> Agent:
    """A scripted agent that calls the ``fake_lookup`` test tool once, then answers (tests/support/fake_tools.py)."""
    return make_agent(slug, [{"tool_calls": [{"name": "fake_lookup", "arguments": {"key": "a"}}]},
                             {"content": "Found it."}], tools=["fake_lookup"])


def wait_for_lease_expiry(run_id: int, timeout_s: float = 10) -> None:
    """Block until the run's lease (left by a killed worker) has expired."""
    from django.utils import timezone

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        expires = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run_id)
        if expires is None or expires < timezone.now():
            return
        time.sleep(0.05)
    raise AssertionError(f"lease of run {run_id} did not expire")
