"""Strict JSON for request bodies and form fields: what the database and the tools can take.

Python's ``json`` accepts ``NaN``, ``Infinity`` and ``-Infinity``, turns
``1e309`` into ``inf``, parses integers of any size, recurses without
limit (a body nested ~1000 deep raises ``RecursionError``) and turns an
escaped lone surrogate (``"\\ud800"``) into a string that cannot be
encoded as UTF-8 (so it can be neither stored nor sent back in an error);
PostgreSQL refuses ``\\u0000`` in text and JSON. It also keeps the last of
two equal keys in one object, so ``{"agent": "a", "agent": "b"}`` means
whatever the reader's parser picks (RFC 8259 section 4: names "SHOULD be
unique"; RFC 7493, I-JSON, makes it a MUST). ``loads`` refuses all of
these with ``StrictJSONError`` (a ``ValueError``) and a message fit for the
requester. It is the one parser of untrusted JSON text: request bodies,
form fields, answer files and model output (``runs.base.model_output``).
``StrictJSONParser`` is the REST API's parser built on it (400 on refusal),
``StrictJSONFormField`` the form field (admin JSON fields), and
``StoredJSONDecoder`` the decoder of every JSON column, so that what was
stored before these checks still renders everywhere.
"""

import json
import math
import re

from django import forms
from django.conf import settings
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import JSONParser

# Deepest nesting of objects and arrays accepted (the top level counts 1).
MAX_DEPTH = 32
# Integers outside a signed 64-bit range are refused: no database column
# or tool argument here holds more, and SQLite raises on larger ones.
MAX_INT = 2**63 - 1
# Code points of UTF-16 surrogates: valid in no UTF-8 text (a pair escaped
# in JSON decodes to one character outside this range, so only lone ones remain).
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"  # what a lone surrogate is shown as (U+FFFD REPLACEMENT CHARACTER)


class StrictJSONError(ValueError):
    """The text is not JSON this application accepts; ``str()`` says why, for the requester."""


def _refuse_constant(name: str):
    raise StrictJSONError(f"{name} is not a number JSON allows.")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise StrictJSONError(f"The number {text[:40]} is too large.")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) > MAX_INT:
        raise StrictJSONError(f"The integer {text[:40]}{'…' if len(text) > 40 else ''} is too large.")
    return value


def _check_text(text: str) -> None:
    """Raise ``StrictJSONError`` for a NUL character or a lone surrogate in a key or string."""
    if "\x00" in text:
        raise StrictJSONError("The JSON contains a NUL character (\\u0000).")
    if found := LONE_SURROGATE.search(text):
        raise StrictJSONError(f"The JSON contains a lone surrogate (\\u{ord(found.group()):04x}), "
                              "which is not a character.")


def check_value(value, *, max_depth: int = MAX_DEPTH) -> None:
    """Check an already-decoded JSON value: nesting at most ``max_depth``, no NUL character or lone
    surrogate, finite numbers.

    Raises ``StrictJSONError``. Iterative, so any depth is checked without
    recursion.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise StrictJSONError(f"The JSON is nested too deeply (more than {max_depth} levels).")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            _check_text(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise StrictJSONError("NaN and infinite numbers are not allowed.")
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_INT:
            raise StrictJSONError("An integer in the JSON is too large.")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """An object's members as a dict; raises ``StrictJSONError`` when a key appears twice."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            shown = key[:40] + ("…" if len(key) > 40 else "")
            raise StrictJSONError(f"The key {json.dumps(shown)} appears more than once in one object.")
        seen.add(key)
    return dict(pairs)


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH):
    """Decode ``text`` as strict JSON (see module doc); returns the value.

    Raises ``StrictJSONError`` for malformed JSON, ``NaN``/``Infinity``,
    numbers that overflow a float or a 64-bit integer, NUL characters, lone
    surrogates, a key repeated in one object and nesting deeper than
    ``max_depth``.
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                           parse_int=_bounded_int, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise StrictJSONError(f"The JSON is nested too deeply (more than {max_depth} levels).") from None
    except StrictJSONError:
        raise
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        position = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise StrictJSONError(f"Not valid JSON{position}.") from None
    check_value(value, max_depth=max_depth)
    return value


class StrictJSONParser(JSONParser):
    """DRF's JSON parser on ``loads``: a refused body is a 400 ``ParseError`` saying why.

    The body is decoded with the ``charset`` of its ``Content-Type`` (UTF-8
    without one). Django keeps any charset Python has a codec for, text or
    not; one that is no text encoding (``rot13``, ``zlib``, ``base64``, ...)
    is a 415, and bytes the charset cannot decode (whatever ``UnicodeError``
    its codec raises) a 400.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        """Parse the request body; raises ``ParseError`` (400) for anything ``loads`` refuses or
        the charset cannot decode, ``UnsupportedMediaType`` (415) for a charset that is no text encoding."""
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return loads(stream.read().decode(encoding))
        except LookupError:  # bytes.decode refuses codecs that do not decode bytes to text
            raise UnsupportedMediaType(media_type, detail=f"The charset {encoding} is not a text encoding; "
                                                          "send UTF-8.") from None
        except UnicodeError:  # UnicodeDecodeError, and the bare UnicodeError of e.g. punycode
            raise ParseError(f"The body is not valid {encoding}.") from None
        except StrictJSONError as exc:
            raise ParseError(f"JSON parse error: {exc}") from None


class StoredJSONDecoder(json.JSONDecoder):
    """The decoder of every JSON column: a lone surrogate read back becomes U+FFFD.

    Values are walked only when the text holds a ``\\ud8``-``\\udf`` escape
    (a surrogate pair decodes to one character and is left alone), so an
    ordinary row costs one substring search. Why: docs/design.md#model-output-validation.
    """

    def decode(self, s, *args, **kwargs):
        """The value of ``s``, lone surrogates in its keys and strings replaced by U+FFFD."""
        value = super().decode(s, *args, **kwargs)
        if _SURROGATE_ESCAPE.search(s):
            value = _without_lone_surrogates(value)
        return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def printable(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, so that it can be encoded as UTF-8."""
    return LONE_SURROGATE.sub(REPLACEMENT, text)


def _without_lone_surrogates(value):
    """``value`` (decoded JSON) with every lone surrogate in a key or string replaced by U+FFFD."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_without_lone_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {printable(key): _without_lone_surrogates(item) for key, item in value.items()}
    return value


class StrictJSONFormField(forms.JSONField):
    """Django's form ``JSONField`` reading with ``loads``: a refused value is a form error, not a 500."""

    def to_python(self, value):
        """The decoded value; raises ``ValidationError`` with the reason ``loads`` gives."""
        if self.disabled or value in self.empty_values or isinstance(
                value, (list, dict, int, float, forms.fields.JSONString)):
            return super().to_python(value)
        try:
            converted = loads(value)
        except StrictJSONError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None
        return forms.fields.JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data, initial):
        """The submitted text for redisplay, exactly as typed (valid or not), so a form with errors keeps it.

        ``InvalidJSONInput`` is Django's marker for text the widget shows as it is.
        """
        if self.disabled:
            return initial
        if data is None:
            return None
        return forms.fields.InvalidJSONInput(data)

    def prepare_value(self, value):
        """Text for the widget: submitted text as it came, a stored value as indented JSON."""
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value, ensure_ascii=False, indent=2, cls=self.encoder)
