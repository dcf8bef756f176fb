"""Run budgets and the price of model usage.

Checked by the loop before every model call (docs/design.md#budgets). The limits
live on the agent; ``None`` means no limit:

* ``max_turns`` — model turns that counted (``Run.model_calls``);
* ``max_model_calls`` — every model call, including failed and discarded
  ones (the run's ``Step`` rows); never unlimited: ``None`` means
  ``TOLLGATE["DEFAULT_MAX_MODEL_CALLS"]``;
* ``max_total_tokens`` — ``Run.input_tokens + Run.output_tokens``;
* ``max_cost_usd`` — ``Run.cost_usd`` (US dollars, priced per call by
  ``TOLLGATE["MODEL_PRICES"]``);
* ``deadline_s`` — seconds since ``Run.started_at`` (wall clock).

A budget is exhausted when the usage so far has reached the limit, so one
call may overshoot a token or cost limit; the next one is refused.
"""

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from runs.models import FailureType, Run

MILLION = Decimal(1_000_000)


def model_price(model_config: dict) -> dict | None:
    """``{"input_per_mtok", "output_per_mtok"}`` (USD) for an agent's model, or None if unpriced."""
    return settings.TOLLGATE.get("MODEL_PRICES", {}).get((model_config or {}).get("model", ""))


def cost_usd(model_config: dict, *, input_tokens: int, output_tokens: int) -> Decimal:
    """The price of one call in US dollars (6 decimal places); 0 for an unpriced model."""
    price = model_price(model_config)
    if price is None:
        return Decimal(0)
    cost = (Decimal(str(price["input_per_mtok"])) * input_tokens
            + Decimal(str(price["output_per_mtok"])) * output_tokens) / MILLION
    return cost.quantize(Decimal("0.000001"))


def max_model_calls(agent) -> int:
    """The agent's ``max_model_calls``, or ``TOLLGATE["DEFAULT_MAX_MODEL_CALLS"]`` when it sets none."""
    if agent.max_model_calls is not None:
        return agent.max_model_calls
    return settings.TOLLGATE["DEFAULT_MAX_MODEL_CALLS"]


def exhausted_budget(run: Run, *, steps: int) -> tuple[str, str] | None:
    """``(failure_type, message)`` for the first exhausted budget of ``run``, else None.

    ``failure_type`` is ``budget_exhausted`` (the message names the
    budget, its limit and the usage) or ``deadline_exceeded``. ``steps``
    is the run's number of ``Step`` rows (the loop keeps count).
    """
    agent = run.agent
    used_tokens = run.input_tokens + run.output_tokens
    checks = [
        ("max_turns", agent.max_turns, run.model_calls, "model turns"),
        ("max_model_calls", max_model_calls(agent), steps, "model calls"),
        ("max_total_tokens", agent.max_total_tokens, used_tokens, "tokens"),
    ]
    for name, limit, used, unit in checks:
        if limit is not None and used >= limit:
            return FailureType.BUDGET_EXHAUSTED, f"Budget {name} ({limit}) exhausted: {used} {unit} used."
    if agent.max_cost_usd is not None:
        if model_price(agent.model) is None:
            return FailureType.BUDGET_EXHAUSTED, (
                f"Budget max_cost_usd ({agent.max_cost_usd}) cannot be enforced: no price for model "
                f"{agent.model.get('model')!r} in TOLLGATE['MODEL_PRICES'].")
        if run.cost_usd >= agent.max_cost_usd:
            return FailureType.BUDGET_EXHAUSTED, (
                f"Budget max_cost_usd ({agent.max_cost_usd}) exhausted: {run.cost_usd} USD used.")
    return deadline_passed(run)


def deadline_of(run: Run):
    """When ``run`` passes its agent's ``deadline_s`` (an aware datetime), or None (no deadline, not started)."""
    if run.agent.deadline_s is None or run.started_at is None:
        return None
    return run.started_at + timedelta(seconds=run.agent.deadline_s)


def deadline_passed(run: Run, *, now=None) -> tuple[str, str] | None:
    """``("deadline_exceeded", message)`` once ``agent.deadline_s`` seconds have passed since the start (at ``now``)."""
    deadline = deadline_of(run)
    if deadline is not None and (now or timezone.now()) >= deadline:
        return FailureType.DEADLINE_EXCEEDED, (
            f"Deadline deadline_s ({run.agent.deadline_s}s) exceeded: the run started at "
            f"{run.started_at.isoformat()}.")
    return None
