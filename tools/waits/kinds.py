"""Kinds of waits: what a wait of each kind does when it opens, at its deadline, and whether settling it
resumes the run (docs/design.md#waits).

A kind is declared once, as a ``WaitKind``, by the app that owns what is
awaited, and registered with ``register_wait_kind`` (as tools are with
``tools.registry.register``): ``scheduled`` here, ``external_event`` in
``tools.waits.events``, ``input`` by the approvals app (``approvals.waits``),
which owns the question. A tool names the kind in its ``WaitSpec``. The
kind's name is also the run's ``waiting_reason`` while it waits; neither
column has ``choices``, so a new kind needs no migration.
"""

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from django.core.exceptions import ImproperlyConfigured

from runs.models import WaitingReason, add_wait_kind
from tools.models import Wait

# Lower-case words joined by "_", at most 32 characters (the width of Wait.kind and Run.waiting_reason).
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# The engine's own waiting reasons: no wait is of these kinds.
ENGINE_REASONS = (WaitingReason.APPROVAL, WaitingReason.RECONCILIATION, WaitingReason.RETRY_BACKOFF)


@dataclass(frozen=True)
class WaitKind:
    """One kind of wait (docs/design.md#waits).

    * ``name``: ``Wait.kind`` and the run's ``waiting_reason`` (``NAME_PATTERN``).
    * ``resumes_run``: settling it (``tools.waits.settle_wait``) resumes the run; False: only its deadline ends it.
    * ``inbox_item``: a person settles it through its tool call's inbox item; the API's ``waiting_for`` names it.
    * ``open(wait, spec)``: once the pending wait is stored, in the run's transaction; ``spec``: ``tools.registry.WaitSpec``.
    * ``taken(wait) -> bool``: True when it cannot open now; it is then stored ``refused`` with ``taken_error``.
    * ``done_at_deadline(wait, now) -> result``: ``done`` at (or opened past) its deadline with this JSON result; None: ``timed_out``.
    * ``on_timeout(tx, wait, now=, actor=)``: under the run's lock (``runs.tx.RunTx``) just before it times out.
    * ``timeout_error``, ``taken_error``: the call's error, ``str.format``-ed with ``event_type``, ``correlation_key``.
    """

    name: str
    resumes_run: bool = True
    inbox_item: bool = False
    open: Callable[[Wait, Any], None] | None = None
    taken: Callable[[Wait], bool] | None = None
    done_at_deadline: Callable[[Wait, datetime], Any] | None = None
    on_timeout: Callable[..., None] | None = None
    timeout_error: str = "Timed out."
    taken_error: str = "This wait cannot be opened now."

    def error(self, template: str, wait: Wait) -> str:
        """``template`` (``timeout_error`` or ``taken_error``) filled in with ``wait``'s event type and key."""
        return template.format(event_type=wait.event_type, correlation_key=wait.correlation_key)


_KINDS: dict[str, WaitKind] = {}


def register_wait_kind(kind: WaitKind) -> WaitKind:
    """Add ``kind``; returns it. Raises ``ImproperlyConfigured`` for a name off ``NAME_PATTERN``, one of
    the engine's reasons (``ENGINE_REASONS``), or one another kind took."""
    if not NAME_PATTERN.match(kind.name) or kind.name in ENGINE_REASONS:
        raise ImproperlyConfigured(f"{kind.name!r} cannot name a kind of wait.")
    if _KINDS.get(kind.name, kind) is not kind:
        raise ImproperlyConfigured(f"A kind of wait named {kind.name!r} is already registered.")
    _KINDS[kind.name] = kind
    add_wait_kind(kind.name, resumes_run=kind.resumes_run)
    return kind


def get_wait_kind(name: str) -> WaitKind:
    """The registered kind ``name``; ``ImproperlyConfigured`` if there is none (its app is not installed)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise ImproperlyConfigured(f"No kind of wait {name!r} is registered.") from None


def kind_of(wait: Wait) -> WaitKind:
    """The kind of a stored ``wait``; a kind no longer registered acts as a plain ``WaitKind`` (it times out)."""
    return _KINDS.get(wait.kind) or WaitKind(wait.kind)


def _woke(wait: Wait, now: datetime) -> dict:
    return {"waited_until": wait.deadline.isoformat(), "woke_at": now.isoformat()}


SCHEDULED = register_wait_kind(WaitKind(name=WaitingReason.SCHEDULED, resumes_run=False, done_at_deadline=_woke))
