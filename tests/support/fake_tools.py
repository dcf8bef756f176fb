"""Two small tools of the tests' own, for tests about the core rather than the demo shop.

The test settings install this module as an app (``tests.support.fake_tools.FakeToolsConfig``,
label ``fake_tools``): it registers its tools from ``ready``, the way any
plug-in does, so the core sees them exactly as it sees the demo's.

* ``fake_lookup`` (read-only, never approved): ``{"key": str}`` ->
  ``{"key", "value", "transferred"}``, the value made from the key and what
  was transferred so far to the account named by the key ("0.00"). Its
  precondition denies a key hidden with ``hide_key`` ("Key a is hidden from
  the requester."), as an owner would hide a record;
* ``fake_transfer`` (side effect, idempotent; approval when ``amount`` is
  over 10; ``account`` is its target): ``{"account": str, "amount":
  number}`` -> ``{"transfer_id", "account", "amount"}``. Transfers are kept
  in this process, one per idempotency key (``transfers()``), as an
  external system would keep them. Its precondition (checked when a call is
  proposed and again just before it runs) denies a transfer that would take
  an account's transfers past its limit (``ACCOUNT_LIMIT``, 100, unless
  ``set_account_limit`` set another): "Account acme cannot take 500: at
  most 100.00 more can be transferred to it." Its reconcile hook
  answers from the same record: ``succeeded`` with the transfer made under
  the key, else ``not_found``. After ``time_out_after_commit(n)`` its next
  ``n`` calls make their transfer and then raise ``ToolTimeout``, as a bank
  that committed but did not answer in time (the outcome is unknown).

The completion check ``fake_transfer`` (registered with the tools) judges a
run by its transfers: achieved once one succeeded, not achieved when one
was rejected, denied or expired and none succeeded, else incomplete.

The ``people`` fixture (``tests/conftest.py``) gives such tests users
without the demo data; ``tests.support.core`` has the helpers (calls,
agents) of the tests that use these tools.
"""

import threading
from decimal import Decimal

from django.apps import AppConfig

from tools.registry import Reconciliation, Tool, ToolTimeout, register

ACCOUNT_LIMIT = Decimal(100)  # what all the transfers to one account may add up to, unless set otherwise
_TRANSFERS: dict[str, dict] = {}
_LIMITS: dict[str, Decimal] = {}
_HIDDEN: set[str] = set()
_TIMEOUTS_AFTER_COMMIT = [0]  # how many of the next transfers time out once made
_LOCK = threading.Lock()


def _transferred(account: str) -> Decimal:
    return sum((Decimal(str(t["amount"])) for t in transfers() if t["account"] == account), Decimal(0))


def _lookup(ctx, args: dict) -> dict:
    return {"key": args["key"], "value": f"value of {args['key']}", "transferred": f"{_transferred(args['key']):.2f}"}


def _lookup_precondition(ctx, args: dict) -> str | None:
    with _LOCK:
        hidden = args["key"] in _HIDDEN
    return f"Key {args['key']} is hidden from the requester." if hidden else None


def _transfer(ctx, args: dict) -> dict:
    with _LOCK:
        if ctx.idempotency_key not in _TRANSFERS:
            _TRANSFERS[ctx.idempotency_key] = {"transfer_id": len(_TRANSFERS) + 1, "account": args["account"],
                                               "amount": args["amount"]}
        made = dict(_TRANSFERS[ctx.idempotency_key])
        timed_out, _TIMEOUTS_AFTER_COMMIT[0] = _TIMEOUTS_AFTER_COMMIT[0] > 0, max(0, _TIMEOUTS_AFTER_COMMIT[0] - 1)
    if timed_out:
        raise ToolTimeout("The bank did not answer in time.")
    return made


def _transfer_precondition(ctx, args: dict) -> str | None:
    with _LOCK:
        limit = _LIMITS.get(args["account"], ACCOUNT_LIMIT)
    room = limit - _transferred(args["account"])
    if Decimal(str(args["amount"])) > room:
        return (f"Account {args['account']} cannot take {args['amount']}: "
                f"at most {room:.2f} more can be transferred to it.")
    return None


