"""Push run changes to browsers and integrators over Channels; never changes a run, never raises.

Messages: ``{"type": "run.update", "run": run_snapshot(...)}`` to ``run_group``
and ``RUNS_GROUP`` (where the snapshots sent together go as one
``{"type": "runs.update", "runs": [...]}``: ``_folded``); ``{"type": "run.event", "seq": N}`` to ``run_events_group``
when the run's log moved without a snapshot sent (a snapshot's ``seq`` tells
event sockets, which hear ``run_group`` too, as much);
``{"type": "run.delta", "kind", "data"}`` (streamed output) to ``run_group``;
``{"type": "access.changed", "ended_session"}`` to ``user_group``. Writers call
``publish_on_commit`` / ``publish_event_on_commit``; one sender thread per
process sends in hand-over order (docs/design.md#live-pushes).
"""

import asyncio
import atexit
import logging
import os
import threading
import time
import weakref

from channels.layers import get_channel_layer
from django.db import transaction

from runs.models import Run

log = logging.getLogger(__name__)
# ``pushes``: a weak reference to what this thread's open transaction owes (``_Pushes``; database
# connections, and so transactions, belong to one thread).
_touched = threading.local()


def run_group(run_id: int) -> str:
    """The Channels group name for one run."""
    return f"run-{run_id}"


RUNS_GROUP = "runs"


def run_events_group(run_id: int) -> str:
    """The Channels group of the integrators' event sockets of one run (``run.event`` notices)."""
    return f"run-events-{run_id}"


def user_group(user_id: int) -> str:
    """The Channels group of every live socket of user ``user_id``."""
    return f"user-{user_id}"


SNAPSHOT_FIELDS = ("id", "requested_by", "status", "phase", "waiting_reason", "failure_type", "outcome",
                   "outcome_reason", "final_output", "updated_at", "last_event_seq")


def run_snapshot(run: Run, *, seq: int | None = None) -> dict:
    """The live view of a run: ids (run, requesting user), status fields, timestamps (ISO 8601) and
    ``seq``, the event counter the state reflects (default ``run.last_event_seq``)."""
    return {
        "id": run.pk,
        "seq": run.last_event_seq if seq is None else seq,
        "requested_by": run.requested_by_id,
        "status": run.status,
        "phase": run.phase,
        "waiting_reason": run.waiting_reason,
        "failure_type": run.failure_type,
        "outcome": run.outcome,
        "outcome_reason": run.outcome_reason,
        "final_output": run.final_output,
        "updated_at": run.updated_at.isoformat() if run.updated_at else None,
    }


# Longest one message may take to reach the channel layer before it is given up (seconds).
SEND_TIMEOUT_S = 10.0
# Batches of messages handed over but not yet sent, at most: beyond it the oldest batch is dropped
# for the new one, with a warning (docs/design.md#live-pushes).
MAX_BACKLOG = 10_000


class _Sender:
    """The process's publishing event loop, started in a daemon thread on first use (again after a fork);
    ``send`` returns at once, and one task sends what is handed over in that order."""

    def __init__(self):
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue | None = None
        self._pid = 0

    def _running_loop(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue]:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop, queue = asyncio.new_event_loop(), asyncio.Queue(MAX_BACKLOG)
                threading.Thread(target=loop.run_forever, name="tollgate-live-sender", daemon=True).start()
                asyncio.run_coroutine_threadsafe(self._drain(queue), loop)
                self._loop, self._queue, self._pid = loop, queue, os.getpid()
            return self._loop, self._queue

    @staticmethod
    async def _drain(queue: asyncio.Queue) -> None:
        """Send what is handed over, for ever: each time, every batch queued by then, superseded messages left
        out (``_superseding``) and the run list's snapshots folded into one message (``_folded``); a failure is
        logged and skipped."""
        while True:
            batches = [await queue.get()]
            while not queue.empty():
                batches.append(queue.get_nowait())
            try:
                for layer, group, message in _folded(_superseding(batches)):
                    try:
                        async with asyncio.timeout(SEND_TIMEOUT_S):
                            await layer.group_send(group, message)
                    except Exception:
                        log.exception("could not publish %s", message.get("type"))
            finally:
                for _ in batches:
                    queue.task_done()

    def send(self, layer, sends: list[tuple[str, dict]]) -> None:
        """Queue ``layer.group_send(group, message)`` for each pair, in order, and return without waiting."""
        loop, queue = self._running_loop()

        def hand_over():
            if queue.full():
                _, dropped = queue.get_nowait()
                queue.task_done()
                log.warning("live push backlog full (%s); dropped a %s", MAX_BACKLOG, dropped[0][1].get("type"))
            queue.put_nowait((layer, sends))

        loop.call_soon_threadsafe(hand_over)

    def flush(self, timeout_s: float = SEND_TIMEOUT_S) -> None:
        """Wait until everything handed over so far was sent (or given up); raises ``TimeoutError`` after
        ``timeout_s`` seconds (``flush`` below is the public form)."""
        with self._lock:
            loop, queue = (self._loop, self._queue) if self._pid == os.getpid() else (None, None)
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(queue.join(), loop).result(timeout_s)


