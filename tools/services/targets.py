"""One side effect at a time on each target: a call's precondition and its send are one step.

A side-effecting tool that declares a ``target_key`` (the argument naming
what its calls act on, e.g. the refund's ``order_id``) has its calls on one
target value serialized, from the precondition check until the outcome (or
``unknown``) is committed: across threads, processes and machines, since
the only lock is in the database (docs/design.md#one-effect-at-a-time-per-target).

* A call about to be checked and sent first *claims* its target: with the
  target's ``PolicyLock`` row locked (the row cumulative approval rules
  lock for their ``per target`` scope, so a proposal judging such a rule
  and a claim on the same target serialize too), it becomes the row's
  ``holder`` unless another call holds it. A claim holds while its call is
  ``ready`` or ``running``; the call's next outcome (``succeeded``,
  ``failed``, ``unknown``, ``denied``, or ``ready`` to be sent again)
  releases it in the transaction that commits that outcome.
* The precondition and the call itself run after the claim's short
  transaction: no lock, transaction, thread or connection is held across
  them, and no other call on the target can pass its own check meanwhile.
* A call that finds the target held makes its run wait (``retry_backoff``)
  in the transaction that found it so; the holder's release wakes it in
  its own (after locking the same row), so a wake-up cannot be lost
  between the look and the wait. Woken, the call claims again and is then
  checked: what the holder did is in the precondition's view.
* A holder whose worker died keeps its claim until its run is recovered
  (its lease expires; recovery moves the call on and releases) or ends
  (its calls are settled: a claim of a call no longer ``ready`` or
  ``running`` does not count). A waiter's ``wake_at`` is a lease TTL away,
  so a lost wake-up costs at most that, never the call.

Lock order: a target's row, then run rows (in id order). Nothing that
holds a run row waits for a target's row except the worker of that run;
and since a group commit (``runs.engine.group_commit``) holds the rows of
all its runs while a job of it claims a target, a release never waits for
a waiter's row while holding the target's: it skips a row held elsewhere
and wakes that waiter after its commit.
"""

import functools
import hashlib
import json
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.transaction import TransactionManagementError, get_autocommit
from django.db.models import Exists, OuterRef, Q
from django_fsm import can_proceed

from runs.models import RunStatus, WaitingReason
from runs.tx import locked_many, note_shared_lock
from tools.models import PolicyLock, ToolCall, ToolCallStatus
from tools.registry import Tool, get_tool
from tools.services.arguments import canonical_value

S = ToolCallStatus
# A claim stands while its call may still be checked or sent, or is out.
LIVE_CLAIM = [S.READY, S.RUNNING]


@dataclass(frozen=True)
class Target:
    """What one call acts on: ``tool`` (its name), ``argument`` (the tool's ``target_key``) and ``value``.

    ``lock_key``: the ``PolicyLock`` key of the target (at most 100
    characters). ``label``: for people, e.g. "order_id 123".
    """

    tool: str
    argument: str
    value: object

    @property
    def lock_key(self) -> str:
        return scope_lock_key(self.tool, "target:" + json.dumps(canonical_value(self.value)))

    @property
    def label(self) -> str:
        return f"{self.argument} {self.value}"


def scope_lock_key(tool_name: str, scope: str) -> str:
    """The ``PolicyLock`` key of ``scope`` ("run:<id>", "user:<id>", "target:<json>") for ``tool_name``."""
    key = f"{tool_name}/{scope}"
    return key if len(key) <= 100 else hashlib.sha256(key.encode()).hexdigest()


def target_of(tool: Tool, arguments: dict | None) -> Target | None:
    """The target a call of ``tool`` with ``arguments`` acts on; None when it names none.

    None when the tool declares no ``target_key``, or the argument is
    missing or not a scalar (such a call is not serialized).
    """
    if not tool.target_key or not isinstance(arguments, dict):
        return None
    value = arguments.get(tool.target_key)
    if value is None or isinstance(value, (dict, list)):
        return None
    return Target(tool.name, tool.target_key, value)


