"""Agent definitions: create, change (a new version) and archive agents after checking every part of their config.

The REST API, the admin and any other surface that defines agents call
``create_agent``, ``update_agent`` and ``archive_agent``; they raise
``runs.base.errors.InvalidInput`` (messages keyed by field) for anything a run
would later trip over: an unknown tool, provider or completion check, or a
malformed approval rule. ``check_definition`` is that check on its own (the
admin's form shows its errors by field). A change of an agent leaves alone a
tool held for an operator (an MCP tool whose definition changed), which it
may keep as it was; adding one, or changing its rule, is refused saying so.

Versions (docs/design.md#agent-versions): a change never edits a row; it
saves the next version and makes it current. Runs and sessions keep the row
they started with; new work asks ``version_for_new_work`` for the current
one, which refuses an archived agent (``AgentArchived``, 409).

An agent's approval rules add to the tools' own (see ``runs.models.Agent``);
only a user with ``LOOSEN_PERMISSION`` may make them replace the tools'
rules, and is recorded as the one who granted that. A version that asks
for approval less often than the one before (``loosened``) needs that
permission too; it names the tools in ``Agent.loosened_tools`` and is logged.

Messages are in the active language (gettext at the time of the check): the
admin's and the pages' language, English under ``/api/``
(``config.middleware.ApiInEnglishMiddleware``). Error codes do not change.
"""

import logging
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from runs.engine import completion
from runs.base.errors import AgentArchived, Conflict, InvalidInput
from runs.models import Agent
from runs.providers.registry import model_config_problems
from tools.policy import LOOSEN_PERMISSION, InvalidRule, check_rule
from tools.registry import get_tool, held_tool, tools_named

MAX_TURNS_LIMIT = 1000
# Largest value of each optional budget (null: no limit); see runs.engine.budgets.
BUDGET_LIMITS = {
    "max_model_calls": 100_000,
    "max_total_tokens": 10**12,
    "max_cost_usd": Decimal("100000"),
    "deadline_s": 30 * 24 * 3600,
}
# What a version defines (all but its identity and bookkeeping): ``update_agent`` changes any of these.
DEFINITION_FIELDS = ("name", "instructions", "model", "tools", "max_turns", "completion_check", "approval_policy",
                     *BUDGET_LIMITS)

log = logging.getLogger(__name__)


def may_loosen_policy(user) -> bool:
    """Whether ``user`` (or None) may let an agent's approval rules replace the tools' own."""
    return user is not None and user.is_authenticated and user.has_perm(LOOSEN_PERMISSION)


def _unknown_tool(name) -> str:
    return _("Unknown tool %(tool)s.") % {"tool": repr(name)}


def _slug_taken(slug: str) -> str:
    return _("An agent with slug %(slug)s already exists.") % {"slug": repr(slug)}


def _held(name, *, rule: bool) -> str:
    if rule:
        return _("The tool %(tool)s is held for an operator: its definition changed since it was accepted, and an "
                 "operator must accept it before its rule can be changed.") % {"tool": repr(name)}
    return _("The tool %(tool)s is held for an operator: its definition changed since it was accepted, and an "
             "operator must accept it before it can be given.") % {"tool": repr(name)}


def _policy_errors(approval_policy, may_loosen: bool, kept: dict) -> list[str]:
    """Problems with ``approval_policy``; ``kept``: the policy it replaces, whose rules for tools held for an
    operator (``tools.registry.held_tool``) may stay as they are, and only so."""
    if not isinstance(approval_policy, dict):
        return [_("The approval policy must be an object mapping tool names to rules.")]
    errors = [_held(name, rule=True) for name in kept if name not in approval_policy and held_tool(name)]
    for tool_name, rule in approval_policy.items():
        tool = get_tool(tool_name)
        if tool is None:
            if not held_tool(tool_name):
                errors.append(_unknown_tool(tool_name))
            elif kept.get(tool_name) != rule:
                errors.append(_held(tool_name, rule=True))
            continue
        try:
            check_rule(rule if isinstance(rule, str) else "", target_key=tool.target_key)
        except InvalidRule as exc:
            errors.append(_("%(tool)s: %(problem)s") % {"tool": tool_name, "problem": exc})
            continue
        if rule == "never" and tool.approval != "never" and not may_loosen:
            errors.append(_("%(tool)s: an agent's rule can only add approvals; switching them off "
                            "needs the %(permission)s permission.")
                          % {"tool": tool_name, "permission": LOOSEN_PERMISSION})
    return errors