def _superseding(batches: list[tuple]) -> list[tuple]:
    """``(layer, group, message)`` of ``batches`` (``(layer, [(group, message), ...])``, in hand-over order), in that
    order, without the snapshots and event notices a later one in them supersedes.

    A client keeps the snapshot with the highest ``seq`` (docs/design.md#live-pushes), so of a run's
    ``run.update`` messages to one group, and of its ``run.event`` notices, only the last handed over goes out,
    in the place of that last one (nothing is sent earlier than it was handed over), carrying the highest
    ``seq`` among them. Streaming deltas and ``access.changed`` all go out.
    """
    sends = [(layer, group, message) for layer, pairs in batches for group, message in pairs]
    last: dict[tuple, int] = {}  # key -> index of its last message in sends
    highest: dict[tuple, dict] = {}  # key -> the message with the highest seq
    keys = []
    for index, (layer, group, message) in enumerate(sends):
        key = _superseded_by(layer, group, message)
        keys.append(key)
        if key is not None:
            last[key] = index
            kept = highest.get(key)
            if kept is None or _seq(message) >= _seq(kept):
                highest[key] = message
    return [(layer, group, highest[key] if key is not None else message)
            for index, ((layer, group, message), key) in enumerate(zip(sends, keys))
            if key is None or last[key] == index]


# Snapshots one ``"runs.update"`` message carries at most (``_folded``).
MAX_FOLDED = 200


def _folded(sends: list[tuple]) -> list[tuple]:
    """``sends`` (``(layer, group, message)``, in order) with the ``run.update`` snapshots to ``RUNS_GROUP`` of
    one layer sent as ``{"type": "runs.update", "runs": [snapshot, ...]}`` messages of up to ``MAX_FOLDED``,
    each in the place of the last snapshot it carries; a lone snapshot stays a ``run.update``.

    Every list socket hears every run's changes, so half of what the sender publishes went to that one group,
    a Redis round trip each; folded, a batch of changed runs costs one publish there (its run groups still one
    each). It acts only on what piles up while the sender waits for Redis. A socket of the list forwards each snapshot as the ``run.update`` it was
    (``runs.web.consumers.RunListConsumer``)."""
    listed: dict[int, list[int]] = {}  # id(layer) -> the indexes in sends of its list snapshots
    for index, (layer, group, message) in enumerate(sends):
        if group == RUNS_GROUP and message.get("type") == "run.update":
            listed.setdefault(id(layer), []).append(index)
    if all(len(indexes) < 2 for indexes in listed.values()):
        return sends
    carried: dict[int, list[int]] = {}  # index of the last snapshot of a message -> the indexes it carries
    for indexes in listed.values():
        for start in range(0, len(indexes), MAX_FOLDED):
            chunk = indexes[start:start + MAX_FOLDED]
            carried[chunk[-1]] = chunk
    folded_away = {index for indexes in listed.values() for index in indexes} - carried.keys()
    out = []
    for index, (layer, group, message) in enumerate(sends):
        if index in folded_away:
            continue
        chunk = carried.get(index)
        if chunk is not None and len(chunk) > 1:
            message = {"type": "runs.update", "runs": [sends[i][2]["run"] for i in chunk]}
        out.append((layer, group, message))
    return out


