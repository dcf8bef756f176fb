"""Reads for the inbox pages (HackSoft-style selectors).

Who may decide or look at an item is ``Interrupt.objects.decidable_by`` /
``visible_to`` (``runs.access``); these functions only load what a page shows.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

from django.conf import settings
from django.db.models import Count, Q, Subquery
from django.utils import timezone

from approvals.bulk import checked_ids
from approvals.models import AnswerFile, Interrupt, InterruptKind, InterruptStatus
from runs.access import RunAccess, flag_decidable
from runs.models import Agent, Run, RunEvent
from tools.models import ToolCall, ToolCallStatus
from tools.models.tool_call import FINAL_STATUSES
from tools.registry import Together, get_tool
from tools.services.assessment import effective_rule
from tools.services.summary import describe_many, judge_groups

RULE_PREFIX = "approval rule: "


def _with_relations(queryset):
    return queryset.select_related("run", "run__agent", "run__requested_by", "tool_call", "resolved_by",
                                   "claimed_by", "answer_file")


def assigned_to(queryset, user, assigned: str | None):
    """The inbox's "assigned to me" hook: ``assigned == "me"`` keeps the items ``user`` claimed; else all."""
    return queryset.filter(claimed_by=user) if assigned == "me" else queryset


def interrupt_get_visible(*, user, interrupt_id: int) -> Interrupt | None:
    """Item ``interrupt_id`` if ``user`` may look at it (else None), with ``user_may_decide`` set.

    One statement (once the user's permissions are read); the flag is set in memory on the item as loaded,
    with its run (``runs.access.flag_decidable``), not built into the statement."""
    item = _with_relations(Interrupt.objects.visible_to(user)).filter(pk=interrupt_id).first()
    if item is not None:
        flag_decidable(user, item, requested_by_id=item.run.requested_by_id)
    return item


def run_pending_interrupts(*, run) -> list[Interrupt]:
    """The run's pending inbox items, oldest first."""
    return list(_with_relations(run.interrupts.filter(status=InterruptStatus.PENDING)).order_by("created_at", "id"))


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


@dataclass(frozen=True)
class DecidedFilters:
    """What the history page shows, validated (``approvals.web.forms.DecidedFilterForm``); "" and None mean any.

    ``mine``: items the user decided; ``decision``: a ``Decision``; ``tool``: a name; ``day_from`` / ``day_to``: inclusive
    days in the current time zone.
    """

    mine: bool = False
    decision: str = ""
    tool: str = ""
    day_from: date | None = None
    day_to: date | None = None


@dataclass
class DecidedPage:
    """One page of the history: ``rows`` (``Interrupt`` objects, most recently decided first),
    ``next_after`` (the id to pass as ``after`` for the older page, None on the last one),
    ``previous_before`` (the id to pass as ``before`` for the newer page, None on the first one),
    ``count`` (the items matching, at most ``COUNT_CAP``) and ``capped`` (more match than that)."""

    rows: list = field(default_factory=list)
    next_after: int | None = None
    previous_before: int | None = None
    count: int = 0
    capped: bool = False


HISTORY_PAGE_SIZE = 50
NEWEST_DECIDED = ("-resolved_at", "-id")  # the history's order (index interrupt_status_resolved)


def decided_items(*, user, filters: DecidedFilters = DecidedFilters()):
    """Resolved items ``user`` may look at, narrowed by ``filters`` (a queryset, not ordered).

    In ``NEWEST_DECIDED`` order they are served by the indexes on
    ``(status, -resolved_at, -id)`` and ``(resolved_by, -resolved_at, -id)``.
    """
    items = Interrupt.objects.visible_to(user).filter(status=InterruptStatus.RESOLVED)
    if filters.mine:
        items = items.filter(resolved_by=user)
    if filters.decision:
        items = items.filter(decision=filters.decision)
    if filters.tool:
        items = items.filter(tool_call__name=filters.tool)
    if filters.day_from:
        items = items.filter(resolved_at__gte=_day_start(filters.day_from))
    if filters.day_to:
        items = items.filter(resolved_at__lt=_day_start(filters.day_to) + timedelta(days=1))
    return items