def config_errors(
    *, model, tools: list, approval_policy, completion_check: str, may_loosen: bool = False,
    before: Agent | None = None,
) -> dict[str, list[str]]:
    """Problems with an agent's model config, tools, approval policy and completion check, by field.

    ``may_loosen``: the user holds ``LOOSEN_PERMISSION`` (else a ``never``
    rule for a tool that asks for approval is refused as pointless).
    ``before``: the version this one would follow (None: a new agent). A
    tool held for an operator (``tools.registry.held_tool``: an MCP tool
    whose definition changed) may stay in the tools and keep its rule
    as ``before`` had them; adding it, or changing or dropping its rule,
    is an error saying it is held.
    """
    errors: dict[str, list[str]] = {}
    kept_tools = set(before.tools) if before is not None else set()
    unknown = [tool for tool in tools if not tools_named(tool)]
    problems = []
    for tool in unknown:
        if not held_tool(tool):
            problems.append(_unknown_tool(tool))
        elif tool not in kept_tools:
            problems.append(_held(tool, rule=False))
    if problems:
        errors["tools"] = problems
    if completion_check not in completion.check_names():
        errors["completion_check"] = [
            _("Unknown completion check %(check)s; known: %(known)s.")
            % {"check": repr(completion_check), "known": ", ".join(completion.check_names())}
        ]
    policy_errors = _policy_errors(approval_policy, may_loosen,
                                   before.approval_policy if before is not None else {})
    for field, messages in (("model", model_config_problems(model)), ("approval_policy", policy_errors)):
        if messages:
            errors[field] = messages
    return errors


def _budget_errors(budgets: dict) -> dict[str, list[str]]:
    errors = {}
    for field, limit in BUDGET_LIMITS.items():
        value = budgets.get(field)
        if value is None:
            continue
        if field == "max_cost_usd":
            try:
                ok = not isinstance(value, bool) and 0 <= Decimal(str(value)) <= limit
            except (InvalidOperation, ValueError):
                ok = False
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= limit
        if not ok:
            errors[field] = [_("%(field)s must be a number from %(low)s to %(high)s, or null for no limit.")
                             % {"field": field, "low": 0 if field == "max_cost_usd" else 1, "high": limit}]
    return errors


def _rules_in_force(tool, policy: dict, granted: bool) -> set[str]:
    """The rules that decide whether ``tool``'s calls need approval (any one asking asks), ``never`` left out."""
    rule = policy.get(tool.name)
    rules = {rule} if granted and rule is not None else {tool.approval, rule} - {None}
    return rules - {"never"}


def loosened(before: Agent | None, *, approval_policy: dict, granted: bool) -> list[str]:
    """Names of the tools (sorted) whose calls a policy asks approval for less often than ``before``.

    ``before`` None compares with the tools' own rules (a new agent).
    ``granted``: the policy replaces the tools' rules (see ``effective_rule``
    in ``tools.services.assessment``). A tool is loosened when a rule that
    asked for its calls no longer applies, unless ``always`` now does.
    Only tools named by either policy can differ; unknown names are skipped.
    """
    old_policy = before.approval_policy if before is not None else {}
    old_granted = before is not None and before.approval_policy_granted_by_id is not None
    names = []
    for name in sorted(set(old_policy) | set(approval_policy)):
        tool = get_tool(name)
        if tool is None:
            continue
        old, new = _rules_in_force(tool, old_policy, old_granted), _rules_in_force(tool, approval_policy, granted)
        if not old <= new and "always" not in new:
            names.append(name)
    return names


@dataclass(frozen=True)
class Checked:
    """``check_definition``'s verdict: the ``fields`` to save (``DEFINITION_FIELDS``, defaults filled in),
    who grants the policy (``granted_by``: None when it only adds), the ``loosened`` tools, and the
    ``errors`` by field (empty: it may be saved)."""

    fields: dict
    granted_by: object
    loosened: list[str]
    errors: dict[str, list[str]]


