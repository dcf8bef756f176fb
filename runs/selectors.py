"""Reads for the run pages and the run WebSocket (HackSoft-style selectors).

Who may see a run is ``Run.objects.visible_to`` (``runs.access``); these
functions only load what a page shows. ``final_output_status`` is the one
rule for how recorded facts stand to the model's final text, asked by the
run page, the API's run and the ``run.completed`` webhook.
"""

from dataclasses import asdict, dataclass, field

from django.db.models import Max, Prefetch, QuerySet

from approvals.models import Decision, Interrupt, InterruptKind
from runs.engine.completion import call_facts, unresolved_calls
from runs.models import Agent, Message, Outcome, Run, RunEvent
from tools.models import ToolCall, ToolCallStatus, Wait, WaitStatus
from tools.services.edits import argument_changes, proposed_arguments

# The attribute ``with_pending_waits`` puts the prefetched waits on each run under.
PENDING_WAITS = "pending_waits"
# The attributes ``with_final_output_facts`` puts a run's tool calls and edited approvals under.
CALLS_IN_ORDER = "calls_in_order"
EDITED_APPROVALS = "edited_approvals"


def run_list(*, user, limit: int = 200) -> QuerySet[Run]:
    """The newest runs ``user`` may see (at most ``limit``)."""
    return Run.objects.visible_to(user).select_related("agent", "requested_by").order_by("-created_at", "-id")[:limit]


def run_get_visible(*, user, run_id: int) -> Run | None:
    """Run ``run_id`` with agent, requester and session loaded, or None when missing or not visible to ``user``."""
    return Run.objects.visible_to(user).select_related("agent", "requested_by", "session").filter(pk=run_id).first()


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
    """Agents a user can start a run with (current versions, not archived), by slug."""
    return Agent.objects.listed().order_by("slug")


def pending_waits() -> QuerySet[Wait]:
    """Pending waits, oldest first, each annotated ``interrupt_id``: the newest inbox item of its tool call (or None)."""
    return (Wait.objects.filter(status=WaitStatus.PENDING).annotate(interrupt_id=Max("tool_call__interrupts__id"))
            .order_by("id"))


def with_pending_waits(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with their pending waits prefetched as the list ``run.pending_waits``: one query per page, not per run."""
    return runs.prefetch_related(Prefetch("waits", queryset=pending_waits(), to_attr=PENDING_WAITS))


# ``FinalOutputStatus.code``: how the recorded facts stand to the model's final text.
ABSENT = "absent"                      # no final text (the run did not complete, or the model said nothing)
NOT_CONTRADICTED = "not_contradicted"  # no recorded fact conflicts with it (the program never reads it)
CONTRADICTED = "contradicted"          # the facts in ``conflicts`` do
FINAL_OUTPUT_CODES = [ABSENT, NOT_CONTRADICTED, CONTRADICTED]
# ``Conflict.code``: which fact.
OUTCOME_NOT_ACHIEVED = "outcome_not_achieved"
CALL_WITHOUT_EFFECT = "call_without_effect"
CALL_OUTCOME_UNKNOWN = "call_outcome_unknown"
ARGUMENTS_EDITED = "arguments_edited"
CONFLICT_CODES = [OUTCOME_NOT_ACHIEVED, CALL_WITHOUT_EFFECT, CALL_OUTCOME_UNKNOWN, ARGUMENTS_EDITED]


@dataclass(frozen=True)
class Conflict:
    """One recorded fact that conflicts with the model's final text (docs/design.md#outcomes).

    ``code``: ``outcome_not_achieved`` (``status``/``detail``: the outcome and its reason), ``call_without_effect``,
    ``call_outcome_unknown`` or ``arguments_edited``. ``changes``: ``tools.services.edits.argument_changes`` of a call
    approved with edits, else ``[]``.
    """

    code: str
    status: str
    detail: str = ""
    tool_call: int | None = None
    tool: str = ""
    changes: list = field(default_factory=list)


@dataclass(frozen=True)
class FinalOutputStatus:
    """What the recorded facts say of a run's final text: ``code`` (``absent``, ``not_contradicted``,
    ``contradicted``) and the ``conflicts`` (empty unless contradicted), the outcome first, then calls in order."""

    code: str
    conflicts: tuple[Conflict, ...] = ()

    @property
    def contradicted(self) -> bool:
        return self.code == CONTRADICTED

    def as_dict(self) -> dict:
        """``{"code", "conflicts": [{"code", "status", "detail", "tool_call", "tool", "changes"}]}`` (JSON-ready)."""
        return {"code": self.code, "conflicts": [asdict(conflict) for conflict in self.conflicts]}


def with_final_output_facts(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with what ``final_output_status`` reads prefetched: two queries per page, not two per run.

    Only runs with a final text or an outcome have anything read (the
    others are ``absent`` and have nothing to explain,
    ``runs.web.explanations``): a page of runs under way loads none of their calls.
    """
    calls = ToolCall.objects.exclude(run__final_output="", run__outcome="").order_by("id").only(
        "id", "run_id", "name", "side_effect", "status", "error", "raw_arguments", "arguments", "duplicate_of_id")
    return runs.prefetch_related(
        Prefetch("tool_calls", queryset=calls, to_attr=CALLS_IN_ORDER),
        Prefetch("interrupts", queryset=_edited_approvals().exclude(run__final_output="", run__outcome=""),
                 to_attr=EDITED_APPROVALS))