def lock_scopes(keys: set[str]) -> None:
    """Lock the ``PolicyLock`` rows named by ``keys`` (created when missing), in key order.

    Held until the caller's transaction ends (PostgreSQL: row locks;
    SQLite: its transactions are ``IMMEDIATE``, so the whole database is
    the caller's meanwhile). Must be called inside a transaction.
    """
    if not keys:
        return
    note_shared_lock()
    if connection.vendor == "postgresql":
        _lock_upserting(sorted(keys))
        return
    found = set(PolicyLock.objects.select_for_update().filter(key__in=keys).order_by("key")
                .values_list("key", flat=True))
    if found == keys:
        return
    PolicyLock.objects.bulk_create([PolicyLock(key=key) for key in sorted(keys - found)], ignore_conflicts=True)
    list(PolicyLock.objects.select_for_update().filter(key__in=keys).order_by("key").values_list("pk"))


def _lock_upserting(keys: list[str]) -> None:
    """``lock_scopes`` on PostgreSQL in one statement: each row of ``keys`` (sorted) inserted, or, when it
    exists, locked by an update that sets its key to itself (a new row version, as any update; ``ON CONFLICT
    DO UPDATE`` locks the row it meets as ``SELECT ... FOR UPDATE`` does, so it excludes every other writer
    of the row; the rows are met in the order given, so two such statements never wait on each other in a
    circle). Raises ``TransactionManagementError`` outside a transaction, as the ORM's ``select_for_update``
    does: there the lock would end with the statement."""
    if get_autocommit():
        raise TransactionManagementError("lock_scopes() cannot be used outside of a transaction.")
    with connection.cursor() as cursor:
        cursor.execute(_lock_upserting_sql(), [keys])


@functools.cache
def _lock_upserting_sql() -> str:
    quote, meta = connection.ops.quote_name, PolicyLock._meta
    table, key_col = quote(meta.db_table), quote(meta.get_field("key").column)
    return (f"INSERT INTO {table} ({key_col}) SELECT k FROM unnest(%s::varchar[]) WITH ORDINALITY AS t(k, n) "
            f"ORDER BY n ON CONFLICT ({key_col}) DO UPDATE SET {key_col} = excluded.{key_col}")


def target_key(tool: Tool | None, arguments: dict | None) -> str:
    """What ``ToolCall.target`` holds for a call of ``tool`` with ``arguments``: its target's ``lock_key``, or ""
    when it names none (``target_of``)."""
    target = target_of(tool, arguments) if tool is not None else None
    return target.lock_key if target is not None else ""


def calls_on(target: Target):
    """The calls (a ``ToolCall`` queryset) of ``target``: by the indexed ``ToolCall.target``, so by the target's
    canonical value (``80`` and ``80.0`` alike, as its lock); a call stored with no target (a tool unknown when
    migration 0014 filled the column in) by its arguments, as before."""
    return calls_on_any([target])


def calls_on_any(targets: list[Target]):
    """The calls (a ``ToolCall`` queryset) of any of ``targets``, each found as ``calls_on`` finds it: one
    statement through the index on ``ToolCall.target`` whatever the number of calls stored; none for no target."""
    if not targets:
        return ToolCall.objects.none()
    condition = Q(target__in=sorted({target.lock_key for target in targets}))
    legacy: dict[tuple[str, str], list] = {}
    for target in targets:
        legacy.setdefault((target.tool, target.argument), []).append(target.value)
    for (tool, argument), values in legacy.items():
        condition |= Q(target="", name=tool, **{f"arguments__{argument}__in": values})
    return ToolCall.objects.filter(condition)


def claim(target: Target, call: ToolCall) -> int | None:
    """Make ``call`` the holder of ``target``; returns the other call holding it instead (its id), or None.

    Call inside a transaction: the target's row stays locked until it
    ends. A holder counts while it is ``ready`` or ``running``. When
    another call holds it, the row notes that a run waits (``waiters``):
    the caller must make ``call``'s run wait in the same transaction, so
    that the holder's release, which locks the same row, finds it. One
    statement (an upsert that locks the row, takes it when free and
    returns the new holder) where the database returns rows from a write;
    when it is busy, a second reads the holder and, when that holder's
    claim stands, a third marks the row.
    """
    note_shared_lock()
    if connection.features.can_return_columns_from_insert:
        if _upsert(target.lock_key, call):
            return None
    else:
        if _take(target.lock_key, call):
            return None
        # The target's first claim ever inserts its row; else someone else's claim stands, or stood a moment ago.
        PolicyLock.objects.bulk_create([PolicyLock(key=target.lock_key, holder_id=call.pk)], ignore_conflicts=True)
    holder = (PolicyLock.objects.select_for_update().filter(key=target.lock_key)
              .values_list("holder_id", flat=True).get())
    if holder == call.pk:
        return None
    if holder is not None and _live(holder):
        PolicyLock.objects.filter(key=target.lock_key).update(waiters=True)  # the holder's release looks for it
        return holder
    _take(target.lock_key, call)  # the row is locked now, and free
    return None


