"""The request body limit: no body larger than ``TOLLGATE["REQUEST_BODY_MAX_BYTES"]`` is read, on any route.

Refused before anything else looks at the request (authentication,
throttles, the view), at two layers:

* the HTTP server (``config.http_server``, Daphne's server with a limited
  request): a ``Content-Length`` over the limit is answered 413 as soon as
  the headers are in, without reading the body; a body that grows past it
  while arriving (``Transfer-Encoding: chunked``) is cut off with a 413 and
  the connection closed. Daphne on its own reads the whole body, to memory
  and a temporary file, before the application sees the request;
* Django's ASGI handler (``config.asgi.SyncChainASGIHandler``), for any ASGI
  server: the same two checks on the ``http.request`` messages, before
  the body is spooled.

The answer is the API's error object (code ``too_large``,
``details.limit_bytes``) under ``/api/``, a line of plain text elsewhere.
"""

import json

from django.conf import settings

MESSAGE = "Request body too large: the limit is {limit} bytes."


class BodyTooLarge(Exception):
    """A request body went past ``max_body_bytes()`` while it was being read."""


def max_body_bytes() -> int:
    """The largest request body accepted, in bytes (``TOLLGATE["REQUEST_BODY_MAX_BYTES"]``)."""
    return settings.TOLLGATE["REQUEST_BODY_MAX_BYTES"]


def declared_length(headers) -> int | None:
    """The ``Content-Length`` among ASGI ``headers`` (``(name, value)`` byte pairs, names lower-case) as an int.

    ``None`` when there is none or it is not a plain decimal number (the
    request is then limited while it is read).
    """
    for name, value in headers:
        if name == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


def too_large_answer(path: str) -> tuple[str, bytes]:
    """``(content_type, body)`` of the 413 for a request to ``path`` (the URL path, e.g. ``"/api/runs/"``).

    Under ``/api/`` the API's error object (code ``too_large``,
    ``details.limit_bytes``); elsewhere the same message as plain text.
    """
    # Imported here: the HTTP server imports this module before Django is set up,
    # and config.api imports models.
    from config.api import API_PREFIX, error_body

    limit = max_body_bytes()
    message = MESSAGE.format(limit=limit)
    if path.startswith(API_PREFIX):
        return "application/json", json.dumps(error_body("too_large", message, {"limit_bytes": limit})).encode()
    return "text/plain; charset=utf-8", message.encode()
