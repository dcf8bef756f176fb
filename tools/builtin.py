"""Built-in waiting tools the core provides to any agent that lists them (docs/design.md#waits).

* ``ask_user`` {question, options?, file?, file_types?}: the run waits
  ``input`` on an inbox item of kind ``input`` addressed to the run's
  requester (staff may answer too); the answer is the call's result
  (``{"answer", "answered_by"}``, plus ``"file"`` when the question allowed
  one, ``file`` ``optional`` or ``required``, and one came: its metadata and
  a text file's text, ``approvals.answer_files``). ``file_types`` narrows the
  operator's ``TOLLGATE["ANSWER_FILE_TYPES"]``, never widens it.
* ``wait_for_event`` {event_type, correlation_key?, timeout_s}: the run
  waits ``external_event`` until ``POST /api/events/`` brings that type
  and key; the payload is the call's result. Without a key one is
  generated (32 URL-safe random characters); it is the capability that
  lets a caller resume the run, so an agent-chosen key is only as secret
  as it is hard to guess.
* ``wait_until`` {until} or {seconds}: the run waits ``scheduled`` until
  that time (``{"waited_until", "woke_at"}``).

None of them holds a worker: each names its kind of wait (``tools.waits``:
``input`` is the approvals app's, ``external_event`` and ``scheduled`` are
declared there), the loop opens a ``tools.models.Wait`` and puts the run to
wait, and the handler (``tools.waits.settled_result``) only runs once the
wait is settled and turns it into the call's result. A wait that
ends without what it waited for (no answer before the item expired, no
event before ``timeout_s``) makes the call ``failed`` with the reason, and
the run goes on: the model reads the failure, and the outcome rule counts
it like any call without effect. Every wait is bounded by
``TOLLGATE["MAX_WAIT_S"]`` (questions by ``INPUT_TTL_HOURS``).
"""

import secrets
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from runs.models import WaitingReason
from tools.registry import Tool, ToolContext, WaitSpec, register
from tools.waits import (
    CORRELATION_KEY_SCHEMA, EVENT_TYPE_SCHEMA, EXTERNAL_EVENT, SCHEDULED, key_in_use, settled_result,
)

MAX_QUESTION_CHARS = 2000
MAX_OPTION_CHARS = 200
MAX_OPTIONS = 20
MAX_FILE_TYPES = 20
MIME_PATTERN = "^[a-z0-9][a-z0-9.+-]*/[a-z0-9][a-z0-9.+-]*$"


def _max_wait() -> timedelta:
    return timedelta(seconds=settings.TOLLGATE["MAX_WAIT_S"])


# --- ask_user ----------------------------------------------------------------

def _ask_user_wait(ctx: ToolContext, args: dict) -> WaitSpec:
    ttl = timedelta(hours=settings.TOLLGATE["INPUT_TTL_HOURS"])
    # ``input``: the approvals app's kind (approvals.waits), named here by its value.
    return WaitSpec(kind=WaitingReason.INPUT, deadline=timezone.now() + ttl, title=args["question"][:300])


def _ask_user_precondition(ctx: ToolContext, args: dict) -> str | None:
    accepted = settings.TOLLGATE["ANSWER_FILE_TYPES"]
    refused = [t for t in args.get("file_types", []) if t not in accepted]
    if refused:
        return f"File types {', '.join(refused)} are not accepted here; choose among {', '.join(accepted)}."
    return None


ASK_USER = register(Tool(
    name="ask_user",
    description="Ask the person who started the run a question and wait for the answer. With options, "
                "the answer is exactly one of them. With file \"optional\" or \"required\" the person may or "
                "must attach a file (of file_types, if given). The result is {\"answer\": ..., \"answered_by\": "
                "...} and, with a file, \"file\": {id, name, content_type, size, sha256, and for text files text "
                "and text_truncated}.",
    parameters={
        "type": "object",
        "properties": {
            "question": {"type": "string", "minLength": 1, "maxLength": MAX_QUESTION_CHARS},
            "options": {"type": "array", "minItems": 2, "maxItems": MAX_OPTIONS, "uniqueItems": True,
                        "items": {"type": "string", "minLength": 1, "maxLength": MAX_OPTION_CHARS}},
            "file": {"type": "string", "enum": ["none", "optional", "required"], "default": "none"},
            "file_types": {"type": "array", "minItems": 1, "maxItems": MAX_FILE_TYPES, "uniqueItems": True,
                           "items": {"type": "string", "maxLength": 100, "pattern": MIME_PATTERN}},
        },
        "required": ["question"],
        "additionalProperties": False,
    },
    handler=settled_result,
    precondition=_ask_user_precondition,
    wait=_ask_user_wait,
))


