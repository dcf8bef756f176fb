"""Helpers shared by the durability tests: scripted agents and waiting for leases."""

import time

from runs.models import Agent, Run


ACCOUNT = {"type": "object", "properties": {"account": {"type": "string"}}, "required": ["account"],
           "additionalProperties": False}


def paying_tool(monkeypatch, sent: list, *, name: str = "test_pay", target_key: str = "account"):
    """Register (for the test, through ``monkeypatch``) a side-effecting tool ``name`` that pays ``{"account"}``:
    it appends the account to ``sent`` and returns ``{"paid": account, "payment_id": "pay-<n>"}``. No reconcile
    hook, as many a plug-in's; ``target_key`` "" for none. Returns the ``tools.registry.Tool``."""
    from tools import registry
    from tools.registry import Tool

    def pay(ctx, args):
        sent.append(args["account"])
        return {"paid": args["account"], "payment_id": f"pay-{len(sent)}"}

    tool = Tool(name=name, description="pay", parameters=ACCOUNT, handler=pay, side_effect=True,
                target_key=target_key)
    monkeypatch.setitem(registry._TOOLS, tool.name, tool)
    return tool


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
