"""Agent definitions: create an agent after checking every part of its config.

The REST API and any other surface that defines agents call
``create_agent``; it raises ``runs.errors.InvalidInput`` (messages keyed by
field) for anything a run would later trip over: an unknown tool, provider
or completion check, or a malformed approval rule.

An agent's approval rules add to the tools' own (see ``runs.models.Agent``);
only a user with ``LOOSEN_PERMISSION`` may make them replace the tools'
rules, and is recorded as the one who granted that.

Messages are in the active language (gettext at the time of the check): the
admin's and the pages' language, English under ``/api/``
(``config.middleware.ApiInEnglishMiddleware``). Error codes do not change.
"""

from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from runs.engine import completion
from runs.errors import InvalidInput
from runs.models import Agent
from runs.providers.registry import model_config_problems
from tools.policy import InvalidRule, check_rule
from tools.registry import get_tool, tools_named

MAX_TURNS_LIMIT = 1000
# Largest value of each optional budget (null: no limit); see runs.engine.budgets.
BUDGET_LIMITS = {
    "max_model_calls": 100_000,
    "max_total_tokens": 10**12,
    "max_cost_usd": Decimal("100000"),
    "deadline_s": 30 * 24 * 3600,
}
LOOSEN_PERMISSION = "runs.loosen_approval_policy"


def may_loosen_policy(user) -> bool:
    """Whether ``user`` (or None) may let an agent's approval rules replace the tools' own."""
    return user is not None and user.is_authenticated and user.has_perm(LOOSEN_PERMISSION)


def _unknown_tool(name) -> str:
    return _("Unknown tool %(tool)s.") % {"tool": repr(name)}


def _slug_taken(slug: str) -> str:
    return _("An agent with slug %(slug)s already exists.") % {"slug": repr(slug)}


def _policy_errors(approval_policy, may_loosen: bool) -> list[str]:
    if not isinstance(approval_policy, dict):
        return [_("The approval policy must be an object mapping tool names to rules.")]
    errors = []
    for tool_name, rule in approval_policy.items():
        tool = get_tool(tool_name)
        if tool is None:
            errors.append(_unknown_tool(tool_name))
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
    *, model, tools: list, approval_policy, completion_check: str, may_loosen: bool = False
) -> dict[str, list[str]]:
    """Problems with an agent's model config, tools, approval policy and completion check, by field.

    ``may_loosen``: the user holds ``LOOSEN_PERMISSION`` (else a ``never``
    rule for a tool that asks for approval is refused as pointless).
    """
    errors: dict[str, list[str]] = {}
    unknown = [tool for tool in tools if not tools_named(tool)]
    if unknown:
        errors["tools"] = [_unknown_tool(tool) for tool in unknown]
    if completion_check not in completion.check_names():
        errors["completion_check"] = [
            _("Unknown completion check %(check)s; known: %(known)s.")
            % {"check": repr(completion_check), "known": ", ".join(completion.check_names())}
        ]
    policy_errors = _policy_errors(approval_policy, may_loosen)
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
    """Validate an agent definition and save it.

    ``tools`` None or empty means no tools at all (stored as ``[]``), never
    every registered tool;
    ``max_turns``, ``completion_check`` and ``approval_policy`` fall back to
    the model defaults. The budgets (``max_model_calls``,
    ``max_total_tokens``, ``max_cost_usd`` in US dollars, ``deadline_s``
    in seconds) are None for the defaults, else bounded by ``BUDGET_LIMITS``.
    ``user`` is who creates it: if they hold ``LOOSEN_PERMISSION``, a
    non-empty ``approval_policy`` replaces the tools' rules and they are
    recorded as its grantor; otherwise (and with no user) it can only add
    approvals. Raises ``InvalidInput`` (``details``: messages by field) naming each bad field.
    """
    budgets = {"max_model_calls": max_model_calls, "max_total_tokens": max_total_tokens,
               "max_cost_usd": max_cost_usd, "deadline_s": deadline_s}
    tools = list(tools or [])
    approval_policy = approval_policy or {}
    completion_check = completion_check or "default"
    max_turns = Agent._meta.get_field("max_turns").default if max_turns is None else max_turns

    errors: dict[str, list[str]] = {}
    try:
        validate_slug(slug)
    except ValidationError as exc:
        errors["slug"] = exc.messages
    if not errors.get("slug") and Agent.objects.filter(slug=slug).exists():
        errors["slug"] = [_slug_taken(slug)]
    if not (name or "").strip():
        errors["name"] = [_("The name must not be empty.")]
    if not isinstance(max_turns, int) or not 1 <= max_turns <= MAX_TURNS_LIMIT:
        errors["max_turns"] = [_("max_turns must be an integer from 1 to %(high)s.") % {"high": MAX_TURNS_LIMIT}]
    errors.update(_budget_errors(budgets))
    may_loosen = may_loosen_policy(user)
    errors.update(config_errors(model=model, tools=tools, approval_policy=approval_policy,
                                completion_check=completion_check, may_loosen=may_loosen))
    if errors:
        raise InvalidInput.for_fields(errors)

    try:
        with transaction.atomic():
            return Agent.objects.create(
                slug=slug, name=name.strip(), instructions=instructions or "", model=model, tools=tools,
                max_turns=max_turns, completion_check=completion_check, approval_policy=approval_policy,
                **budgets,
                approval_policy_granted_by=user if may_loosen and approval_policy else None,
            )
    except IntegrityError:
        raise InvalidInput.for_fields({"slug": [_slug_taken(slug)]}) from None