def _older_than(item) -> Q:
    """Items after ``item`` in ``NEWEST_DECIDED`` order: decided earlier, or at the same time with a smaller id."""
    at = item.resolved_at
    return Q(resolved_at__lte=at) & ~Q(resolved_at=at, id__gte=item.pk)


def _newer_than(item) -> Q:
    """Items before ``item`` in ``NEWEST_DECIDED`` order (the reverse of ``_older_than``)."""
    at = item.resolved_at
    return Q(resolved_at__gte=at) & ~Q(resolved_at=at, id__lte=item.pk)


def decided_page(*, user, filters: DecidedFilters = DecidedFilters(), after: int | None = None,
                 before: int | None = None, size: int = HISTORY_PAGE_SIZE) -> DecidedPage:
    """The page of the history (``decided_items``) older than item ``after``, or newer than item ``before``.

    Keyset pagination like ``inbox_page``: a page is read from its anchor
    item's ``(resolved_at, id)``, in ``NEWEST_DECIDED`` order (``before``:
    the ``size`` items just newer than the anchor), never by counting or
    skipping rows. Neither cursor, or one naming no decided item: the first
    page; so is ``before`` an item with at most ``size`` newer ones (the
    first page, filled). Whether a page lies beyond each end is one
    ``EXISTS`` (or the row read past ``size``); the total is counted up to
    ``COUNT_CAP`` only. At most four queries, whatever the page's depth or
    the number of items.
    """
    items = decided_items(user=user, filters=filters)
    counted = items.order_by().values("pk")[:COUNT_CAP + 1].count()
    page = DecidedPage(count=min(counted, COUNT_CAP), capped=counted > COUNT_CAP)
    cursor = before or after
    anchor = (Interrupt.objects.filter(pk=cursor, status=InterruptStatus.RESOLVED).order_by()
              .only("pk", "resolved_at").first() if cursor else None)
    if anchor is not None and before:
        rows = list(_with_relations(items.filter(_newer_than(anchor))).order_by("resolved_at", "id")[:size + 1])
        if len(rows) > size:
            page.rows = rows[:size][::-1]
            page.previous_before = page.rows[0].pk
            page.next_after = page.rows[-1].pk if items.filter(_older_than(page.rows[-1])).exists() else None
            return page
        anchor = None  # no more than a page is newer: that is the first page, shown whole
    shown = items.filter(_older_than(anchor)) if anchor is not None else items
    rows = list(_with_relations(shown).order_by(*NEWEST_DECIDED)[:size + 1])
    page.rows = rows[:size]
    page.next_after = page.rows[-1].pk if len(rows) > size else None
    newer = anchor is not None and page.rows and items.filter(_newer_than(page.rows[0])).exists()
    page.previous_before = page.rows[0].pk if newer else None
    return page


def answer_file_visible(*, user, interrupt_id: int) -> AnswerFile | None:
    """The file item ``interrupt_id`` was answered with, if ``user`` may see its run (``Run.objects.visible_to``)."""
    return (AnswerFile.objects.filter(interrupt_id=interrupt_id, interrupt__run__in=Run.objects.visible_to(user))
            .first())


# --- the inbox list ----------------------------------------------------------

PAGE_SIZE = 25
COUNT_CAP = 1000  # the navigation counts at most this many items, then says "1000+"
SCAN_WINDOW = 2000  # items of the order a filtered or searched page looks through, at most
RELATED_CAP = 1000  # pending items on a page's targets read for the related cues, at most
SORTS = ("expiry", "oldest", "newest")
FAR_FUTURE_MS = 2 ** 53 - 1  # the order key of an item that never expires (sorts last)


@dataclass(frozen=True)
class InboxFilters:
    """What the inbox list shows, validated (``approvals.web.forms.InboxFilterForm``); "" means any.

    ``sort``: one of ``SORTS``; ``kind``, ``tool``, ``agent`` (slug), ``requester`` (username): exact; ``search``:
    case-insensitive in title, tool name or arguments; ``assigned``: ``"me"`` for the user's claimed items.
    """

    sort: str = "expiry"
    kind: str = ""
    tool: str = ""
    agent: str = ""
    requester: str = ""
    search: str = ""
    assigned: str = ""