def check_definition(fields: dict, *, user=None, before: Agent | None = None) -> Checked:
    """Check an agent definition (``DEFINITION_FIELDS``, any missing taking its default) for ``user``.

    ``before``: the version it would follow (None: a new agent); its policy's
    grant is kept when the policy is unchanged, else the policy replaces the
    tools' rules only if ``user`` holds ``LOOSEN_PERMISSION`` (recorded as
    ``granted_by``). Loosening a tool's approval without that permission is
    an error on ``approval_policy``. Writes nothing; the slug is not checked.
    """
    fields = {
        "name": (fields.get("name") or "").strip(), "instructions": fields.get("instructions") or "",
        "model": fields.get("model"), "tools": list(fields.get("tools") or []),
        "max_turns": Agent._meta.get_field("max_turns").default if fields.get("max_turns") is None
        else fields["max_turns"],
        "completion_check": fields.get("completion_check") or "default",
        "approval_policy": fields.get("approval_policy") or {},
        **{field: fields.get(field) for field in BUDGET_LIMITS},
    }
    errors: dict[str, list[str]] = {}
    if not fields["name"]:
        errors["name"] = [_("The name must not be empty.")]
    max_turns = fields["max_turns"]
    if not isinstance(max_turns, int) or not 1 <= max_turns <= MAX_TURNS_LIMIT:
        errors["max_turns"] = [_("max_turns must be an integer from 1 to %(high)s.") % {"high": MAX_TURNS_LIMIT}]
    errors.update(_budget_errors(fields))
    may_loosen = may_loosen_policy(user)
    errors.update(config_errors(model=fields["model"], tools=fields["tools"], approval_policy=fields["approval_policy"],
                                completion_check=fields["completion_check"], may_loosen=may_loosen, before=before))
    policy = fields["approval_policy"]
    if before is not None and isinstance(policy, dict) and policy == before.approval_policy:
        granted_by = before.approval_policy_granted_by
    else:
        granted_by = user if may_loosen and policy else None
    tools = loosened(before, approval_policy=policy, granted=granted_by is not None) \
        if isinstance(policy, dict) and "approval_policy" not in errors else []
    if tools and not may_loosen:
        errors["approval_policy"] = [
            _("This loosens the approval of %(tools)s; that needs the %(permission)s permission.")
            % {"tools": ", ".join(tools), "permission": LOOSEN_PERMISSION}]
    return Checked(fields=fields, granted_by=granted_by, loosened=tools, errors=errors)


def _saved(checked: Checked, *, slug: str, version: int, user) -> Agent:
    """Save a checked definition as version ``version`` of ``slug``, current; log a loosening."""
    agent = Agent.objects.create(slug=slug, version=version, is_current=True, **checked.fields,
                                 approval_policy_granted_by=checked.granted_by, loosened_tools=checked.loosened,
                                 created_by=user if user is not None and user.is_authenticated else None)
    if checked.loosened:
        log.warning("agent %s version %s loosens the approval of %s (by %s)", slug, version,
                    ", ".join(checked.loosened), agent.created_by)
    return agent


def create_agent(
    *,
    slug: str,
    name: str,
    instructions: str = "",
    model: dict,
    tools: list[str] | None = None,
    max_turns: int | None = None,
    completion_check: str | None = None,
    approval_policy: dict | None = None,
    max_model_calls: int | None = None,
    max_total_tokens: int | None = None,
    max_cost_usd: Decimal | None = None,
    deadline_s: int | None = None,
    user=None,
) -> Agent:
    """Validate an agent definition and save it as version 1, current.

    ``tools`` None or empty means no tools at all (stored as ``[]``), never
    every registered tool;
    ``max_turns``, ``completion_check`` and ``approval_policy`` fall back to
    the model defaults. The budgets (``max_model_calls``,
    ``max_total_tokens``, ``max_cost_usd`` in US dollars, ``deadline_s``
    in seconds) are None for the defaults, else bounded by ``BUDGET_LIMITS``.
    ``user`` is who creates it: if they hold ``LOOSEN_PERMISSION``, a
    non-empty ``approval_policy`` replaces the tools' rules and they are
    recorded as its grantor (the tools it loosens in ``loosened_tools``);
    otherwise (and with no user) it can only add approvals. A slug once
    used (archived agents included) is taken. Raises ``InvalidInput``
    (``details``: messages by field) naming each bad field.
    """
    checked = check_definition({
        "name": name, "instructions": instructions, "model": model, "tools": tools, "max_turns": max_turns,
        "completion_check": completion_check, "approval_policy": approval_policy, "max_model_calls": max_model_calls,
        "max_total_tokens": max_total_tokens, "max_cost_usd": max_cost_usd, "deadline_s": deadline_s}, user=user)
    errors = dict(checked.errors)
    try:
        validate_slug(slug)
    except ValidationError as exc:
        errors["slug"] = exc.messages
    if not errors.get("slug") and Agent.objects.filter(slug=slug).exists():
        errors["slug"] = [_slug_taken(slug)]
    if errors:
        raise InvalidInput.for_fields(errors)

    try:
        with transaction.atomic():
            return _saved(checked, slug=slug, version=1, user=user)
    except IntegrityError:
        raise InvalidInput.for_fields({"slug": [_slug_taken(slug)]}) from None


