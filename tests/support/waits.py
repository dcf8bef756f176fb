"""Helpers for the tests of waiting runs: scripted agents with the built-in waiting tools, the sweeper."""

import json
from datetime import timedelta

from django.utils import timezone

from runs.sweeping import sweep
from runs.wakeups import runs_with_pending_wakeups
from tests.support.api import create_agent


def waiting_agent(admin_api, slug: str, call: dict, final: str = "Done.", **extra) -> str:
    """A scripted agent whose first turn makes ``call`` (one tool call) and whose second answers ``final``."""
    tools = extra.pop("tools", [call["name"]])
    turns = [{"tool_calls": [call]}, {"content": final}]
    return create_agent(admin_api, slug, turns, tools=tools, completion_check="default", **extra)["slug"]


def sweep_later(seconds: float) -> dict:
    """One sweeper pass as if ``seconds`` had passed (waits are due by the sweeper's own clock)."""
    return sweep(now=timezone.now() + timedelta(seconds=seconds))


def tool_result(run_id: int, name: str) -> dict:
    """The parsed tool-result message the model got for the run's (only) call of ``name``."""
    from runs.models import Message
    from tools.models import ToolCall

    call = ToolCall.objects.get(run_id=run_id, name=name)
    message = Message.objects.get(run_id=run_id, role="tool", tool_call_id=call.provider_call_id)
    return json.loads(message.content)


def worker_idle(run_worker) -> bool:
    """True when the in-process worker has no message in hand, none delayed, and the broker holds none."""
    worker = run_worker.worker
    busy = worker.work_queue.unfinished_tasks or any(
        consumer.delay_queue.unfinished_tasks for consumer in worker.consumers.values())
    return not busy and runs_with_pending_wakeups() == set()