def _reconcile_transfer(idempotency_key: str) -> Reconciliation:
    with _LOCK:
        made = _TRANSFERS.get(idempotency_key)
    return Reconciliation("succeeded", result=dict(made)) if made else Reconciliation("not_found")


def transfer_done(run):
    """The completion check ``fake_transfer``: a ``runs.engine.completion`` verdict from the run's transfers."""
    from runs.engine.completion import achieved, incomplete, not_achieved
    from tools.models import ToolCallStatus as S

    statuses = set(run.tool_calls.filter(name="fake_transfer").values_list("status", flat=True))
    if S.SUCCEEDED in statuses:
        return achieved()
    if statuses & {S.REJECTED, S.DENIED, S.EXPIRED}:
        return not_achieved("The transfer was rejected or refused.")
    return incomplete("No transfer has been made: call fake_transfer, or explain why not.")


def transfers() -> list[dict]:
    """Every transfer ``fake_transfer`` made in this process, oldest first."""
    with _LOCK:
        return [dict(transfer) for transfer in _TRANSFERS.values()]


def set_account_limit(account: str, limit) -> None:
    """Let the transfers to ``account`` add up to ``limit`` (a number) rather than ``ACCOUNT_LIMIT``."""
    with _LOCK:
        _LIMITS[account] = Decimal(str(limit))


def hide_key(key: str) -> None:
    """Make ``fake_lookup``'s precondition deny ``key`` from now on."""
    with _LOCK:
        _HIDDEN.add(key)


def time_out_after_commit(count: int = 1) -> None:
    """Make the next ``count`` calls of ``fake_transfer`` raise ``ToolTimeout`` after making their transfer."""
    with _LOCK:
        _TIMEOUTS_AFTER_COMMIT[0] = count


def forget_transfers() -> None:
    """Start over with no transfers, every account at ``ACCOUNT_LIMIT``, no hidden key and no timeout to come
    (between tests)."""
    with _LOCK:
        _TRANSFERS.clear()
        _LIMITS.clear()
        _HIDDEN.clear()
        _TIMEOUTS_AFTER_COMMIT[0] = 0


