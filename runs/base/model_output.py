"""The door for untrusted model output: checked and made storable before any write.

A model (or a server pretending to be one) may return anything: NUL
characters, which PostgreSQL refuses in text and JSON; ``NaN``,
``Infinity`` or numbers that overflow to infinity, which no database
stores as JSON; ids and names longer than their columns. None of that may
turn into a database error, which the worker would take for a crash.

``screen_response`` runs on every response before the loop stores it:

* token counts must be whole numbers from 0 to ``MAX_TOKENS_PER_CALL``
  (missing: 0); anything else makes the response malformed (a repair
  turn), since it would not fit the usage columns;
* NUL characters are removed from the text content (it is only shown and
  judged; the call arguments are what acts on the world);
* a tool call id is made a string; one longer than ``MAX_CALL_ID_LENGTH``
  or containing NUL is emptied (the loop gives it a generated id), the
  original (NUL replaced) is kept in ``call["original_id"]`` for the
  event log, and the call is marked ``call["refused"]`` (it becomes
  ``invalid``, so the model learns its id was not accepted);
* a tool name that is not a string, too long or containing NUL is made
  storable and the call is refused;
* NUL characters in raw arguments are written as the JSON escape
  ``\\u0000``, so the stored text is safe and ``parse_arguments`` refuses it;
* lone UTF-16 surrogates (``\\ud800``: no character, so no UTF-8 text can
  hold them, and a page or an email holding one fails as it is encoded)
  are refused wherever they appear: text content makes the response
  malformed (a repair turn, told to the model, nothing stored), an id or a
  name is treated as one with NUL, and in raw arguments they are written
  as their JSON escape, which ``parse_arguments`` refuses (an ``invalid``
  call). The same escape in the JSON text itself is refused by the parser.

* text longer than ``TOLLGATE["MAX_MODEL_TEXT_CHARS"]`` is not stored:
  text content makes the response refused (``RefusedText``: a repair
  turn, told to the model), raw arguments are cut to their first
  ``SHOWN_OF_REFUSED_ARGUMENTS`` characters and the call is refused.

``storable_errors`` does the same for the text of a ``ModelError`` (it may
quote what the server sent). ``parse_arguments`` is the strict JSON parser
for tool arguments.
"""

import json
import re
from contextlib import contextmanager

from django.conf import settings

from config import strict_json
from config.strict_json import LONE_SURROGATE, REPLACEMENT
from runs.base.model_call import MalformedResponse, ModelError

MAX_TOKENS_PER_CALL = 10_000_000
MAX_ARGUMENT_DEPTH = 32  # nesting of objects and arrays; deeper could not be stored safely
MAX_CALL_ID_LENGTH = 100
MAX_TOOL_NAME_LENGTH = 100
SHOWN_OF_REFUSED_ARGUMENTS = 1_000  # characters kept of raw arguments refused as too long
NUL = "\x00"


class RefusedText(MalformedResponse):
    """The answer's text cannot be stored as it is (a lone surrogate, which no UTF-8 text can hold, or more
    than ``TOLLGATE["MAX_MODEL_TEXT_CHARS"]`` characters): refused, and the model is told why."""


class UnsafeArguments(ValueError):
    """Tool arguments that are not a JSON object of finite numbers and NUL-free strings."""


def screen_response(response):
    """Make a ``ModelResponse`` storable, in place, and mark the calls that must be refused; returns it.

    Sets ``call["refused"]`` (the reason, for the model) and
    ``call["original_id"]`` where the module docstring says. Raises
    ``MalformedResponse`` for token counts that are not whole numbers
    from 0 to ``MAX_TOKENS_PER_CALL``, and ``RefusedText`` (one) for
    text content with a lone surrogate or longer than
    ``TOLLGATE["MAX_MODEL_TEXT_CHARS"]``.
    """
    for name in ("input_tokens", "output_tokens"):
        setattr(response, name, _token_count(name, getattr(response, name)))
    response.content = str(response.content or "").replace(NUL, "")
    limit = max_text_chars()
    if len(response.content) > limit:
        raise RefusedText(f"The text of the answer is {len(response.content)} characters long, over the limit "
                          f"of {limit}: write a shorter answer.")
    if found := LONE_SURROGATE.search(response.content):
        raise RefusedText(f"The text of the answer contains a lone surrogate (\\u{ord(found.group()):04x}), "
                                "which is not a character: write the answer without it.")
    response.finish_reason = _storable(str(response.finish_reason or "stop"))
    for call in response.tool_calls:
        _screen_call(call)
    return response