def _locked_current(agent: Agent) -> Agent:
    """``agent``'s row locked, in the caller's transaction; ``Conflict`` unless it is still the current version."""
    locked = Agent.objects.select_for_update().get(pk=agent.pk)
    if not locked.is_current:
        current = Agent.objects.current().get(slug=locked.slug)
        raise Conflict(_("Version %(version)s of agent %(slug)s is no longer its current version (%(current)s); "
                         "make the change to that one.")
                       % {"version": locked.version, "slug": locked.slug, "current": current.version},
                       details={"version": locked.version, "current_version": current.version})
    return locked


def update_agent(*, agent: Agent, user=None, **changes) -> Agent:
    """Make a new version of ``agent`` (its current version) with ``changes`` and make it current; return it.

    ``changes``: any of ``DEFINITION_FIELDS`` (the slug never changes); the
    rest is copied from ``agent``. Checked as ``create_agent`` checks,
    against ``agent`` (``check_definition``): an unchanged policy keeps its
    grant; loosening an approval needs ``LOOSEN_PERMISSION``. Runs already
    started keep the version they started with. When nothing would change,
    no version is made and ``agent`` is returned as it is. Raises
    ``InvalidInput`` (by field; nothing saved), ``AgentArchived`` (409) for
    an archived agent, ``Conflict`` (409) when ``agent`` is no longer the
    current version (changed meanwhile).
    """
    unknown = sorted(set(changes) - set(DEFINITION_FIELDS))
    if unknown:
        raise TypeError(f"update_agent() got fields it cannot change: {', '.join(unknown)}")
    with transaction.atomic():
        current = _locked_current(agent)
        if current.archived_at is not None:
            raise AgentArchived(current)
        checked = check_definition({**{f: getattr(current, f) for f in DEFINITION_FIELDS}, **changes},
                                   user=user, before=current)
        if checked.errors:
            raise InvalidInput.for_fields(checked.errors)
        if (all(checked.fields[f] == getattr(current, f) for f in DEFINITION_FIELDS)
                and getattr(checked.granted_by, "pk", None) == current.approval_policy_granted_by_id):
            return current
        Agent.objects.filter(pk=current.pk).update(is_current=False)
        return _saved(checked, slug=current.slug, version=current.version + 1, user=user)


def archive_agent(*, agent: Agent, user=None) -> Agent:
    """Archive the agent whose current version is ``agent``: no new runs or sessions; return the current version.

    Runs and sessions already made stay as they are and readable; runs
    already queued still run. The slug stays taken. Archiving an archived
    agent returns it unchanged. Raises ``Conflict`` (409) when ``agent`` is
    no longer the current version.
    """
    with transaction.atomic():
        current = _locked_current(agent)
        if current.archived_at is None:
            current.archived_at = timezone.now()
            current.save(update_fields=["archived_at"])
            log.info("agent %s archived (by %s)", current.slug, user)
    return current


def version_for_new_work(agent: Agent) -> Agent:
    """The version a new run or session of ``agent``'s slug uses: ``agent`` when it is current, else the current one.

    Raises ``AgentArchived`` (409) when the agent is archived.
    """
    if not agent.is_current:
        agent = Agent.objects.current().get(slug=agent.slug)
    if agent.archived_at is not None:
        raise AgentArchived(agent)
    return agent
