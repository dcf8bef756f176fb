"""The tool listings of MCP servers, cached in ``McpTool``: refreshed, and a changed definition held for an operator.

A tool's definition is its description, ``inputSchema`` and annotations.
The first listing of a tool is accepted as the operator configured its
server (trust on first use); from then on a listing whose definition
differs from the accepted one holds the tool (``McpTool.held``: not offered
to models, its calls refused) until an operator accepts it (``accept``,
the admin's action); accepting one that loosens how the tool is governed
(``loosening``) needs ``LOOSEN_PERMISSION``, as any loosening does. Every discovery, change, acceptance, removal and
return is an ``McpToolEvent`` and a log record (no secret in either).
"""

import hashlib
import json
import logging
from dataclasses import dataclass

from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from runs.base.errors import Forbidden
from tools.mcp.conf import ServerProfile, servers
from tools.mcp.source import default_rule, governance
from tools.models import McpTool, McpToolEvent
from tools.policy import LOOSEN_PERMISSION, asks_as_often, check_rule

log = logging.getLogger(__name__)
Kind = McpToolEvent.Kind


@dataclass(frozen=True)
class Refreshed:
    """What one refresh of a server found: ``changes``, ``(full tool name, event kind)`` pairs, in order."""

    server: str
    changes: tuple[tuple[str, str], ...]