def claim_if_free(target: Target, call: ToolCall) -> bool:
    """``claim``'s first statement alone: True when ``call`` holds ``target`` now (it was free, or already
    ``call``'s); False when another live claim stands, or stood a moment ago, or the database cannot return
    rows from a write: then ``claim`` in a transaction says who holds it, and the caller acts on it there.

    Needs no transaction: outside one, the statement commits at once, which is what a free target needs
    (the claim must be visible to other calls before ``call`` is checked or sent), and saves a
    ``BEGIN`` and a ``COMMIT`` on the way to every side effect. Inside one, as ``claim``.
    """
    if not connection.features.can_return_columns_from_insert:
        return False
    note_shared_lock()
    return _upsert(target.lock_key, call)


def _upsert(key: str, call: ToolCall) -> bool:
    """One statement: insert row ``key`` held by ``call``, or take the existing row unless a live claim stands.

    PostgreSQL locks the conflicting row even when the ``WHERE`` refuses
    the update; SQLite's transactions are ``IMMEDIATE``. True when
    ``call`` holds the row now.
    """
    quote, lock_meta, call_meta = connection.ops.quote_name, PolicyLock._meta, ToolCall._meta
    table, key_col, holder = (quote(name) for name in (
        lock_meta.db_table, lock_meta.get_field("key").column, lock_meta.get_field("holder").column))
    calls, call_pk, status = (quote(name) for name in (
        call_meta.db_table, call_meta.pk.column, call_meta.get_field("status").column))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({key_col}, {holder}) VALUES (%s, %s) "
            f"ON CONFLICT ({key_col}) DO UPDATE SET {holder} = excluded.{holder} "
            f"WHERE {table}.{holder} IS NULL OR {table}.{holder} = excluded.{holder} OR NOT EXISTS ("
            f"SELECT 1 FROM {calls} WHERE {calls}.{call_pk} = {table}.{holder} AND {calls}.{status} IN (%s, %s)) "
            f"RETURNING {holder}",
            [key, call.pk, *LIVE_CLAIM])
        return cursor.fetchone() is not None


def _unclaim(key: str, call: ToolCall) -> bool | None:
    """Free row ``key`` if ``call`` holds it; returns None when it did not, else whether runs wait for the
    target (the row's ``waiters``, as the row is now locked). One statement where the database returns rows
    from a write (else a read of the flag first: SQLite's transactions are ``IMMEDIATE``, so nothing changes
    it in between), its SQL built once (a queryset's ``update()`` cost more CPU than the statement)."""
    returning, update, read = _unclaim_sql()
    with connection.cursor() as cursor:
        if connection.features.can_return_columns_from_insert:
            cursor.execute(returning, [key, call.pk])
            row = cursor.fetchone()
            return None if row is None else bool(row[0])
        cursor.execute(read, [key, call.pk])
        row = cursor.fetchone()
        if row is None:
            return None
        cursor.execute(update, [key, call.pk])
        return bool(row[0])


@functools.cache
def _unclaim_sql() -> tuple[str, str, str]:
    """``(the UPDATE returning the flag, the UPDATE alone, a SELECT of the flag)`` of ``_unclaim``."""
    quote, meta = connection.ops.quote_name, PolicyLock._meta
    table, key_col, holder, waiters = (quote(name) for name in (
        meta.db_table, meta.get_field("key").column, meta.get_field("holder").column, meta.get_field("waiters").column))
    where = f"WHERE {key_col} = %s AND {holder} = %s"
    update = f"UPDATE {table} SET {holder} = NULL {where}"
    return f"{update} RETURNING {waiters}", update, f"SELECT {waiters} FROM {table} {where}"


def _live(holder: int) -> bool:
    return ToolCall.objects.filter(pk=holder, status__in=LIVE_CLAIM).exists()


