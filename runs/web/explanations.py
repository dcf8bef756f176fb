"""What happened in a run, in the reader's language: the outcome's explanation and the timeline's entries.

The stored texts stay as they were written: ``Run.outcome_reason`` and
``RunEvent.reason`` are English, the audit record the API and the webhooks
return. Pages read them through this module instead, which builds each
sentence when it is shown from recorded facts only (the run's outcome and
tool calls; an event's type, statuses and payload), never from the stored
English, and translates it with gettext. Statuses read through
``runs.base.labels``, tool calls through their titles
(``tools.services.summary.title_of``).

A stored text is still shown, beneath the sentence, where it carries words
no template of ours wrote: a person's comment or evidence, a tool's error,
a model provider's error, the reason an actor gave for cancelling, a
completion check's own explanation. An event of a kind not covered here is
shown with its stored reason alone.
"""

from dataclasses import dataclass

from django.db.models import QuerySet
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, ngettext

from approvals.models import Decision, Interrupt, InterruptKind
from runs.engine.completion import call_facts, deciding_calls, unresolved_calls
from runs.base.labels import label
from runs.models import Outcome, Run, RunEvent, RunStatus
from runs.selectors import CALLS_IN_ORDER
from tools.models import ToolCall, ToolCallStatus
from tools.models.tool_call import FINAL_STATUSES
from tools.services.summary import title_of

S = ToolCallStatus


@dataclass(frozen=True)
class Explanation:
    """A sentence in the active language (``text``) and, beneath it, stored words it does not carry (``detail``)."""

    text: str
    detail: str = ""


def call_label(call: ToolCall) -> str:
    """A tool call as a page names it: its number and title ("#12 Refund 80.00 on order 123"), in the active language."""
    return _("#%(id)s %(title)s") % {"id": call.pk, "title": title_of(call)}


def _calls(run: Run) -> list[ToolCall]:
    calls = getattr(run, CALLS_IN_ORDER, None)
    return list(run.tool_calls.order_by("id")) if calls is None else calls


def _rejection_comment(call: ToolCall) -> str:
    item = Interrupt.objects.filter(tool_call=call, decision=Decision.REJECTED).order_by("-id").first()
    return item.comment if item is not None else ""


def _ended(call: ToolCall) -> Explanation:
    """A call that ended without its effect: its status, and the words beneath (the person's comment, the tool's
    error)."""
    detail = _rejection_comment(call) if call.status == S.REJECTED else call.error
    return Explanation(_("%(call)s: %(status)s") % {"call": call_label(call), "status": label(call.status)}, detail)


def outcome_explanation(run: Run) -> Explanation | None:
    """Why the program judged ``run`` as it did, in the active language; None while it has no outcome.

    Built from the run's outcome and tool calls by the floor's rule
    (``runs.engine.completion.judge_calls``): not achieved names the first
    call that ended without its effect and that no later call made up for
    (with the person's comment or the tool's error beneath); achieved
    names the side-effecting calls that succeeded, those that reused an
    earlier call's result and the read-only calls that failed beside them,
    or says the model answered without tool calls, or how many read-only
    calls succeeded.
    Where the agent's completion check decided beyond what the calls show
    (not achieved with no such call, achieved despite one), the check's
    stored reason is shown beneath. Reads the run's calls (prefetched by
    ``runs.selectors.with_final_output_facts``, else one query) and, for a
    rejected call, its inbox item.
    """
    if not run.outcome:
        return None
    calls = _calls(run)
    by_id = {call.pk: call for call in calls}
    facts = [fact for fact in call_facts(run, calls) if fact.registered]
    unresolved = unresolved_calls(facts)
    deciding = deciding_calls(facts, unresolved)
    if run.outcome == Outcome.NOT_ACHIEVED:
        if not deciding:
            return Explanation(_("The agent's completion check found the task not achieved."), run.outcome_reason)
        first = _ended(by_id[next(fact for fact in unresolved if fact in deciding).id])
        if len(unresolved) == 1:
            return first
        more = len(unresolved) - 1
        text = ngettext("%(first)s (and %(count)d more call without its effect)",
                        "%(first)s (and %(count)d more calls without their effect)", more) % {
            "first": first.text, "count": more}
        return Explanation(text, first.detail)
    if deciding:
        first = by_id[deciding[0].id]
        return Explanation(_("Achieved by the agent's completion check, although %(call)s: %(status)s") % {
            "call": call_label(first), "status": label(first.status)}, run.outcome_reason)
    succeeded = [fact for fact in facts if fact.status == S.SUCCEEDED]
    if not succeeded:
        return Explanation(_("Answered without tool calls."))
    if not any(fact.side_effect for fact in succeeded):
        return Explanation(ngettext("%(count)d read-only tool call succeeded.",
                                    "%(count)d read-only tool calls succeeded.", len(succeeded)) % {
            "count": len(succeeded)})
    sentences = []
    done = [by_id[fact.id] for fact in succeeded if fact.side_effect and not fact.duplicate]
    if done:
        sentences.append(_("Done: %(calls)s succeeded.") % {"calls": _(", ").join(map(call_label, done))})
    for fact in succeeded:
        if fact.side_effect and fact.duplicate:
            sentences.append(_("%(call)s reused the result of #%(original)s: it was not done again.") % {
                "call": call_label(by_id[fact.id]), "original": fact.original})
    if unresolved:
        sentences.append(_("Read-only calls without their result (not held against the goal): %(calls)s.") % {
            "calls": _(", ").join(_ended(by_id[fact.id]).text for fact in unresolved)})
    return Explanation(" ".join(sentences))