def fingerprint(definition: dict) -> str:
    """SHA-256 (hex) of a definition ``{"description", "inputSchema", "annotations"}`` as canonical JSON."""
    return hashlib.sha256(json.dumps(definition, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def refresh(server: str, *, actor: str = "refresh") -> Refreshed:
    """List the tools of the configured ``server`` now and update its cache; returns what changed.

    Raises ``KeyError`` for a server that is not configured, and
    ``tools.registry.ToolUnavailable`` / ``ToolError`` when the server
    cannot be listed (the cache is left as it was).
    """
    from tools.mcp import client  # the SDK is an optional extra: imported only once a server is used

    profile = servers()[server]
    listed = async_to_sync(client.list_tools)(profile)
    definitions = {tool.name: {"description": tool.description or "", "inputSchema": tool.input_schema,
                               "annotations": tool.annotations.model_dump(mode="json", by_alias=True,
                                                                          exclude_none=True)
                               if tool.annotations else {}}
                   for tool in listed}
    return store_listing(profile, definitions, actor=actor)


def store_listing(profile: ServerProfile, definitions: dict[str, dict], *, actor: str) -> Refreshed:
    """Update ``profile``'s cached tools to the listing ``definitions`` (``{tool name: definition}``)."""
    now = timezone.now()
    changes = []
    with transaction.atomic():
        known = {row.name: row for row in McpTool.objects.select_for_update().filter(server=profile.name)}
        for name, definition in definitions.items():
            row, kind = _store_one(profile, known.get(name), name, definition, now)
            if kind:
                changes.append((row, kind))
        for name, row in known.items():
            if name not in definitions and row.listed:
                row.listed = False
                row.refreshed_at = now
                row.save(update_fields=["listed", "refreshed_at"])
                changes.append((row, Kind.REMOVED))
        for row, kind in changes:
            detail = ({"before": row.accepted_definition, "after": row.definition()} if kind == Kind.CHANGED else {})
            McpToolEvent.objects.create(tool=row, kind=kind, actor=actor, detail=detail)
            (log.warning if kind == Kind.CHANGED else log.info)("MCP tool %s: %s", row.full_name, kind)
    return Refreshed(server=profile.name, changes=tuple((row.full_name, str(kind)) for row, kind in changes))


def _store_one(profile: ServerProfile, row: McpTool | None, name: str, definition: dict, now) -> tuple:
    """Create or update one cached tool; returns ``(row, event kind or None)``."""
    digest = fingerprint(definition)
    fields = {"description": definition["description"], "input_schema": definition["inputSchema"],
              "annotations": definition["annotations"], "fingerprint": digest, "refreshed_at": now}
    if row is None:
        row = McpTool.objects.create(server=profile.name, name=name, accepted_fingerprint=digest,
                                     accepted_definition=definition, accepted_at=now, **fields)
        return row, Kind.DISCOVERED
    kind = None
    if not row.listed:
        kind = Kind.RETURNED
    if digest != row.fingerprint and digest != row.accepted_fingerprint:
        kind = Kind.CHANGED
    for attribute, value in fields.items():
        setattr(row, attribute, value)
    row.listed = True
    row.save()
    return row, kind


def loosening(row: McpTool) -> list[str]:
    """How accepting ``row``'s listed definition would loosen the way its tool is governed, compared with its
    accepted definition (``tools.mcp.source.governance``, the operator's and the profile's rules included): a
    side effect becoming read-only, a call becoming idempotent (sent again), a rule in force that may ask for
    approval less often (``tools.policy.asks_as_often``). Empty: it loosens nothing. In the active language."""
    profile = servers().get(row.server)
    before = governance(profile, row, (row.accepted_definition or {}).get("annotations", {}))
    after = governance(profile, row, row.annotations)
    what = []
    if before.side_effect and not after.side_effect:
        what.append(_("it would be read-only"))
    if after.idempotent and not before.idempotent:
        what.append(_("it would be idempotent"))
    if not asks_as_often(after.approval, before.approval):
        what.append(_("its approval rule %(after)s would replace %(before)s")
                    % {"after": repr(after.approval), "before": repr(before.approval)})
    return what


def accept(row: McpTool, *, user) -> bool:
    """Accept ``row``'s listed definition (an operator's decision, ``user``): it is offered again.

    Returns False (nothing written) when it was not held. Raises
    ``runs.base.errors.Forbidden`` (nothing written) when accepting it
    loosens how the tool is governed (``loosening``) and ``user`` lacks
    ``LOOSEN_PERMISSION``; a loosening accepted is logged and named in the
    ``accepted`` event (``detail["loosened"]``).
    """
    with transaction.atomic():
        row = McpTool.objects.select_for_update().get(pk=row.pk)
        if not row.held:
            return False
        loosened = loosening(row)
        if loosened and not user.has_perm(LOOSEN_PERMISSION):
            raise Forbidden(_("Accepting the listed definition of %(tool)s loosens how it is governed (%(what)s); "
                              "that needs the %(permission)s permission.")
                            % {"tool": row.full_name, "what": "; ".join(loosened), "permission": LOOSEN_PERMISSION})
        row.accepted_fingerprint = row.fingerprint
        row.accepted_definition = row.definition()
        row.accepted_by = user
        row.accepted_at = timezone.now()
        row.save(update_fields=["accepted_fingerprint", "accepted_definition", "accepted_by", "accepted_at"])
        detail = {"fingerprint": row.fingerprint, **({"loosened": loosened} if loosened else {})}
        McpToolEvent.objects.create(tool=row, kind=Kind.ACCEPTED, actor=user.get_username(), detail=detail)
    if loosened:
        log.warning("MCP tool %s: accepted by %s, loosening it: %s", row.full_name, user.get_username(),
                    "; ".join(loosened))
    else:
        log.info("MCP tool %s: accepted by %s", row.full_name, user.get_username())
    return True


def rule_problem(row: McpTool, rule: str, *, user) -> str:
    """Why ``user`` may not give ``row`` the approval rule ``rule`` (empty: they may).

    The rule must be well-formed (``tools.policy.check_rule``; an MCP tool
    declares no target key). One that may ask less often than the rule it
    replaces (the server profile's ``rules``, else the annotations', those
    of the accepted definition and of a listed one still held alike:
    ``tools.policy.asks_as_often``) needs ``LOOSEN_PERMISSION``, as an
    agent's loosening rule does.
    """
    if not rule:
        return ""
    try:
        check_rule(rule)
    except ValueError as exc:
        return str(exc)
    profile = servers().get(row.server)
    replaced = [(profile.rules.get(row.name) if profile is not None else None) or default_rule(annotations)
                for annotations in (row.annotations, (row.accepted_definition or {}).get("annotations", {}))]
    if not all(asks_as_often(rule, than) for than in replaced) and not user.has_perm(LOOSEN_PERMISSION):
        return _("Asking for approval less often than the settings' rule or the tool's annotations do needs the "
                 "%(permission)s permission.") % {"permission": LOOSEN_PERMISSION}
    return ""


def set_rule(row: McpTool, rule: str, *, user) -> bool:
    """Give ``row`` the operator's approval rule ``rule`` (empty: none, the settings' or the annotations'
    rule applies) on behalf of ``user``, with a ``rule`` event (``{"before", "after"}``); returns whether it
    changed. Raises ``runs.base.errors.Forbidden`` with ``rule_problem``'s reason."""
    problem = rule_problem(row, rule, user=user)
    if problem:
        raise Forbidden(problem)
    with transaction.atomic():
        row = McpTool.objects.select_for_update().get(pk=row.pk)
        if row.approval_rule == rule:
            return False
        McpToolEvent.objects.create(tool=row, kind=Kind.RULE, actor=user.get_username(),
                                    detail={"before": row.approval_rule, "after": rule})
        row.approval_rule = rule
        row.save(update_fields=["approval_rule"])
    log.warning("MCP tool %s: approval rule set to %r by %s", row.full_name, rule, user.get_username())
    return True
