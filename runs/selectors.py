"""Reads for the run pages and the run WebSocket (HackSoft-style selectors).

Who may see a run is ``Run.objects.visible_to`` (``runs.access``); these
functions only load what a page shows.
"""

from django.db.models import Max, Prefetch, QuerySet

from runs.models import Agent, Message, Run, RunEvent, Wait, WaitStatus

# The attribute ``with_pending_waits`` puts the prefetched waits on each run under.
PENDING_WAITS = "pending_waits"


def run_list(*, user, limit: int = 200) -> QuerySet[Run]:
    """The newest runs ``user`` may see (at most ``limit``)."""
    return Run.objects.visible_to(user).select_related("agent", "requested_by").order_by("-created_at", "-id")[:limit]


def run_get_visible(*, user, run_id: int) -> Run | None:
    """Run ``run_id`` with agent, requester and session loaded, or None when missing or not visible to ``user``."""
    return Run.objects.visible_to(user).select_related("agent", "requested_by", "session").filter(pk=run_id).first()


def run_events(*, run: Run) -> QuerySet[RunEvent]:
    """The run's audit log in ``seq`` order."""
    return run.events.order_by("seq")


def run_events_after(*, run_id: int, seq: int) -> QuerySet[RunEvent]:
    """Run ``run_id``'s events with a ``seq`` above ``seq``, in ``seq`` order (a client resuming the log)."""
    return RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq")


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
    """Pending waits, oldest first, each annotated ``interrupt_id``: the newest inbox item of its tool call (or None)."""
    return (Wait.objects.filter(status=WaitStatus.PENDING).annotate(interrupt_id=Max("tool_call__interrupts__id"))
            .order_by("id"))


def with_pending_waits(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with their pending waits prefetched as the list ``run.pending_waits``: one query per page, not per run."""
    return runs.prefetch_related(Prefetch("waits", queryset=pending_waits(), to_attr=PENDING_WAITS))