@dataclass
class InboxPage:
    """One page of the inbox: ``rows`` (``Interrupt`` objects with ``description``, ``urgency``,
    ``order_key``, ``related`` and ``same_action_calls`` set), ``next_after`` (the id to pass as
    ``after`` for the next page, None on the last one), ``window_ended`` (a filtered page stopped
    after looking through ``SCAN_WINDOW`` items; see ``inbox_page``)."""

    rows: list = field(default_factory=list)
    next_after: int | None = None
    window_ended: bool = False


@dataclass(frozen=True)
class RelatedCue:
    """Other pending items on the same target as a row: how many, and the tool's verdict on all of them
    together (``tools.registry.Together``: ``all_can_succeed`` True / False / None, ``note``).
    ``capped``: more were pending than were read (``RELATED_CAP``); ``others`` is then a lower bound."""

    others: int
    together: Together
    capped: bool = False


def agent_slugs() -> list[str]:
    """Every agent's slug once, sorted (the inbox's agent filter; it matches every version of the slug).

    Archived agents are included: their runs' items may still be pending.
    """
    return list(Agent.objects.current().order_by("slug").values_list("slug", flat=True))


def pending_decidable(*, user, filters: InboxFilters = InboxFilters()):
    """Pending items ``user`` may decide, narrowed by ``filters`` (not ordered)."""
    items = Interrupt.objects.decidable_by(user).filter(status=InterruptStatus.PENDING)
    if filters.kind:
        items = items.filter(kind=filters.kind)
    if filters.tool:
        items = items.filter(tool_call__name=filters.tool)
    if filters.agent:
        items = items.filter(run__agent__slug=filters.agent)
    if filters.requester:
        items = items.filter(run__requested_by__username=filters.requester)
    items = assigned_to(items, user, filters.assigned)
    if filters.search:
        items = items.filter(Q(title__icontains=filters.search) | Q(tool_call__name__icontains=filters.search)
                             | Q(tool_call__raw_arguments__icontains=filters.search))
    return items


def _segments(sort: str, anchor) -> list[tuple[Q, tuple[str, ...]]]:
    """The keyset of one sort after ``anchor`` (the last row shown, or None): ``[(condition, order)]``.

    Read the segments in turn: "expiring soonest" is the items with an
    expiry by (expires_at, id), then those that never expire by id; each
    segment is one range scan of an index (``Interrupt.Meta.indexes``),
    whatever the page's depth.
    """
    if sort == "expiry":
        never = (Q(expires_at__isnull=True), ("id",))
        if anchor is None:
            return [(Q(expires_at__isnull=False), ("expires_at", "id")), never]
        if anchor.expires_at is None:
            return [(Q(expires_at__isnull=True, id__gt=anchor.pk), ("id",))]
        at = anchor.expires_at
        return [(Q(expires_at__gte=at) & ~Q(expires_at=at, id__lte=anchor.pk), ("expires_at", "id")), never]
    if sort == "oldest":
        after = Q() if anchor is None else Q(created_at__gte=anchor.created_at) & ~Q(
            created_at=anchor.created_at, id__lte=anchor.pk)
        return [(after, ("created_at", "id"))]
    after = Q() if anchor is None else Q(created_at__lte=anchor.created_at) & ~Q(
        created_at=anchor.created_at, id__gte=anchor.pk)
    return [(after, ("-created_at", "-id"))]


