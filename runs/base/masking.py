"""Masking of credentials in JSON shown to users (agent model configs, tool calls' arguments in approvers'
summaries and emails) and in every log line.

Agent configs name endpoint profiles and hold no secrets
(``runs.providers.http_config``); this is the second line: whatever looks
like a credential anywhere in the value is replaced by ``"***"`` before
it is shown.

Log lines get the same treatment and more (``install_log_masking``): a
provider's error answer may quote the request, key and all, and a
library's exception may hold a URL with a password. Every log record of
the process is masked as it is made, before any handler sees it.
"""

import logging
import os
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
# Words that make a key name a credential, e.g. "api_key", "apiKey",
# "x-api-key", "auth_token", "password", "client_secret", "Authorization".
_SECRET_WORDS = {"key", "apikey", "secret", "password", "passwd", "token", "credential", "credentials",
                 "authorization", "auth", "bearer", "cookie"}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL_WITH_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
# Shapes of bare API keys ("sk-...", "Bearer ...").
_BARE_KEY = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{12,}|\bBearer\s+\S+", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether a key or parameter ``name`` looks like it holds a credential (see ``_SECRET_WORDS``)."""
    words = re.split(r"[^a-z0-9]+", _CAMEL.sub("_", name).lower())
    return any(word in _SECRET_WORDS for word in words)


def _mask_url_query(match: re.Match) -> str:
    url = match.group(0)
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK
    if not parts.query:
        return url
    query = [(name, MASK if is_secret_name(name) else value) for name, value in parse_qsl(parts.query, True)]
    return urlunsplit(parts._replace(query=urlencode(query, safe="*")))


def mask_string(text: str) -> str:
    """``text`` with URL user-info, credential query parameters and bare API keys replaced by ``***``."""
    text = _URL_WITH_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _URL.sub(_mask_url_query, text)
    return _BARE_KEY.sub(MASK, text)


# A JSON entry named just "key" (any case) is a lookup key, as in a tool's ``{"key": "order-7"}``, which the
# approver deciding on the call must see. With another word "key" still names a credential (``api_key``,
# ``x-api-key``, ``secret_key``); alone it still does in a URL's query (``?key=``, as some APIs take their keys)
# and in an environment variable's name, where ``is_secret_name`` decides as before.
_LOOKUP_NAMES = {"key"}


def _is_credential_entry(name: str) -> bool:
    """Whether a JSON entry named ``name`` holds a credential: ``is_secret_name``, a bare ``key`` left out."""
    return is_secret_name(name) and name.lower() not in _LOOKUP_NAMES


def mask_credentials(value):
    """A copy of the JSON ``value`` with credentials masked at any depth.

    A dict entry whose key looks like a credential (``is_secret_name``:
    ``api_key``, ``secret``, ``token``, ``password``, ``Authorization``...)
    becomes ``"***"`` unless it is empty or null; an entry named just
    ``key`` is not one (``_LOOKUP_NAMES``). Every string, such a key's value
    too, is passed through ``mask_string`` (bare API keys, URL passwords and
    credential query parameters masked). Other values are returned as they are.
    """
    if isinstance(value, dict):
        return {key: MASK if _is_credential_entry(str(key)) and item not in (None, "")
                else mask_credentials(item) for key, item in value.items()}
    if isinstance(value, list):
        return [mask_credentials(item) for item in value]
    if isinstance(value, str):
        return mask_string(value)
    return value


# A name given a value in free text: ``password=hunter2``, ``"api_key": "sk-..."``, ``token: abc``; the
# value is masked when the name's last word names a credential (``_CREDENTIAL_LAST_WORDS``).
_ASSIGNED = re.compile(
    r"""([A-Za-z][\w.-]*)(["']?\s*[:=]\s*["']?(?:(?:Bearer|Basic|Token)\s+)?)(?!\*\*\*)([^\s"',;&)}\]]+)""")
# "input_tokens", "max_tokens", "csrf_token_age" or "tokenizer" name no credential; "access_token",
# "client_secret", "x-api-key" and "Authorization" do.
_CREDENTIAL_LAST_WORDS = {"password", "passwd", "pwd", "secret", "token", "key", "apikey", "authorization",
                          "credential", "credentials"}


def _mask_assigned(match: re.Match) -> str:
    last_word = re.split(r"[^a-z0-9]+", _CAMEL.sub("_", match.group(1)).lower())[-1]
    if last_word in _CREDENTIAL_LAST_WORDS:
        return match.group(1) + match.group(2) + MASK
    return match.group(0)


MIN_SECRET_CHARS = 6  # shorter values of secret environment variables are too common to mask by value


def _secret_values() -> list[str]:
    """Values of this process's environment variables whose names look like credentials, longest first."""
    values = {value for name, value in os.environ.items()
              if len(value) >= MIN_SECRET_CHARS and is_secret_name(name)}
    return sorted(values, key=len, reverse=True)


def mask_log_text(text: str) -> str:
    """``text`` with credentials replaced by ``***``: values of secret environment variables
    (``OPENAI_API_KEY``, ``SECRET_KEY``, ...) wherever they appear, values given to a credential's
    name (``password=...``, ``"api_key": "..."``), and what ``mask_string`` finds."""
    for value in _secret_values():
        text = text.replace(value, MASK)
    text = _ASSIGNED.sub(_mask_assigned, text)
    return mask_string(text)


def install_log_masking() -> None:
    """Make every log record of the process masked (``mask_log_text``) as it is created.

    A ``logging`` record factory (Python's ``logging.setLogRecordFactory``)
    renders the message with its arguments, masks it, and stores it with no
    arguments left; a traceback (``exc_info``) is rendered and masked into
    ``exc_text``, which formatters print instead of rendering it again.
    Every handler, Django's, Dramatiq's or a test's, sees only masked text.
    Installing twice changes nothing. A record whose message cannot be
    rendered is left as it is, for the handler to report as usual.
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, "masks_secrets", False):
        return

    def masked_record(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging's own handler reports it
            return record
        record.msg, record.args = mask_log_text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_log_text(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = mask_log_text(record.stack_info)
        return record

    masked_record.masks_secrets = True
    logging.setLogRecordFactory(masked_record)