@dataclass(frozen=True)
class TimelineEntry:
    """One event of the run's log as the timeline shows it: the event and what it says (``told``)."""

    event: RunEvent
    told: Explanation


def run_timeline(*, run: Run) -> list[TimelineEntry]:
    """The run's events in ``seq`` order, each with its sentence in the active language (see the module doc).

    Three queries: the events, the run's tool calls (for their titles) and
    its approval items (for the rule that asked for approval).
    """
    events: QuerySet[RunEvent] = run.events.order_by("seq")
    calls = {call.pk: call for call in run.tool_calls.all()}
    rules = {item.tool_call_id: item.rule
             for item in Interrupt.objects.filter(run=run, kind=InterruptKind.APPROVAL).order_by("id")}
    return [TimelineEntry(event, _told(event, calls, rules)) for event in events]


def _told(event: RunEvent, calls: dict[int, ToolCall], rules: dict[int, str]) -> Explanation:
    payload = event.payload if isinstance(event.payload, dict) else {}
    if event.type == "transition":
        return _run_transition(event, payload)
    if event.type == "model_call" and event.to_status:
        return _model_call(event, payload)
    if event.type == "tool_call" and payload.get("tool_call") in calls:
        return _tool_call(event, payload, calls, rules)
    if event.type == "interrupt" and event.to_status:
        return _interrupt(event, payload)
    told = _other(event, payload, calls)
    return told if told is not None else Explanation(event.reason)


def _run_transition(event: RunEvent, payload: dict) -> Explanation:
    to = event.to_status
    if not event.from_status:
        if payload.get("unread_input_of_run"):
            return Explanation(_("Run created for the input run %(run)s did not read") % {
                "run": payload["unread_input_of_run"]})
        return Explanation(_("Run created"))
    if to == RunStatus.RUNNING:
        return Explanation(_("Run started") if event.from_status == RunStatus.QUEUED else _("Run resumed"))
    if to == RunStatus.WAITING:
        return Explanation(_("Run waits for %(reason)s") % {"reason": label(payload.get("waiting_reason"))})
    if to == RunStatus.COMPLETED:
        return Explanation(_("Run completed: %(outcome)s") % {"outcome": label(payload.get("outcome"))})
    if to == RunStatus.FAILED:
        return Explanation(_("Run failed: %(failure)s") % {"failure": label(payload.get("failure_type"))},
                           event.reason)
    if to == RunStatus.CANCELLED:
        return Explanation(_("Run cancelled"), event.reason)
    return Explanation(event.reason)


def _model_call(event: RunEvent, payload: dict) -> Explanation:
    if event.to_status == "succeeded":
        count = payload.get("tool_calls") or 0
        if count:
            return Explanation(ngettext("The model proposed %(count)d tool call",
                                        "The model proposed %(count)d tool calls", count) % {"count": count})
        return Explanation(_("The model gave its final answer"))
    if event.to_status == "failed":
        return Explanation(_("The model call failed"), payload.get("error") or event.reason)
    if event.to_status == "discarded":
        return Explanation(_("The model's response was discarded"), event.reason)
    return Explanation(event.reason)