def _superseded_by(layer, group: str, message: dict) -> tuple | None:
    """What a later message must share with ``message`` to supersede it, or None when nothing does."""
    kind = message.get("type")
    if kind == "run.update":
        return id(layer), group, kind, message["run"]["id"]
    if kind == "run.event":
        return id(layer), group, kind
    return None


def _seq(message: dict) -> int:
    return message["run"]["seq"] if message["type"] == "run.update" else message["seq"]


_sender = _Sender()


def flush(timeout_s: float = 2.0) -> None:
    """Let what this process has published go out: wait up to ``timeout_s`` seconds; never raises (what is
    still queued is dropped, with a warning). For a short-lived process before it exits."""
    try:
        _sender.flush(timeout_s=timeout_s)
    except Exception:  # noqa: BLE001 (a push that cannot go out is dropped, as when the layer is down)
        log.warning("live pushes still queued were dropped")


atexit.register(flush)


def _send(sends: list[tuple[str, dict]]) -> None:
    """Queue each ``(group, message)`` pair for sending; never raises (a dead channel layer must not break
    a run)."""
    layer = get_channel_layer()
    if layer is None or not sends:
        return
    try:
        _sender.send(layer, sends)
    except Exception:
        log.exception("could not publish %s", sends[0][1].get("type"))


def publish_run_update(run_id: int) -> None:
    """Send the current snapshot of run ``run_id`` (read from the database) to its group and the list group."""
    _publish({run_id: None})


def _publish(runs: dict[int, Run | None], event_seqs: dict[int, int] | None = None) -> None:
    """Send a snapshot of each of ``runs`` (run id: the instance to snapshot, or None to read it, all
    such with one query) and a ``run.event`` notice per ``event_seqs`` entry (run id: highest new
    ``seq``), in one hand-over; nothing without a channel layer."""
    event_seqs = event_seqs or {}
    if not (runs or event_seqs) or get_channel_layer() is None:
        return
    unread = [run_id for run_id, run in runs.items() if run is None]
    read = {run.pk: run for run in Run.objects.filter(pk__in=unread).only(*SNAPSHOT_FIELDS)} if unread else {}
    sends, updated = [], set()
    for run_id in sorted(runs):
        run = runs[run_id] or read.get(run_id)
        if run is None:  # deleted meanwhile
            continue
        seq = max(run.last_event_seq, event_seqs.get(run_id, 0))
        message = {"type": "run.update", "run": run_snapshot(run, seq=seq)}
        sends += [(run_group(run_id), message), (RUNS_GROUP, message)]
        updated.add(run_id)
    # A snapshot carries the seq its events reached, and event sockets hear the run's group too: the notice
    # goes only where no snapshot went (one message fewer per transaction).
    sends += [(run_events_group(run_id), {"type": "run.event", "seq": seq})
              for run_id, seq in sorted(event_seqs.items()) if run_id not in updated]
    _send(sends)


class _Owed:
    """One writer's call for a push (``run_id``'s snapshot from ``run``, and/or an event notice up to ``seq``),
    held by Django as a commit hook (``send``) until its transaction commits, or dropped with it."""

    __slots__ = ("pushes", "run_id", "run", "seq", "__weakref__")

    def __init__(self, pushes: "_Pushes", run_id: int, run: Run | None, seq: int):
        self.pushes, self.run_id, self.run, self.seq = pushes, run_id, run, seq

    def send(self) -> None:
        self.pushes.send()


class _Pushes:
    """What one transaction of this thread owes, sent at its commit by the first of its hooks Django calls.

    The hooks hold this object; it holds what they owe only weakly: what a rolled-back transaction or
    savepoint owed is gone with the hooks Django dropped (CPython frees them at once), so a run changed
    only there (its instance holding what the database never had) is not pushed with a later commit.
    When some of it is gone, the runs still owed are read back rather than taken from their instances:
    an instance changed both before and inside a savepoint that rolled back holds what the savepoint undid.
    """

    def __init__(self):
        self.owed: list[weakref.ref] = []
        self.sent = False

    def send(self) -> None:
        if self.sent:
            return
        self.sent = True
        runs, event_seqs = {}, {}
        alive = [ref() for ref in self.owed]
        undone = None in alive  # some work rolled back: an instance may hold what it undid, so read back
        for owed in filter(None, alive):
            if owed.run is not None:  # one instance: its snapshot; two, or work undone: read back
                same = runs.get(owed.run_id, owed.run) is owed.run
                runs[owed.run_id] = owed.run if same and not undone else None
            if owed.seq:
                event_seqs[owed.run_id] = max(owed.seq, event_seqs.get(owed.run_id, 0))
        self.owed = []
        _publish(runs, event_seqs)


