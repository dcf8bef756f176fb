"""Pending inbox items made the way the engine makes them, without running a model: for list tests.

``pending_call`` starts a run, records one tool call awaiting approval and
opens its item through ``approvals.services.request_approval`` (so rule and
target are filled as in production), then puts the run to wait.
"""

import json
from datetime import timedelta

from django.utils import timezone

from approvals.models import Interrupt
from approvals.services import request_approval
from runs.engine.lifecycle import start_run
from runs.models import Agent, Step
from runs.transitions import apply
from tests.support.durability import make_agent
from tools.models import ToolCall
from tools.registry import all_tools, get_tool


def agent(slug: str = "refunder"):
    """The scripted agent ``slug`` (never advanced here; may call every registered tool), made on first use."""
    return Agent.objects.filter(slug=slug).first() or make_agent(slug, [{"content": "done"}],
                                                                 tools=[tool.name for tool in all_tools()])


def pending_call(*, requester, name: str = "refund", arguments: dict | None = None, agent_=None,
                 expires_in: timedelta | None = timedelta(hours=48), rule: str = "sum(amount) per target > 50",
                 created_ago: timedelta | None = None) -> Interrupt:
    """One pending approval item for a call of tool ``name`` with ``arguments`` in a new waiting run.

    ``expires_in`` None: the item never expires. ``created_ago``: backdate its ``created_at``.
    """
    arguments = {"order_id": 123, "amount": 80} if arguments is None else arguments
    run = start_run(agent=agent_ or agent(), user=requester, input="please")
    apply(run.start, actor="worker")
    step = Step.objects.create(run=run, index=0)
    call = ToolCall.objects.create(run=run, step=step, index=0, provider_call_id=f"c{run.pk}", name=name,
                                   arguments=arguments, raw_arguments=json.dumps(arguments),
                                   side_effect=True)
    apply(call.request_approval, actor="worker")
    item = request_approval(tool_call=call, tool=get_tool(name), rule=rule)
    changes = {"expires_at": timezone.now() + expires_in if expires_in is not None else None}
    if created_ago is not None:
        changes["created_at"] = timezone.now() - created_ago
    Interrupt.objects.filter(pk=item.pk).update(**changes)
    apply(run.wait, actor="worker", waiting_reason="approval")  # live pages hear of the item now
    item.refresh_from_db()
    return item
