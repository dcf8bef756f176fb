"""Reads for the run pages and the run WebSocket (HackSoft-style selectors).

Visibility rule, used by every browser surface: staff and holders of the
inbox permission (``approvals.decide_interrupt``) see every run; anyone
else sees the runs they requested.
"""

from django.db.models import QuerySet

from runs.models import Agent, Message, Run, RunEvent

DECIDE_PERMISSION = "approvals.decide_interrupt"


def user_sees_all_runs(*, user) -> bool:
    """Whether ``user`` may see every run (staff or inbox deciders)."""
    return bool(user.is_authenticated and (user.is_staff or user.has_perm(DECIDE_PERMISSION)))


def run_is_visible(*, user, run: Run) -> bool:
    """Whether ``user`` may see ``run`` (page, status JSON, WebSocket)."""
    if not user.is_authenticated:
        return False
    return run.requested_by_id == user.pk or user_sees_all_runs(user=user)


def run_can_cancel(*, user, run: Run) -> bool:
    """Whether ``user`` may ask to cancel ``run``: its requester, staff, or an approver."""
    return user.is_authenticated and (
        run.requested_by_id == user.pk or user.is_staff or user.has_perm(DECIDE_PERMISSION)
    )


def run_list(*, user, limit: int = 200) -> QuerySet[Run]:
    """The newest runs ``user`` may see (at most ``limit``)."""
    runs = Run.objects.select_related("agent", "requested_by").order_by("-created_at", "-id")
    if not user_sees_all_runs(user=user):
        runs = runs.filter(requested_by=user)
    return runs[:limit]


def run_get_visible(*, user, run_id: int) -> Run | None:
    """Run ``run_id`` with agent and requester loaded, or None when missing or not visible."""
    run = Run.objects.select_related("agent", "requested_by", "session").filter(pk=run_id).first()
    if run is None or not run_is_visible(user=user, run=run):
        return None
    return run


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