def _take(key: str, call: ToolCall) -> bool:
    """One UPDATE: ``call`` becomes the holder of row ``key`` unless a live claim of another call stands."""
    live = ToolCall.objects.filter(pk=OuterRef("holder_id"), status__in=LIVE_CLAIM)
    return bool(PolicyLock.objects.filter(key=key).filter(
        Q(holder__isnull=True) | Q(holder_id=call.pk) | ~Exists(live)).update(holder=call.pk))


def release_on_commit(calls: list[ToolCall], *, actor: str) -> None:
    """Once the caller's transaction commits, give up the claims of ``calls`` (settled in it) and wake their
    targets' waiters, each target in a transaction of its own.

    For a caller holding a run's row (a run ending): ``release`` there would
    wait for a target's row while holding a run row, against the lock order
    (module doc). Committed first, the claims already count for nothing
    (their calls are no longer ``ready`` or ``running``); this only wakes the
    waiters now rather than at their ``wake_at``. A failure is logged.
    """
    held = [(call, tool) for call in calls
            if call.side_effect and (tool := get_tool(call.name)) is not None and target_of(tool, call.arguments)]
    if not held:
        return

    def release_all():
        for call, tool in held:
            with transaction.atomic():
                release(call, tool, actor=actor)

    transaction.on_commit(release_all, robust=True)


def release(call: ToolCall, tool: Tool, *, actor: str) -> int:
    """``call`` (of ``tool``) has had an outcome in the caller's transaction: give up its claim, wake the waiters.

    Returns how many waiting runs were woken in the caller's transaction. A waiter is a ``waiting`` /
    ``retry_backoff`` run with a ``ready`` call of the tool on the target
    that was never sent (a call sent before and ``ready`` again is backing
    off after a failure: its own ``wake_at`` stands, so a release never
    cuts a backoff short; one that then found the target busy waits at
    most its lease-TTL ``wake_at``); each is woken (``Run.wake``, its row locked, in id order) and enqueued
    once the transaction commits. A waiter whose row another transaction
    holds is not waited for (``SKIP LOCKED``: that transaction may be
    waiting for this target's row): it is woken once the caller's
    transaction commits, in a transaction of its own, if it still waits
    then. Waiters are looked for only when the target's row says some run
    waits (``PolicyLock.waiters``, set by ``claim`` when it found the
    target held; cleared here). Nothing happens when ``call`` holds no
    claim; one UPDATE when no run waits (where the database returns rows from a write; else a read first).
    """
    target = target_of(tool, call.arguments) if tool.side_effect else None
    waited = _unclaim(target.lock_key, call) if target is not None else None
    if waited is None:
        return 0
    note_shared_lock()
    if not waited:
        return 0
    PolicyLock.objects.filter(key=target.lock_key).update(waiters=False)  # those found now are woken below
    waiting = set(_waiters(target, call))
    if not waiting:
        return 0
    reason = f"call #{call.pk} released {target.label}"
    with locked_many(waiting, skip_locked=True) as txs:
        woken = _wake(txs.values(), actor=actor, reason=reason)
    skipped = waiting - set(txs)
    if skipped:
        transaction.on_commit(lambda: _wake_skipped(sorted(skipped), target, call, actor=actor, reason=reason),
                              robust=True)
    return woken


def _waiters(target: Target, call: ToolCall):
    """The ids of the runs waiting for ``target`` (``release``), ``call``'s own run aside."""
    return (calls_on(target).filter(status=S.READY, attempts=0, run__status=RunStatus.WAITING,
                                     run__waiting_reason=WaitingReason.RETRY_BACKOFF)
            .exclude(pk=call.pk).values_list("run_id", flat=True).distinct())


def _wake(txs, *, actor: str, reason: str) -> int:
    """Wake the runs of ``txs`` (``RunTx``, locked) that may be woken; returns how many were."""
    woken = 0
    for tx in txs:
        if not can_proceed(tx.run.wake):
            continue
        tx.apply(tx.run.wake, actor=actor, reason=reason)
        tx.wake()
        woken += 1
    return woken


def _wake_skipped(run_ids: list[int], target: Target, call: ToolCall, *, actor: str, reason: str) -> None:
    """After a release committed: wake each of ``run_ids`` (whose rows it skipped) that still waits for
    ``target``, each in a transaction holding its row alone (so it can wait for that row in no circle)."""
    for run_id in run_ids:
        with locked_many([run_id]) as txs:
            if txs and _waiters(target, call).filter(run_id=run_id).exists():
                _wake(txs.values(), actor=actor, reason=reason)