# --- wait_for_event ----------------------------------------------------------

def _event_precondition(ctx: ToolContext, args: dict) -> str | None:
    limit = settings.TOLLGATE["MAX_WAIT_S"]
    if args["timeout_s"] > limit:
        return f"timeout_s is {args['timeout_s']}; the longest wait allowed is {limit} seconds."
    key = args.get("correlation_key")
    if key and key_in_use(args["event_type"], key, tool_call=ctx.tool_call):
        return f"The key {key!r} is already used for {args['event_type']} events; choose another or omit it."
    return None


def _event_wait(ctx: ToolContext, args: dict) -> WaitSpec:
    key = args.get("correlation_key") or secrets.token_urlsafe(24)
    return WaitSpec(kind=EXTERNAL_EVENT.name, deadline=timezone.now() + timedelta(seconds=args["timeout_s"]),
                    event_type=args["event_type"], correlation_key=key)


WAIT_FOR_EVENT = register(Tool(
    name="wait_for_event",
    description="Wait until an outside system reports an event of event_type with the correlation key "
                "(generated when omitted; it is shown on the run), at most timeout_s seconds. The result is "
                "{\"event_type\", \"correlation_key\", \"payload\"}; after timeout_s the call fails as timed out.",
    parameters={
        "type": "object",
        "properties": {
            "event_type": EVENT_TYPE_SCHEMA,
            "correlation_key": CORRELATION_KEY_SCHEMA,
            "timeout_s": {"type": "integer", "minimum": 1},
        },
        "required": ["event_type", "timeout_s"],
        "additionalProperties": False,
    },
    handler=settled_result,
    precondition=_event_precondition,
    target_key="event_type",
    wait=_event_wait,
))


# --- wait_until --------------------------------------------------------------

def parse_moment(text: str) -> datetime | None:
    """An ISO 8601 date and time with a UTC offset (``2030-01-31T12:00:00+00:00``, ``...Z``), in UTC; else None.

    None too for a moment UTC cannot hold (``0001-01-01T00:00:00+01:00``:
    ``OverflowError`` once converted), so the call is refused by its
    precondition and the model is told, instead of failing the run.
    """
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None or moment.utcoffset() is None:
        return None
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        return None


def _until(args: dict) -> datetime:
    if "until" in args:
        return parse_moment(args["until"])
    return timezone.now() + timedelta(seconds=args["seconds"])


def _until_precondition(ctx: ToolContext, args: dict) -> str | None:
    if "until" in args and parse_moment(args["until"]) is None:
        return ("until must be an ISO 8601 date and time with a UTC offset, between the years 1 and 9999 "
                "in UTC, e.g. 2030-01-31T12:00:00+00:00.")
    if _until(args) - timezone.now() > _max_wait():
        return f"That is more than {settings.TOLLGATE['MAX_WAIT_S']} seconds away, the longest wait allowed."
    return None


def _until_wait(ctx: ToolContext, args: dict) -> WaitSpec:
    return WaitSpec(kind=SCHEDULED.name, deadline=_until(args))


WAIT_UNTIL = register(Tool(
    name="wait_until",
    description="Pause the run until a time (until: ISO 8601 with offset) or for a number of seconds. "
                "The result is {\"waited_until\", \"woke_at\"}.",
    parameters={
        "type": "object",
        "properties": {
            "until": {"type": "string", "minLength": 1, "maxLength": 64},
            "seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 10 ** 9},
        },
        "oneOf": [{"required": ["until"]}, {"required": ["seconds"]}],
        "additionalProperties": False,
    },
    handler=settled_result,
    precondition=_until_precondition,
    wait=_until_wait,
))
