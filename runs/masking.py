"""Masking of credentials in JSON shown to users (agent model configs).

Agent configs name endpoint profiles and hold no secrets
(``runs.providers.http_config``); this is the second line: whatever looks
like a credential anywhere in the value is replaced by ``"***"`` before
it is shown.
"""

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


def mask_credentials(value):
    """A copy of the JSON ``value`` with credentials masked at any depth.

    A dict entry whose key looks like a credential (``is_secret_name``)
    becomes ``"***"`` unless it is empty or null; every string is passed
    through ``mask_string``. Other values are returned as they are.
    """
    if isinstance(value, dict):
        return {key: MASK if is_secret_name(str(key)) and item not in (None, "")
                else mask_credentials(item) for key, item in value.items()}
    if isinstance(value, list):
        return [mask_credentials(item) for item in value]
    if isinstance(value, str):
        return mask_string(value)
    return value