# A tool call's transitions whose stored reason is fixed text of ours (the sentence says it all), by target status
# (and source, where one target has several meanings). ``None``: the source is not the key.
_CALL_SENTENCES = {
    (S.PROPOSED, None): gettext_noop("%(call)s proposed by the model"),
    (S.READY, S.PROPOSED): gettext_noop("%(call)s allowed without approval"),
    (S.READY, S.AWAITING_APPROVAL): gettext_noop("%(call)s approved: ready to run"),
    (S.REJECTED, None): gettext_noop("%(call)s rejected by a person"),
    (S.EXPIRED, None): gettext_noop("%(call)s expired before anyone decided"),
    (S.CANCELLED, None): gettext_noop("%(call)s cancelled before it ran"),
    (S.RUNNING, None): gettext_noop("%(call)s started"),
    (S.SUCCEEDED, S.RUNNING): gettext_noop("%(call)s succeeded"),
}


def _tool_call(event: RunEvent, payload: dict, calls: dict[int, ToolCall], rules: dict[int, str]) -> Explanation:
    call = calls[payload["tool_call"]]
    named = {"call": call_label(call)}
    to, source = event.to_status, event.from_status
    if not to and payload.get("duplicate_of"):
        return Explanation(_("%(call)s is the same action as #%(original)s: it waits for it") % {
            **named, "original": payload["duplicate_of"]})
    if source == S.PROPOSED and call.duplicate_of_id and to in FINAL_STATUSES:
        return Explanation(_("%(call)s answered with the result of the same action #%(original)s: %(status)s") % {
            **named, "original": call.duplicate_of_id, "status": label(to)})
    sentence = _CALL_SENTENCES.get((to, source)) or _CALL_SENTENCES.get((to, None))
    if sentence is not None:
        return Explanation(_(sentence) % named)
    if to == S.AWAITING_APPROVAL:
        return Explanation(_("%(call)s needs a person's approval (rule: %(rule)s)") % {
            **named, "rule": rules.get(call.pk) or "—"})
    if to == S.DENIED:
        return Explanation(_("%(call)s refused by the policy") % named, payload.get("error", ""))
    if to == S.INVALID:
        return Explanation(_("%(call)s is invalid and was never executed") % named, payload.get("error", ""))
    if to == S.FAILED and source == S.RUNNING:
        return Explanation(_("%(call)s failed") % named, payload.get("error", ""))
    # Crashes, reconciliation, retries: the reason holds evidence or circumstances the statuses do not.
    return Explanation(_("%(call)s: %(status)s") % {**named, "status": label(to)}, event.reason)


def _interrupt(event: RunEvent, payload: dict) -> Explanation:
    item = {"item": payload.get("interrupt", "")}
    to = event.to_status
    if not event.from_status:
        return Explanation(_("Inbox item #%(item)s opened: %(kind)s") % {**item, "kind": label(payload.get("kind"))})
    if to == "resolved":
        if payload.get("changes"):
            return Explanation(_("Inbox item #%(item)s approved with edited arguments") % item)
        return Explanation(_("Inbox item #%(item)s resolved: %(decision)s") % {
            **item, "decision": label(payload.get("decision"))})
    if to == "expired":
        return Explanation(_("Inbox item #%(item)s expired") % item)
    if to == "cancelled":
        return Explanation(_("Inbox item #%(item)s cancelled") % item)
    return Explanation(event.reason)


def _other(event: RunEvent, payload: dict, calls: dict[int, ToolCall]) -> Explanation | None:
    """Events that are no transition but whose meaning their type and payload carry; None for the others."""
    if event.type == "external_event":
        return Explanation(_("External event %(type)s received") % {"type": payload.get("event_type", "")})
    if event.type == "recovery":
        return Explanation(_("Took over from a worker that died"))
    if event.type == "schedule":
        return Explanation(_("The scheduled start time came"))
    if event.type == "cancel_requested":
        return Explanation(_("Cancel requested: the run stops at its next safe point"), event.reason)
    if event.type == "policy" and payload.get("tool_call") in calls:
        return Explanation(_("%(call)s: the agent's looser approval rule applied (%(rule)s)") % {
            "call": call_label(calls[payload["tool_call"]]), "rule": payload.get("agent_rule", "")})
    if event.type == "wait" and payload.get("kind"):
        kind = label(payload["kind"])
        if payload.get("status") == "pending":
            return Explanation(_("Waiting for %(kind)s") % {"kind": kind})
        return Explanation(_("Wait for %(kind)s: %(status)s") % {"kind": kind, "status": label(payload.get("status"))},
                           payload.get("error", ""))
    return None