def inbox_page(*, user, filters: InboxFilters = InboxFilters(), after: int | None = None,
               size: int = PAGE_SIZE, now=None) -> InboxPage:
    """The page of pending items ``user`` may decide that follows item ``after`` (None: the first page).

    Keyset pagination: the page is read from where the last one ended (the
    anchor item's sort key and id), never by counting or skipping rows, so
    page 1 and page 40,000 cost alike. An ``after`` that names no item
    (deleted) starts again at the first page. Each row is decorated
    (``decorate_rows``). A fixed number of queries per page.

    With a filter or a search, a page looks through at most ``SCAN_WINDOW``
    items of the order after the anchor (a rare match must not scan a
    million rows): when those held too few matches, the page ends early
    with ``window_ended`` set and ``next_after`` at the last item looked
    at, so "Next page" looks further.
    """
    anchor = Interrupt.objects.filter(pk=after).order_by().first() if after else None
    everything = pending_decidable(user=user)
    narrowed = pending_decidable(user=user, filters=filters)
    windowed = narrowed_by(filters)
    rows: list = []
    for condition, order in _segments(filters.sort, anchor):
        need = size + 1 - len(rows)
        if not windowed:
            rows += list(_with_relations(narrowed.filter(condition)).order_by(*order)[:need])
        else:
            # The window's ids first (one index range scan), then the matches among them by primary key:
            # a planner given both at once may scan the whole table instead.
            window = list(everything.filter(condition).order_by(*order).values_list("pk", flat=True)[:SCAN_WINDOW])
            rows += list(_with_relations(narrowed.filter(pk__in=window)).order_by(*order)[:need])
            if len(window) == SCAN_WINDOW and len(rows) <= size:  # a full window did not fill the page
                page = InboxPage(rows=rows, next_after=window[-1], window_ended=True)
                decorate_rows(page.rows, user=user, sort=filters.sort, now=now)
                return page
        if len(rows) > size:
            break
    page = InboxPage(rows=rows[:size], next_after=rows[size - 1].pk if len(rows) > size else None)
    decorate_rows(page.rows, user=user, sort=filters.sort, now=now)
    return page


def narrowed_by(filters: InboxFilters) -> bool:
    """Whether ``filters`` narrow the list (any filter or a search), beyond choosing its order."""
    return any((filters.kind, filters.tool, filters.agent, filters.requester, filters.search, filters.assigned))


def rows_of_runs(*, user, run_ids: list[int], filters: InboxFilters = InboxFilters(), now=None) -> list:
    """The pending items of runs ``run_ids`` that ``user`` may decide and ``filters`` keep, decorated."""
    rows = list(_with_relations(pending_decidable(user=user, filters=filters).filter(run_id__in=run_ids))
                .order_by("id"))
    decorate_rows(rows, user=user, sort=filters.sort, now=now)
    return rows


def urgency(expires_at, now) -> str:
    """``"overdue"`` (past), ``"urgent"`` (within an hour), ``"soon"`` (within a day), ``"later"``, or
    ``"never"`` (no expiry): a row's ``data-urgency`` (its expiry's colour)."""
    if expires_at is None:
        return "never"
    left = (expires_at - now).total_seconds()
    if left <= 0:
        return "overdue"
    return "urgent" if left <= 3600 else "soon" if left <= 86400 else "later"


def _order_key(item, sort: str) -> tuple[int, int]:
    """Two integers that sort rows as ``sort`` does, ascending (for the page's live patching)."""
    if sort == "expiry":
        expiry = item.expires_at
        return (int(expiry.timestamp() * 1000) if expiry else FAR_FUTURE_MS), item.pk
    created = int(item.created_at.timestamp() * 1000)
    return (created, item.pk) if sort == "oldest" else (-created, -item.pk)


def decorate_rows(rows: list, *, user, sort: str = "expiry", now=None) -> None:
    """Set on each row ``description`` (``tools.services.summary``), ``urgency``, ``order_key``,
    ``same_action_calls`` (later calls that re-proposed its action) and ``related`` (a ``RelatedCue``,
    or None when no other pending item ``user`` may decide acts on the same target).

    Four queries at most plus each tool's summary hooks, whatever the number of rows.
    """
    now = now or timezone.now()
    descriptions = describe_many([row.tool_call for row in rows])
    repeated = dict(ToolCall.objects.filter(duplicate_of_id__in=[r.tool_call_id for r in rows if r.tool_call_id])
                    .values_list("duplicate_of_id").annotate(n=Count("id")).order_by()) if rows else {}
    related = _related(rows, user=user)
    for row, description in zip(rows, descriptions):
        row.description = description
        row.urgency = urgency(row.expires_at, now)
        row.order_key = _order_key(row, sort)
        row.same_action_calls = repeated.get(row.tool_call_id, 0)
        row.related = related.get(row.pk)


