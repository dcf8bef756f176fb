"""What the worker holding a run's lease knows of it between passes of the loop (``Known``).

Valid while the run's event counter shows only this worker's own events;
why that suffices: docs/design.md#what-a-worker-keeps-between-passes.
"""

from runs.base import rows, selects
from runs.models import Message, Run, Step
from runs.services import counter_confirmed
from tools.models import ToolCall, ToolCallStatus

# Run columns that change while a run is advanced (the foreign keys never do, so the
# related agent, session and requester stay loaded).
_MUTABLE_FIELDS = [field.attname for field in Run._meta.concrete_fields if not field.is_relation]


class Known:
    """The loop's knowledge of one run it holds; parts are loaded lazily and dropped by ``forget``."""

    def __init__(self, run: Run):
        """``run``: the row as just read (the slice's start), so the first ``revalidate`` need not read it again."""
        self.run = run
        self._fresh = True
        self.forget()

    def reload(self) -> None:
        """Re-read the run's own columns and forget the rest (one query now, the rest when next used); for a
        caller that carries on after a rolled-back transaction, whose instance may hold unstored values."""
        self.run.refresh_from_db(fields=_MUTABLE_FIELDS)
        self.forget()

    def forget(self) -> None:
        """Drop everything; each part is read again when next used."""
        self._calls: list[ToolCall] | None = None
        self._history: list[Message] | None = None
        self._steps: int | None = None
        self._session_call_ids: set[str] | None = None
        self._assessed_here: set[int] = set()

    def started(self, *, history: list[Message] | None = None) -> None:
        """The run was just begun: it has no tool calls and no steps yet (only a running run gets them).
        ``history``: the session's whole history as the run's start stored it, when the caller knows it (a
        session with no other run: the run's input alone); then no other call of the session has taken an id
        either. Input supplemented once the start committed is another writer's event: the first pass then
        reads the counter as any other does (``revalidate``), rather than trust the row read before the start."""
        self._calls, self._steps = [], 0
        if history is not None:
            self._history, self._session_call_ids = list(history), set()
            self._fresh = False

    def revalidate(self) -> None:
        """Read the run's event counter (one query; none on the first call, the row was just read, unless the run
        was begun with its history known (``started``), nor when this
        stretch of code's own last write read it in a transaction still holding the row's lock, a group
        commit's: ``runs.services.counter_confirmed``); if another writer logged
        an event meanwhile, re-read the run's own columns (a second query) and forget the rest.

        Raises ``Run.DoesNotExist`` if the run is gone. Why the counter is
        enough: docs/design.md#what-a-worker-keeps-between-passes.
        """
        if self._fresh:
            self._fresh = False
            return
        if counter_confirmed(self.run):  # its own last write read it, and its transaction still holds the row
            return
        seq = rows.counter(Run, "last_event_seq", self.run.pk)
        if seq != self.run.last_event_seq:
            self.run.refresh_from_db(fields=_MUTABLE_FIELDS)
            self.forget()

    @property
    def calls(self) -> list[ToolCall]:
        """The run's tool calls, oldest first, each holding ``run`` (so their transitions log through it)."""
        if self._calls is None:
            self._calls = selects.select(ToolCall, {"run": self.run.pk}, order_by="id", attach={"run": self.run})
        return self._calls

    @property
    def history(self) -> list[Message]:
        """The session's messages, oldest first."""
        if self._history is None:
            self._history = selects.select(Message, {"session": self.run.session_id}, order_by="id")
        return self._history

    @property
    def steps(self) -> int:
        """How many steps (model calls, whatever became of them) the run has."""
        if self._steps is None:
            self._steps = selects.count(Step, {"run": self.run.pk})
        return self._steps

    @property
    def session_call_ids(self) -> set[str]:
        """The ``provider_call_id`` of every tool call of the session."""
        if self._session_call_ids is None:
            self._session_call_ids = {call_id for (call_id,) in selects.values(
                ToolCall, {"run__session": self.run.session_id}, ("provider_call_id",))}
        return self._session_call_ids

    def step_added(self) -> None:
        """This worker stored a new step."""
        if self._steps is not None:
            self._steps += 1

    def messages_added(self, messages: list[Message]) -> None:
        """This worker appended ``messages`` to the session history."""
        if self._history is not None:
            self._history.extend(messages)

    @property
    def assessed_here(self) -> frozenset[int]:
        """Ids of the calls this worker proposed ``ready`` in this slice, no other writer's event seen since
        (emptied by ``forget`` and ``call_sent``)."""
        return frozenset(self._assessed_here)

    def call_sent(self) -> None:
        """A call of the run was sent: no call counts as ``assessed_here`` any more (their preconditions are
        checked again)."""
        self._assessed_here.clear()

    def calls_added(self, calls: list[ToolCall]) -> None:
        """This worker proposed ``calls`` (as they stand right after the proposal's transaction)."""
        if self._calls is not None:
            self._calls.extend(calls)
        self._assessed_here.update(call.pk for call in calls if call.status == ToolCallStatus.READY)
        if self._session_call_ids is not None:
            self._session_call_ids.update(call.provider_call_id for call in calls)