FAKE_LOOKUP = Tool(
    name="fake_lookup",
    description="Look a key up (a test tool).",
    parameters={"type": "object", "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 100}},
                "required": ["key"], "additionalProperties": False},
    handler=_lookup,
    precondition=_lookup_precondition,
)
FAKE_TRANSFER = Tool(
    name="fake_transfer",
    description="Transfer an amount to an account (a test tool).",
    parameters={"type": "object",
                "properties": {"account": {"type": "string", "minLength": 1, "maxLength": 100},
                               "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000}},
                "required": ["account", "amount"], "additionalProperties": False},
    handler=_transfer,
    precondition=_transfer_precondition,
    side_effect=True,
    approval="amount > 10",
    target_key="account",
    idempotent=True,
    reconcile=_reconcile_transfer,
)
FAKE_TOOLS = (FAKE_LOOKUP, FAKE_TRANSFER)


class FakeToolsConfig(AppConfig):
    """Registers ``FAKE_TOOLS`` and the completion check ``fake_transfer`` when Django starts."""

    name = "tests.support.fake_tools"
    label = "fake_tools"
    verbose_name = "Test tools"

    def ready(self):
        from runs.engine.completion import register_check

        for tool in FAKE_TOOLS:
            register(tool)
        register_check("fake_transfer")(transfer_done)


# --- added for tests/attack ---

FAKE_NOTICE = Tool(
    name="fake_notice",
    description="Send a notice by mail (a test tool; not registered: a test adds it to the registry itself).",
    parameters={"type": "object",
                "properties": {"to": {"type": "string", "format": "email"},
                               "subject": {"type": "string", "format": "header-text", "minLength": 1,
                                           "maxLength": 200},
                               "body": {"type": "string", "minLength": 1, "maxLength": 2000}},
                "required": ["to", "subject", "body"], "additionalProperties": False},
    handler=lambda ctx, args: {"sent": True, "to": args["to"]},
    side_effect=True,
    approval="always",
)


# --- added for tests/api ---


def transfer_made_under(idempotency_key: str) -> dict | None:
    """The transfer ``fake_transfer`` made under ``idempotency_key`` (as ``transfers()`` lists it), or None."""
    with _LOCK:
        made = _TRANSFERS.get(idempotency_key)
    return dict(made) if made else None


# --- added for tests/engine ---

def transfer_keys() -> list[str]:
    """The idempotency keys of the transfers ``fake_transfer`` made in this process, oldest first (one per key)."""
    with _LOCK:
        return list(_TRANSFERS)


class TransferBank:
    """``fake_transfer``'s handler as a bank whose answers a test scripts, the way the demo's gateway takes
    faults (``tests.support.gateway``); ``transfer_bank`` installs it.

    * ``sends``: ``{idempotency key: calls that reached the bank}``, the faulted ones too;
    * ``script(*faults)``: the next calls meet these faults, one each, in order; ``always``: the fault every
      other call meets (None: none); ``delay_s``: seconds each call takes before its answer.

    Faults: ``"unavailable"`` (``ToolUnavailable``, nothing transferred: a 5xx answer) and ``"late"``
    (``ToolTimeout``, nothing transferred: a refusal that came after the client's timeout). A transfer made
    and then timed out is ``time_out_after_commit``.
    """

    def __init__(self):
        self.sends: dict[str, int] = {}
        self.always: str | None = None
        self.delay_s = 0.0
        self._faults: list[str] = []

    def script(self, *faults: str) -> None:
        """The next ``len(faults)`` calls meet ``faults``, in order."""
        with _LOCK:
            self._faults = list(faults)

    def handler(self, ctx, args: dict) -> dict:
        """The tool's handler: counts the send, waits ``delay_s``, meets its fault or transfers."""
        import time

        from tools.registry import ToolUnavailable

        with _LOCK:
            self.sends[ctx.idempotency_key] = self.sends.get(ctx.idempotency_key, 0) + 1
            fault = self._faults.pop(0) if self._faults else self.always
        time.sleep(self.delay_s)
        if fault == "unavailable":
            raise ToolUnavailable("The bank answered 503; nothing was transferred.")
        if fault == "late":
            raise ToolTimeout("The bank did not answer in time.")
        return _transfer(ctx, args)


def transfer_bank(monkeypatch, **changes) -> TransferBank:
    """A new ``TransferBank`` whose handler the registry's ``fake_transfer`` uses for this test (``monkeypatch``);
    ``changes``: other fields of the tool replaced too (e.g. ``reconcile``, ``timeout_s``)."""
    import dataclasses

    from tools import registry

    bank = TransferBank()
    monkeypatch.setitem(registry._TOOLS, "fake_transfer",
                        dataclasses.replace(FAKE_TRANSFER, handler=bank.handler, **changes))
    return bank


def judge_transfers(groups: list[list[dict]]) -> list:
    """A ``judge_together`` hook for ``fake_transfer`` (install it with ``transfer_bank(monkeypatch,
    judge_together=judge_transfers)``): per group of pending transfers to one account, whether all fit in
    what the account can still take ("3 pending transfers ask 240.00; only 100.00 can be transferred: not all
    can be made")."""
    from tools.registry import Together

    verdicts = []
    for group in groups:
        account = group[0].get("account")
        with _LOCK:
            limit = _LIMITS.get(account, ACCOUNT_LIMIT)
        asked = sum((Decimal(str(arguments.get("amount", 0))) for arguments in group), Decimal(0))
        left = limit - _transferred(account)
        fit = asked <= left
        verdicts.append(Together(fit, f"{len(group)} pending transfers ask {asked:.2f}; "
                                      f"{'' if fit else 'only '}{left:.2f} can be transferred: "
                                      f"{'all' if fit else 'not all'} can be made"))
    return verdicts