def _related(rows: list, *, user) -> dict[int, RelatedCue]:
    """``{row id: RelatedCue}`` for the rows with other pending approval items on their target.

    One query reads the pending approval items ``user`` may decide on the
    rows' targets (a partial index on ``target``), at most ``RELATED_CAP``
    of them, so a pile-up on one order costs no more; each tool then
    judges its groups in one call of its ``judge_together`` hook.
    """
    targets = {row.target for row in rows if row.target}
    if not targets:
        return {}
    pending = list(Interrupt.objects.decidable_by(user)
                   .filter(status=InterruptStatus.PENDING, kind=InterruptKind.APPROVAL, target__in=targets)
                   .order_by().values_list("pk", "target", "tool_call__name", "tool_call__arguments")[:RELATED_CAP + 1])
    capped = len(pending) > RELATED_CAP
    groups: dict[str, list] = defaultdict(list)
    for pk, target, name, arguments in pending[:RELATED_CAP]:
        groups[target].append((pk, name, arguments or {}))
    groups = {target: members for target, members in groups.items() if len(members) > 1}
    by_tool: dict[str, list[str]] = defaultdict(list)
    for target, members in groups.items():
        by_tool[members[0][1]].append(target)
    verdicts = {}
    for name, tool_targets in by_tool.items():
        judged = judge_groups(name, [[arguments for _pk, _name, arguments in groups[t]] for t in tool_targets])
        verdicts.update(zip(tool_targets, judged))
    if capped:  # a group may be incomplete: "all fit" is no longer known; "too much" still holds
        verdicts = {t: v if v.all_can_succeed is False else Together(None) for t, v in verdicts.items()}
    return {row.pk: RelatedCue(others=len(groups[row.target]) - 1, together=verdicts[row.target], capped=capped)
            for row in rows if row.target in groups}


def inbox_counts(*, user) -> dict:
    """Pending items ``user`` may decide: ``{"total": int, "capped": bool, "by_kind": [(kind, int), ...]}`` (``InterruptKind`` order).

    One grouped COUNT over at most ``COUNT_CAP`` items; ``capped``: every number is a lower bound ("1000+").
    """
    first = pending_decidable(user=user).order_by().values("pk")[:COUNT_CAP]
    counted = dict(Interrupt.objects.filter(pk__in=Subquery(first)).order_by().values_list("kind")
                   .annotate(n=Count("id")))
    total = sum(counted.values())
    return {"total": total, "capped": total >= COUNT_CAP,
            "by_kind": [(kind, counted[kind]) for kind in InterruptKind.values if counted.get(kind)]}


def run_decided_interrupts(*, run) -> list[Interrupt]:
    """The run's decided (resolved) inbox items, in the order they were decided."""
    return list(_with_relations(run.interrupts.filter(status=InterruptStatus.RESOLVED)).order_by("resolved_at", "id"))


@dataclass(frozen=True)
class Why:
    """Why an item is in the inbox, from the record.

    ``rule``: the approval rule that fired, as kept on the item (or logged at assessment); ``tool_rule``, ``agent_rule``:
    the rules now; ``granted_by``: who let the agent's rule replace the tool's; ``model_reason``: the proposing turn's
    text, ``message_id`` its message (None: not found). Empty strings: none.
    """

    rule: str
    tool_rule: str
    agent_rule: str
    granted_by: str
    model_reason: str
    message_id: int | None


def interrupt_why(item: Interrupt, messages) -> Why | None:
    """``Why`` for an approval item (None for other kinds or without a registered tool).

    ``messages``: the session's messages (already loaded by the page), in
    which the assistant turn holding the call's id is looked up. No query
    when the item keeps its rule.
    """
    tool_call = item.tool_call
    tool = get_tool(tool_call.name) if tool_call is not None else None
    if item.kind != InterruptKind.APPROVAL or tool is None:
        return None
    rule = item.rule or _logged_rule(item)
    _rule, granted_by = effective_rule(item.run.agent, tool)
    turn = next((m for m in messages if m.role == "assistant" and m.run_id == item.run_id
                 and any(c.get("id") == tool_call.provider_call_id for c in m.tool_calls or [])), None)
    return Why(rule=rule, tool_rule=tool.approval,
               agent_rule=item.run.agent.approval_policy.get(tool.name) or "", granted_by=granted_by,
               model_reason=turn.content.strip() if turn else "", message_id=turn.pk if turn else None)


