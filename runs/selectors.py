"""Reads for the run pages and the run WebSocket (HackSoft-style selectors).

Who may see a run is ``Run.objects.visible_to`` (``runs.access``); these
functions only load what a page shows.
"""

from django.db.models import Max, Prefetch, QuerySet

from runs.models import Agent, Message, Run, RunEvent, Wait, WaitStatus


def run_list(*, user, limit: int = 200) -> QuerySet[Run]:
    """The newest runs ``user`` may see (at most ``limit``)."""
    return Run.objects.visible_to(user).select_related("agent", "requested_by").order_by("-created_at", "-id")[:limit]


def run_get_visible(*, user, run_id: int) -> Run | None:
    """Run ``run_id`` with agent, requester and session loaded, or None when missing or not visible to ``user``."""
    return Run.objects.visible_to(user).select_related("agent", "requested_by", "session").filter(pk=run_id).first()


def run_events(*, run: Run) -> QuerySet[RunEvent]:
    """The run's audit log in ``seq`` order."""
    return run.events.order_by("seq")


def run_tool_calls(*, run: Run):
    """The run's tool calls in the order they were proposed."""
    return run.tool_calls.order_by("id")


def session_messages(*, session_id: int) -> QuerySet[Message]:
    """The whole conversation of a session, oldest first (every run of it)."""
    return Message.objects.filter(session_id=session_id).select_related("run").order_by("id")


def agent_choices() -> QuerySet[Agent]:
    """Agents a user can start a run with, by slug."""
    return Agent.objects.order_by("slug")


def pending_waits() -> QuerySet[Wait]:
    """Pending waits, oldest first, each annotated ``interrupt``: the id of the newest inbox item of its
    tool call (None when it has none; a question's wait has one, the item to answer)."""
    return Wait.objects.filter(status=WaitStatus.PENDING).annotate(
        interrupt=Max("tool_call__interrupts__pk")).order_by("id")


def with_pending_waits(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with each run's ``pending_waits`` (a list, ``pending_waits()`` rows) loaded by one query
    for a whole page, so a list shows every run's ``waiting_for`` without a query per run."""
    return runs.prefetch_related(Prefetch("waits", queryset=pending_waits(), to_attr="pending_waits"))