@contextmanager
def storable_errors():
    """Re-raise a ``ModelError`` whose text has NUL characters or lone surrogates as the same type with them
    replaced (in ``detail`` too); ``status``, ``transient`` and ``retry_after_s`` are kept."""
    try:
        yield
    except ModelError as exc:
        if _storable(str(exc)) == str(exc) and _storable(exc.detail) == exc.detail:
            raise
        raise type(exc)(_storable(str(exc)), detail=_storable(exc.detail), status=exc.status,
                        transient=exc.transient, retry_after_s=exc.retry_after_s) from exc


def _token_count(name: str, value) -> int:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS_PER_CALL:
        return value
    shown = _storable(repr(value)[:40])
    raise MalformedResponse(f"The reported {name} ({shown}) is not a whole number from 0 to {MAX_TOKENS_PER_CALL}.")


def _screen_call(call: dict) -> None:
    problems = []
    call_id = "" if call.get("id") is None else str(call["id"])
    call["id"] = call_id
    if len(call_id) > MAX_CALL_ID_LENGTH or _storable(call_id) != call_id:
        call["original_id"] = _storable(call_id)
        call["id"] = ""
        problems.append(f"The tool call id must be at most {MAX_CALL_ID_LENGTH} characters without NUL "
                        "characters or lone surrogates; it was replaced.")
    name = call.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_TOOL_NAME_LENGTH
                             or _storable(name) != name):
        call["name"] = _storable(str(name))
        problems.append(f"The tool name must be a string of at most {MAX_TOOL_NAME_LENGTH} characters "
                        "without NUL characters or lone surrogates.")
    raw = call.get("arguments")
    if raw is not None and not isinstance(raw, str):
        raw = _as_text(raw)
    if raw is not None:
        if len(raw) > (limit := max_text_chars()):
            problems.append(f"The arguments are {len(raw)} characters long, over the limit of {limit}.")
            raw = raw[:SHOWN_OF_REFUSED_ARGUMENTS] + "…"
        call["arguments"] = LONE_SURROGATE.sub(_escaped, raw.replace(NUL, "\\u0000"))
    if problems:
        call["refused"] = " ".join(problems)


def max_text_chars() -> int:
    """``TOLLGATE["MAX_MODEL_TEXT_CHARS"]``: the longest answer text, or raw arguments of one call, stored."""
    return settings.TOLLGATE["MAX_MODEL_TEXT_CHARS"]


def _storable(text: str) -> str:
    return LONE_SURROGATE.sub(REPLACEMENT, text.replace(NUL, REPLACEMENT))


def _escaped(match: re.Match) -> str:
    return f"\\u{ord(match.group()):04x}"


def _as_text(value) -> str:
    """Arguments a provider returned as an object, as JSON text (NaN and NUL written out, then refused)."""
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return _storable(repr(value))


def parse_arguments(raw: str) -> dict:
    """Parse tool arguments strictly: a JSON object, by the rules of every untrusted JSON text here.

    ``config.strict_json.loads`` with ``MAX_ARGUMENT_DEPTH``: no
    ``NaN``/``Infinity``, no number that overflows a float or a 64-bit
    integer, no NUL character or lone surrogate in a key or string, no key
    twice in one object, no nesting deeper than ``MAX_ARGUMENT_DEPTH``.
    Raises ``UnsafeArguments`` (a ``ValueError``) saying why, for the model,
    also for a value that is not an object.
    """
    try:
        value = strict_json.loads(raw, max_depth=MAX_ARGUMENT_DEPTH)
    except strict_json.StrictJSONError as exc:
        reason = str(exc)
        if reason[1:2].islower():  # "Not valid JSON" reads on as "not valid JSON"; "NaN" stays
            reason = reason[0].lower() + reason[1:]
        raise UnsafeArguments(f"Arguments refused: {reason}") from None
    if not isinstance(value, dict):
        raise UnsafeArguments("Arguments must be a JSON object.")
    return value
