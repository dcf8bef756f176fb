"""Two small tools of the tests' own, for tests about the core rather than the demo shop.

The test settings install this module as an app (``tests.support.fake_tools.FakeToolsConfig``,
label ``fake_tools``): it registers its tools from ``ready``, the way any
plug-in does, so the core sees them exactly as it sees the demo's.

* ``fake_lookup`` (read-only, never approved): ``{"key": str}`` ->
  ``{"key", "value"}``, the value made from the key;
* ``fake_transfer`` (side effect, idempotent; approval when ``amount`` is
  over 10; ``account`` is its target): ``{"account": str, "amount":
  number}`` -> ``{"transfer_id", "account", "amount"}``. Transfers are kept
  in this process, one per idempotency key (``transfers()``), as an
  external system would keep them.

The ``people`` fixture (``tests/conftest.py``) gives such tests users
without the demo data.
"""

import threading

from django.apps import AppConfig

from tools.registry import Tool, register

_TRANSFERS: dict[str, dict] = {}
_LOCK = threading.Lock()


def _lookup(ctx, args: dict) -> dict:
    return {"key": args["key"], "value": f"value of {args['key']}"}


def _transfer(ctx, args: dict) -> dict:
    with _LOCK:
        if ctx.idempotency_key not in _TRANSFERS:
            _TRANSFERS[ctx.idempotency_key] = {"transfer_id": len(_TRANSFERS) + 1, "account": args["account"],
                                               "amount": args["amount"]}
        return dict(_TRANSFERS[ctx.idempotency_key])


def transfers() -> list[dict]:
    """Every transfer ``fake_transfer`` made in this process, oldest first."""
    with _LOCK:
        return [dict(transfer) for transfer in _TRANSFERS.values()]


def forget_transfers() -> None:
    """Start over with no transfers (between tests)."""
    with _LOCK:
        _TRANSFERS.clear()


FAKE_LOOKUP = Tool(
    name="fake_lookup",
    description="Look a key up (a test tool).",
    parameters={"type": "object", "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 100}},
                "required": ["key"], "additionalProperties": False},
    handler=_lookup,
)
FAKE_TRANSFER = Tool(
    name="fake_transfer",
    description="Transfer an amount to an account (a test tool).",
    parameters={"type": "object",
                "properties": {"account": {"type": "string", "minLength": 1, "maxLength": 100},
                               "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000}},
                "required": ["account", "amount"], "additionalProperties": False},
    handler=_transfer,
    side_effect=True,
    approval="amount > 10",
    target_key="account",
    idempotent=True,
)
FAKE_TOOLS = (FAKE_LOOKUP, FAKE_TRANSFER)


class FakeToolsConfig(AppConfig):
    """Registers ``FAKE_TOOLS`` when Django starts."""

    name = "tests.support.fake_tools"
    label = "fake_tools"
    verbose_name = "Test tools"

    def ready(self):
        for tool in FAKE_TOOLS:
            register(tool)
