"""The one family of errors services raise on purpose, and what each means to a caller.

Every error carries a stable ``code`` (for programs), an ``http_status``,
a ``message`` (for people) and ``details`` (a dict: e.g. messages by field,
or the id of the run in the way). The API maps them in one place
(``config.api.exception_handler``); pages show the message; anything else
a service lets escape (a bare ``ValueError``, say) is a bug and a 500.
"""

from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext as _


class TollgateError(Exception):
    """Base class: ``code``, ``http_status``, ``message``, ``details``."""

    code = "error"
    http_status = 400

    def __init__(self, message: str, *, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or {}


class InvalidInput(TollgateError):
    """The request cannot be carried out as given (400). ``details``: ``{field: [messages]}`` when a field is at fault."""

    code = "invalid"
    http_status = 400

    @classmethod
    def for_fields(cls, errors: dict) -> "InvalidInput":
        """One error for several fields: ``{field: message or [messages]}``; the message is the first of them."""
        fields = {field: [m] if isinstance(m, str) else list(m) for field, m in errors.items()}
        first = next(iter(fields.values()))[0] if fields else "Invalid input."
        return cls(first, details=fields)


class Forbidden(TollgateError, PermissionDenied):
    """The user may not do this (403); also Django's ``PermissionDenied``, so pages answer 403 as well."""

    code = "permission_denied"
    http_status = 403


class NotFound(TollgateError):
    """Nothing matches what the request names (404), e.g. an event key no run waits on."""

    code = "not_found"
    http_status = 404


class TooLarge(TollgateError):
    """Something sent is over its size limit (413); ``details``: ``limit_bytes`` and the ``field`` at fault."""

    code = "too_large"
    http_status = 413


class Throttled(TollgateError):
    """Over a rate (429), e.g. runs started per user; ``details``: ``retry_after`` (whole seconds)."""

    code = "throttled"
    http_status = 429


class Conflict(TollgateError):
    """The object's state does not allow it now (409)."""

    code = "conflict"
    http_status = 409


class AgentArchived(Conflict):
    """The agent was archived (409): it takes no new runs or sessions; its old runs stay readable.
    ``details``: ``agent`` (the slug) and ``archived_at`` (ISO 8601)."""

    code = "agent_archived"

    def __init__(self, agent):
        super().__init__(_("Agent %(slug)s was archived; it takes no new runs or sessions.") % {"slug": repr(agent.slug)},
                         details={"agent": agent.slug, "archived_at": agent.archived_at.isoformat()})


class Expired(Conflict):
    """Its time ran out (409), e.g. a decision on an inbox item past its ``expires_at`` that the sweeper
    has not expired yet. ``details``: ``expires_at`` (ISO 8601)."""

    code = "expired"


class IdempotencyKeyReused(TollgateError):
    """An ``Idempotency-Key`` this user already sent with a different request (422).

    ``details``: the ``run`` that key started, when it started one.
    """

    code = "idempotency_key_reused"
    http_status = 422

    def __init__(self, run_id: int | None = None):
        super().__init__("This Idempotency-Key was already used for a different request.",
                         details={"run": run_id} if run_id is not None else None)


class IdempotencyKeyInUse(Conflict):
    """A request with this ``Idempotency-Key`` is still being handled (409); send it again in a moment."""

    code = "idempotency_key_in_use"

    def __init__(self):
        super().__init__("A request with this Idempotency-Key is still being handled; try again shortly.")


class SessionBusy(Conflict):
    """The session already has an active run (409); ``active_run`` is that run."""

    code = "session_busy"

    def __init__(self, active_run):
        super().__init__(f"Session {active_run.session_id} already has an active run ({active_run.pk}).",
                         details={"active_run": active_run.pk})
        self.active_run = active_run