def _logged_rule(item: Interrupt) -> str:
    """The approval rule in the event that put the item's call to wait for approval ("" if none)."""
    reason = (RunEvent.objects.filter(run_id=item.run_id, type="tool_call", to_status=ToolCallStatus.AWAITING_APPROVAL,
                                      payload__tool_call=item.tool_call_id)
              .values_list("reason", flat=True).first() or "")
    return reason.removeprefix(RULE_PREFIX)


@dataclass(frozen=True)
class Lookup:
    """What a person must check to settle a reconciliation item, from the call and its log.

    ``last_check``: when the tool's reconcile hook last looked and found
    nothing (None: never), with ``last_check_result`` (what it reported).
    """

    idempotency_key: str
    error: str
    attempts: int
    reconcile_attempts: int
    last_check: object
    last_check_result: str


def reconciliation_lookup(item: Interrupt) -> Lookup | None:
    """``Lookup`` for a reconciliation item with a call (else None); one query (the last automatic check)."""
    call = item.tool_call
    if item.kind != InterruptKind.RECONCILIATION or call is None:
        return None
    last = (RunEvent.objects.filter(run_id=item.run_id, type="reconciliation", payload__tool_call=call.pk)
            .order_by("-seq").values_list("created_at", "reason").first())
    return Lookup(idempotency_key=call.idempotency_key, error=call.error, attempts=call.attempts,
                  reconcile_attempts=call.reconcile_attempts, last_check=last[0] if last else None,
                  last_check_result=last[1] if last else "")


def _call_settled(call) -> bool:
    """Whether nothing about ``call`` changes without a person: a final status, or ``unknown`` with no
    automatic reconciliation to come (its tool has no ``reconcile`` hook, or ``RECONCILE_MAX_TRIES`` are spent)."""
    if call.status in FINAL_STATUSES:
        return True
    if call.status != ToolCallStatus.UNKNOWN:
        return False
    tool = get_tool(call.name)
    return (tool is None or tool.reconcile is None
            or call.reconcile_attempts >= settings.TOLLGATE["RECONCILE_MAX_TRIES"])


@dataclass(frozen=True)
class ItemOutcome:
    """What became of a decided item (bulk result page): ``run_status``; ``call_status`` (``ToolCallStatus``, "" without a
    call); ``detail``: the call's error; ``settled``: the call has its outcome or the run has ended.
    """

    item: Interrupt
    run_status: str
    call_status: str
    detail: str
    settled: bool


def item_outcomes(*, user, ids) -> list[ItemOutcome]:
    """The outcomes of items ``ids`` (at most ``approvals.bulk.MAX_BULK_ITEMS``) that ``user`` may see, in the order asked.

    Items ``user`` may not see are left out (nothing leaks). Raises
    ``InvalidInput`` for bad ids, like ``approvals.bulk.plan_bulk``. One query.
    """
    ordered = checked_ids(ids)
    found = {i.pk: i for i in Interrupt.objects.visible_to(user).filter(pk__in=ordered)
             .select_related("run", "tool_call")}
    outcomes = []
    for pk in ordered:
        item = found.get(pk)
        if item is None:
            continue
        call = item.tool_call
        call_status = call.status if call is not None else ""
        had_outcome = call is not None and (call_status in FINAL_STATUSES or call_status == ToolCallStatus.UNKNOWN)
        outcomes.append(ItemOutcome(
            item=item, run_status=item.run.status, call_status=call_status,
            detail=call.error if had_outcome else "",
            settled=item.run.is_terminal or (call is not None and _call_settled(call))))
    return outcomes


def conflicting(rows: list) -> list:
    """The decorated rows (``decorate_rows``) whose tool says the pending calls on their target cannot all
    succeed together."""
    return [row for row in rows if row.related is not None and row.related.together.all_can_succeed is False]


def lands_on_inbox(user) -> bool:
    """Whether ``user``'s home is the inbox: staff and deciders (``RunAccess.sees_all``), or anyone with a
    pending item to decide or answer (a requester's question). One query at most."""
    return RunAccess.of(user).sees_all or Interrupt.objects.decidable_by(user).filter(
        status=InterruptStatus.PENDING).exists()