def _edited_approvals() -> QuerySet[Interrupt]:
    return Interrupt.objects.filter(kind=InterruptKind.APPROVAL, decision=Decision.APPROVED,
                                    edited_arguments__isnull=False).order_by("id")


def final_output_status(run: Run) -> FinalOutputStatus:
    """Whether the recorded facts of ``run`` contradict the model's final text; the one rule for page, API, webhooks.

    Decided from facts only, never from the text: the final text (when
    there is one) is contradicted when the run's outcome is
    ``not_achieved``, when a side-effecting call ended without its effect
    and no later call of the tool on the same target made up for it (the
    outcome's own rule, ``runs.engine.completion.unresolved_calls``), when
    a side-effecting call's effect is unknown, or when a call was executed
    with arguments a person edited (the model proposed something else).
    Reads the run's calls and edited approvals (prefetched by
    ``with_final_output_facts``, else two queries; none without a final text).
    """
    if not run.final_output:
        return FinalOutputStatus(ABSENT)
    calls = getattr(run, CALLS_IN_ORDER, None)
    if calls is None:
        calls = list(run.tool_calls.order_by("id"))
    edited = getattr(run, EDITED_APPROVALS, None)
    if edited is None:
        edited = list(_edited_approvals().filter(run=run))
    by_id = {call.pk: call for call in calls}
    changes = {item.tool_call_id: argument_changes(proposed_arguments(by_id[item.tool_call_id]), item.edited_arguments)
               for item in edited if item.tool_call_id in by_id}  # the newest approval of a call speaks
    conflicts = []
    if run.outcome == Outcome.NOT_ACHIEVED:
        conflicts.append(Conflict(OUTCOME_NOT_ACHIEVED, run.outcome, run.outcome_reason))
    without_effect = {fact.id for fact in unresolved_calls(call_facts(run, calls)) if fact.side_effect}
    for call in calls:
        code = _conflict_code(call, without_effect, bool(changes.get(call.pk)))
        if code:
            conflicts.append(Conflict(code, call.status, call.error, call.pk, call.name, changes.get(call.pk) or []))
    return FinalOutputStatus(CONTRADICTED if conflicts else NOT_CONTRADICTED, tuple(conflicts))


def _conflict_code(call: ToolCall, without_effect: set[int], edited: bool) -> str:
    if call.pk in without_effect:
        return CALL_WITHOUT_EFFECT
    if call.side_effect and call.status == ToolCallStatus.UNKNOWN:
        return CALL_OUTCOME_UNKNOWN
    if edited and call.status == ToolCallStatus.SUCCEEDED:
        return ARGUMENTS_EDITED
    return ""
