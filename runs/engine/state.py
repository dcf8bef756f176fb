"""What the worker holding a run's lease knows of it between passes of the loop.

The loop re-derives every decision from stored state (docs/design.md#the-loop),
but reading the whole of it before every pass is waste: while this worker
holds the lease, the run's tool calls, steps and messages change only
through this worker, or through a person or process that logs an event on
the run while doing so (a decision, a settlement, supplemented input, a
cancel request). ``Known`` keeps what was read, the loop adds what it
writes, and ``revalidate`` throws it all away as soon as the run's event
counter shows an event that was not appended through the loop's own
instance (``runs.services.append_event`` only moves the instance's counter
over an unbroken series of its own events).

Each part is read from the database the first time it is needed after a
reload: the run's tool calls (ordered by id, each holding the loop's run
instance, so their transitions log through it), the session's message
history (ordered by id), the number of the run's steps and the
``provider_call_id`` of every call of the session.

``Known`` also remembers which calls this worker proposed ``ready`` in this
slice (assessed moments ago, no approval asked): until another writer's
event is seen or any call of the run is sent, their precondition need not
be checked again before a read-only one runs, and no approval note need be
looked up for them (``runs.engine.loop._execute``).
"""

from runs.base import rows
from runs.models import Message, Run
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
        """Re-read the run's own columns and forget the rest (one query now, the rest when next used).

        For a caller that carries on after a rolled-back transaction: the
        instance may hold values (counters, the event counter) that were
        never stored, which ``revalidate`` cannot see.
        """
        self.run.refresh_from_db(fields=_MUTABLE_FIELDS)
        self.forget()

    def forget(self) -> None:
        """Drop everything; each part is read again when next used."""
        self._calls: list[ToolCall] | None = None
        self._history: list[Message] | None = None
        self._steps: int | None = None
        self._session_call_ids: set[str] | None = None
        self._assessed_here: set[int] = set()

    def started(self) -> None:
        """The run was just begun: it has no tool calls and no steps yet (only a running run gets them)."""
        self._calls, self._steps = [], 0

    def revalidate(self) -> None:
        """Read the run's event counter (one query); if another writer logged an event meanwhile, re-read the
        run's own columns (a second query) and forget the rest.

        The counter is enough: every column the loop decides by changes only
        through this worker's instance or together with another writer's
        event (a cancel request, a decision, a settlement, an ending). Only
        the sweeper writes without one, when it breaks a lease that ran out:
        the lease's columns and the crash accounting (``crash_streak``,
        ``loss_streak``, ``lost_leases``, ``death_blame``). Those are for the
        worker that takes the run over next, which reads them then; this
        worker keeps the streaks it read at its own takeover (it clears
        those once a call gets through) and must not clear the sweeper's,
        and its lease ends at the next takeover (its fenced writes fail).
        The first call reads nothing: the row was read a moment before, and
        since then only this worker wrote to it (through the same instance).
        Raises ``Run.DoesNotExist`` if the run is gone.
        """
        if self._fresh:
            self._fresh = False
            return
        seq = rows.counter(Run, "last_event_seq", self.run.pk)
        if seq != self.run.last_event_seq:
            self.run.refresh_from_db(fields=_MUTABLE_FIELDS)
            self.forget()

    @property
    def calls(self) -> list[ToolCall]:
        """The run's tool calls, oldest first."""
        if self._calls is None:
            self._calls = list(self.run.tool_calls.order_by("id"))
        return self._calls

    @property
    def history(self) -> list[Message]:
        """The session's messages, oldest first."""
        if self._history is None:
            self._history = list(Message.objects.filter(session_id=self.run.session_id).order_by("id"))
        return self._history

    @property
    def steps(self) -> int:
        """How many steps (model calls, whatever became of them) the run has."""
        if self._steps is None:
            self._steps = self.run.steps.count()
        return self._steps

    @property
    def session_call_ids(self) -> set[str]:
        """The ``provider_call_id`` of every tool call of the session."""
        if self._session_call_ids is None:
            self._session_call_ids = set(ToolCall.objects.filter(run__session_id=self.run.session_id)
                                         .values_list("provider_call_id", flat=True))
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
        """Ids of the calls this worker proposed ``ready`` in this slice, no other writer's event seen since.

        Such a call was assessed (schema, precondition, approval rule) a
        moment ago and never asked for approval: a ``ready`` call cannot go
        back to ``awaiting_approval``. Emptied by ``forget`` and ``call_sent``.
        """
        return frozenset(self._assessed_here)

    def call_sent(self) -> None:
        """A call of the run was sent: the world the slice's proposals were assessed in may have changed
        (by its effect, or by anyone while it was out, its retries and backoff included), so no call counts
        as ``assessed_here`` any more (their preconditions are checked again)."""
        self._assessed_here.clear()

    def calls_added(self, calls: list[ToolCall]) -> None:
        """This worker proposed ``calls`` (as they stand right after the proposal's transaction)."""
        if self._calls is not None:
            self._calls.extend(calls)
        self._assessed_here.update(call.pk for call in calls if call.status == ToolCallStatus.READY)
        if self._session_call_ids is not None:
            self._session_call_ids.update(call.provider_call_id for call in calls)
