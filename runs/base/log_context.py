"""The run a log line is about: ``run_id``, ``session_id``, ``tool_call_id`` and, while traces are recorded, the
run's ``trace_id`` (``runs.base.tracing``) on every record made while a run is advanced, as structured fields.

The engine advances many runs on one event loop and hands their database
work to threads in a copy of each task's context (``runs.engine.runtime``),
so the ids live in a context variable, as the run's lease does
(``runs.lease``). The variable holds one mutable ``dict`` per run, set by
``bound`` where the run is taken up: the copies of the context handed to
threads share that dict, so an id learnt later in the slice (``note``: the
session once the run is loaded, the tool call while it executes) is seen
by the rest of the slice whichever thread runs it, and no context token
crosses a step's ``yield``.

The same dict carries, under ``runs.base.tracing.CONTEXT_KEY``, the
OpenTelemetry context the run's work is traced under (``runs.base.tracing``
notes it); it is never logged.

The console handler's ``RunContextFilter`` (``logging_settings``, the
settings' ``LOGGING``) puts the three on each record as attributes, None
where not known, and ``run_context``, a short text form for the text log
format; the JSON format (``TOLLGATE_LOG_FORMAT=json``) writes them as
fields.
"""

import contextlib
import contextvars
import logging

FIELDS = ("run_id", "session_id", "tool_call_id", "trace_id")
_ids: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tollgate_log_ids", default=None)


@contextlib.contextmanager
def bound(run_id: int | None = None, **ids):
    """Within the block, log records carry ``run_id`` (an int) and ``ids`` (names from ``FIELDS``).

    Opens a fresh set of ids for this context (a run taken up), replacing
    any outer one until the block ends. Use ``note`` to add ids later.
    """
    token = _ids.set({"run_id": run_id, **ids})
    try:
        yield
    finally:
        _ids.reset(token)


def note(**ids) -> None:
    """Add or change ids (names from ``FIELDS``; None forgets one) of the run this context is bound to.

    Does nothing outside ``bound``. Seen by every copy of the context made
    since the run was bound (the engine's database threads), not by other runs.
    """
    current = _ids.get()
    if current is not None:
        current.update(ids)


def current() -> dict:
    """The ids known in this context now: ``{field: value}`` for the ``FIELDS`` set, and the run's tracing context
    (module doc) when there is one; empty outside a run."""
    return {key: value for key, value in (_ids.get() or {}).items() if value is not None}


def value(name: str):
    """What this context holds under ``name`` (an id of ``FIELDS``, or the run's tracing context), as
    ``current()[name]`` without the copy; None when not known."""
    ids = _ids.get()
    return None if ids is None else ids.get(name)


def run_id() -> int | None:
    """The id of the run this context is bound to (``bound``), or None outside a run."""
    return value("run_id")


def run_with(ids: dict, fn, *args):
    """``fn(*args)`` with log records carrying ``ids`` (as ``current()`` gave them, e.g. in another thread)."""
    with bound(**ids):
        return fn(*args)


class RunContextFilter(logging.Filter):
    """A handler's filter that gives every record the ``FIELDS`` (None where not known) and ``run_context``
    (`` [run 12 session 3 tool_call 7]``, empty outside a run), from this context's ids. A record made with
    ``extra={"run_id": ...}`` keeps its own. Lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = _ids.get() or {}
        for field in FIELDS:
            if not hasattr(record, field):
                setattr(record, field, ids.get(field))
        if not hasattr(record, "run_context"):
            known = [f"{field.removesuffix('_id')} {getattr(record, field)}" for field in FIELDS
                     if getattr(record, field) is not None]
            record.run_context = f" [{' '.join(known)}]" if known else ""
        return True


FORMATS = ("text", "json")


def logging_settings(log_format: str, level: str) -> dict:
    """Django's ``LOGGING`` (``logging.config.dictConfig``): everything to the console at ``level`` and up,
    with the run's ids (``RunContextFilter``). ``log_format``: ``"text"`` (the message, then the ids in
    brackets) or ``"json"`` (one object per line: ``time``, ``level``, ``logger``, ``message``, the
    ``FIELDS``, an exception's ``exc_info``; python-json-logger)."""
    fields = " ".join(f"%({field})s" for field in FIELDS)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"run_context": {"()": "runs.base.log_context.RunContextFilter"}},
        "formatters": {
            "text": {"format": "%(message)s%(run_context)s"},
            "json": {"()": "pythonjsonlogger.json.JsonFormatter",
                     "fmt": f"%(asctime)s %(levelname)s %(name)s %(message)s {fields}",
                     "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"}},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": log_format,
                                 "filters": ["run_context"]}},
        "root": {"handlers": ["console"], "level": level},
    }