def _owe(run_id: int, run: Run | None = None, seq: int = 0) -> None:
    """Push ``run_id`` (a snapshot of ``run``, an event notice up to ``seq``) once the current transaction
    commits, with what the transaction's other calls owe (at once outside one)."""
    pushes = _touched.pushes() if hasattr(_touched, "pushes") else None
    if pushes is None or pushes.sent:
        pushes = _Pushes()
        _touched.pushes = weakref.ref(pushes)
    owed = _Owed(pushes, run_id, run, seq)
    pushes.owed.append(weakref.ref(owed))
    transaction.on_commit(owed.send, robust=True)


def publish_on_commit(run: Run) -> None:
    """Push ``run``'s snapshot, taken from this instance, once the current transaction commits (at once
    outside one); each run touched in a transaction is pushed once, read back if touched through two
    instances, and not at all if only work that rolled back touched it (docs/design.md#live-pushes)."""
    _owe(run.pk, run=run)


def publish_event_on_commit(run_id: int, seq: int) -> None:
    """Tell run ``run_id``'s event sockets, once the transaction commits, that its log reached ``seq``
    (coalesced with ``publish_on_commit``: one notice per run, the highest ``seq`` committed; no query)."""
    _owe(run_id, seq=seq)


def publish_delta(run_id: int, *, kind: str, data: dict) -> None:
    """Send one streaming event (``text_delta`` or ``tool_call_delta``) of run ``run_id``."""
    _send([(run_group(run_id), {"type": "run.delta", "kind": kind, "data": data})])


# Seconds between two pushes of one model call's streaming events (``DeltaBuffer``).
DELTA_INTERVAL_S = 0.1


class DeltaBuffer:
    """One model call's streaming events for run ``run_id``, coalesced: pushed at most every ``DELTA_INTERVAL_S``.

    ``add(kind, data)`` is the call's ``ModelRequest.on_delta``: text
    fragments are joined into one ``text_delta``, and each tool call's
    argument fragments into one ``tool_call_delta`` (by ``index``, keeping
    ``id`` and ``name``); ``flush()`` pushes what is left. ``push(run_id,
    kind=, data=)`` sends one event (default ``publish_delta``).
    """

    def __init__(self, run_id: int, push=None):
        self.run_id = run_id
        self._push = push or publish_delta
        self._text: list[str] = []
        self._calls: dict[int, dict] = {}
        self._pushed_at = 0.0

    def add(self, kind: str, data: dict) -> None:
        if kind == "text_delta":
            self._text.append(data.get("text") or "")
        elif kind == "tool_call_delta":
            call = self._calls.setdefault(data.get("index", 0), {"index": data.get("index", 0), "id": "", "name": "",
                                                                 "arguments": ""})
            call["id"] = data.get("id") or call["id"]
            call["name"] = data.get("name") or call["name"]
            call["arguments"] += data.get("arguments") or ""
        else:  # no other kind is known: passed on as it is
            self._push(self.run_id, kind=kind, data=data)
        if time.monotonic() - self._pushed_at >= DELTA_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        """Push what was added since the last push (nothing when nothing was)."""
        if self._text:
            self._push(self.run_id, kind="text_delta", data={"text": "".join(self._text)})
        for index in sorted(self._calls):
            self._push(self.run_id, kind="tool_call_delta", data=self._calls[index])
        self._text, self._calls, self._pushed_at = [], {}, time.monotonic()


def publish_access_changed(user_ids, *, ended_session: str = "") -> None:
    """Tell every socket of the users ``user_ids`` to check their access again; ``ended_session``: the key of
    a session just logged out, whose sockets close without a check (its row may not be gone yet)."""
    message = {"type": "access.changed", "ended_session": ended_session}
    _send([(user_group(user_id), message) for user_id in user_ids])
