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
  one per idempotency key (``transfers()``), as an external system would
  keep them, in a ledger outside the process that made them (see below).
  Its precondition (checked when a call is
  proposed and again just before it runs) denies a transfer that would take
  an account's transfers past its limit (``ACCOUNT_LIMIT``, 100, unless
  ``set_account_limit`` set another): "Account acme cannot take 500: at
  most 100.00 more can be transferred to it." Its reconcile hook
  answers from the same record: ``succeeded`` with the transfer made under
  the key, else ``not_found``. After ``time_out_after_commit(n)`` its next
  ``n`` calls make their transfer and then raise ``ToolTimeout``, as a bank
  that committed but did not answer in time (the outcome is unknown);
  ``slow_down(s)`` makes each call answer ``s`` seconds after the bank made its transfer,
  ``stall(n)`` lets the bank make ``n`` more transfers and leaves every
  call hanging; ``transfer_requests()`` counts the calls per key.

More are defined but not registered (a test registers them where it needs them): ``fake_notice``
(a side effect that always asks a person), ``fake_wait`` (``{"seconds": number}``, an ``async def``
handler that answers that late: a run waiting on it holds no thread), ``fake_sleep`` (the same from a
sync handler, in a pool thread) and ``fake_crash_off_loop`` (kills its worker from ``asyncio.to_thread``).

The ledger (transfers, requests, limits, hidden keys, faults to come) is a
SQLite file named by ``FAKE_TOOLS_LEDGER``: the test process makes one when
this module is imported and names it in its environment, so the worker
processes it starts (``worker_process`` in ``tests/conftest.py``) share it,
and a worker killed with SIGKILL cannot take its transfers along.
``FAKE_TRANSFER_TIMEOUT_S`` sets ``fake_transfer``'s timeout (30 s).

The completion check ``fake_transfer`` (registered with the tools) judges a
run by its transfers: achieved once one succeeded, not achieved when one
was rejected, denied or expired and none succeeded, else incomplete.

The ``people`` fixture (``tests/conftest.py``) gives such tests users
without the demo data; ``tests.support.core`` has the helpers (calls,
agents) of the tests that use these tools.
"""

import asyncio
import atexit
import contextlib
import dataclasses
import json
import os
import sqlite3
import tempfile
import threading
import time
from decimal import Decimal

from django.apps import AppConfig

from tools.registry import Reconciliation, Tool, ToolTimeout, ToolUnavailable, register

ACCOUNT_LIMIT = Decimal(100)  # what all the transfers to one account may add up to, unless set otherwise
LEDGER_ENV = "FAKE_TOOLS_LEDGER"  # the ledger's path, shared with the processes this one starts
_LOCK = threading.Lock()
_LOCAL = threading.local()
_SCHEMA = """
CREATE TABLE IF NOT EXISTS transfers (key TEXT PRIMARY KEY, transfer_id INTEGER NOT NULL, account TEXT NOT NULL,
                                      amount TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (key TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS limits (account TEXT PRIMARY KEY, amount TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hidden (key TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS knobs (name TEXT PRIMARY KEY, value REAL);
"""


def _ledger_path() -> str:
    """The ledger's path (``FAKE_TOOLS_LEDGER``); the first process without one makes a file of its own, names it
    in its environment (its child processes inherit it) and removes it when it exits."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        handle, path = tempfile.mkstemp(prefix="tollgate-fake-tools-", suffix=".sqlite3")
        os.close(handle)
        os.environ[LEDGER_ENV] = path
        owner = os.getpid()  # not a forked child's to remove
        atexit.register(lambda: [os.remove(p) for p in (path, path + "-wal", path + "-shm")
                                 if os.getpid() == owner and os.path.exists(p)])
    return path


_ledger_path()  # before any worker process is started, so that it inherits the path


def _connection() -> sqlite3.Connection:
    """This thread's connection to the ledger (made, with the tables, on first use in each thread and process)."""
    if getattr(_LOCAL, "pid", None) != os.getpid():
        connection = sqlite3.connect(_ledger_path(), timeout=60, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.executescript(_SCHEMA)
        _LOCAL.connection, _LOCAL.pid = connection, os.getpid()
    return _LOCAL.connection


@contextlib.contextmanager
def _ledger():
    """A write transaction on the ledger (``BEGIN IMMEDIATE``: one writer at a time across processes)."""
    connection = _connection()
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _rows(sql: str, *params) -> list[tuple]:
    return _connection().execute(sql, params).fetchall()


def _knob(name: str, default=0):
    found = _rows("SELECT value FROM knobs WHERE name = ?", name)
    return found[0][0] if found and found[0][0] is not None else default


def _set_knob(name: str, value) -> None:
    with _ledger() as ledger:
        ledger.execute("INSERT OR REPLACE INTO knobs (name, value) VALUES (?, ?)", (name, value))


def _as_transfer(row: tuple) -> dict:
    return {"transfer_id": row[0], "account": row[1], "amount": json.loads(row[2])}


def _limit(account: str) -> Decimal:
    found = _rows("SELECT amount FROM limits WHERE account = ?", account)
    return Decimal(found[0][0]) if found else ACCOUNT_LIMIT


def _transferred(account: str) -> Decimal:
    return sum((Decimal(str(t["amount"])) for t in transfers() if t["account"] == account), Decimal(0))


def _lookup(ctx, args: dict) -> dict:
    return {"key": args["key"], "value": f"value of {args['key']}", "transferred": f"{_transferred(args['key']):.2f}"}


def _lookup_precondition(ctx, args: dict) -> str | None:
    hidden = bool(_rows("SELECT 1 FROM hidden WHERE key = ?", args["key"]))
    return f"Key {args['key']} is hidden from the requester." if hidden else None


def _transfer(ctx, args: dict) -> dict:
    key = ctx.idempotency_key
    with _ledger() as ledger:
        ledger.execute("INSERT INTO requests (key, count) VALUES (?, 1) "
                       "ON CONFLICT (key) DO UPDATE SET count = count + 1", (key,))
        stall_s = _knob("stall_s", None)
        new = ledger.execute("SELECT 1 FROM transfers WHERE key = ?", (key,)).fetchone() is None
        if new and (stall_s is None or _knob("stall_left") > 0):
            count, = ledger.execute("SELECT count(*) FROM transfers").fetchone()
            ledger.execute("INSERT INTO transfers VALUES (?, ?, ?, ?)",
                           (key, count + 1, args["account"], json.dumps(args["amount"])))
            ledger.execute("UPDATE knobs SET value = value - 1 WHERE name = 'stall_left'")
        made = ledger.execute("SELECT transfer_id, account, amount FROM transfers WHERE key = ?", (key,)).fetchone()
        timed_out = _knob("timeouts_after_commit") > 0
        ledger.execute("UPDATE knobs SET value = max(0, value - 1) WHERE name = 'timeouts_after_commit'")
    time.sleep(_knob("delay_s"))  # made (or refused) at once, answered late: a slow bank
    if stall_s is not None:
        time.sleep(stall_s)
    if timed_out or stall_s is not None:
        raise ToolTimeout("The bank did not answer in time.")
    return _as_transfer(made)


def _transfer_precondition(ctx, args: dict) -> str | None:
    room = _limit(args["account"]) - _transferred(args["account"])
    if Decimal(str(args["amount"])) > room:
        return (f"Account {args['account']} cannot take {args['amount']}: "
                f"at most {room:.2f} more can be transferred to it.")
    return None


def _reconcile_transfer(idempotency_key: str) -> Reconciliation:
    made = transfer_made_under(idempotency_key)
    return Reconciliation("succeeded", result=made) if made else Reconciliation("not_found")


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
    """Every transfer ``fake_transfer`` made, in this process or another, oldest first."""
    rows = _rows("SELECT transfer_id, account, amount FROM transfers ORDER BY transfer_id")
    return [_as_transfer(row) for row in rows]


def set_account_limit(account: str, limit) -> None:
    """Let the transfers to ``account`` add up to ``limit`` (a number) rather than ``ACCOUNT_LIMIT``."""
    with _ledger() as ledger:
        ledger.execute("INSERT OR REPLACE INTO limits (account, amount) VALUES (?, ?)",
                       (account, str(Decimal(str(limit)))))


def hide_key(key: str) -> None:
    """Make ``fake_lookup``'s precondition deny ``key`` from now on."""
    with _ledger() as ledger:
        ledger.execute("INSERT OR IGNORE INTO hidden (key) VALUES (?)", (key,))


def time_out_after_commit(count: int = 1) -> None:
    """Make the next ``count`` calls of ``fake_transfer`` raise ``ToolTimeout`` after making their transfer."""
    _set_knob("timeouts_after_commit", count)


def slow_down(seconds: float) -> None:
    """Make every call of ``fake_transfer`` (in any process) answer ``seconds`` after the bank made its transfer."""
    _set_knob("delay_s", seconds)


def stall(made: int | None, seconds: float = 600) -> None:
    """Make the bank stall, for the calls of ``fake_transfer`` in any process: it makes at most ``made`` more
    transfers, and every call, whether its transfer was made or not, hangs ``seconds`` and then raises
    ``ToolTimeout`` (an answer that never came). ``made=None``: the bank answers again."""
    with _ledger() as ledger:
        for name, value in (("stall_left", made), ("stall_s", seconds if made is not None else None)):
            ledger.execute("INSERT OR REPLACE INTO knobs (name, value) VALUES (?, ?)", (name, value))


def transfer_requests() -> dict[str, int]:
    """``{idempotency key: calls of fake_transfer that reached the bank}``, in any process, faulted ones too."""
    return dict(_rows("SELECT key, count FROM requests"))


def forget_transfers() -> None:
    """Start over with no transfers, every account at ``ACCOUNT_LIMIT``, no hidden key and no timeout to come
    (between tests)."""
    with _ledger() as ledger:
        for table in ("transfers", "requests", "limits", "hidden", "knobs"):
            ledger.execute(f"DELETE FROM {table}")  # noqa: S608 (the tables' own names)


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
    timeout_s=float(os.environ.get("FAKE_TRANSFER_TIMEOUT_S", "30")),
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




async def _wait(ctx, args: dict) -> dict:
    await asyncio.sleep(args["seconds"])
    return {"waited": args["seconds"]}


FAKE_WAIT = Tool(
    name="fake_wait",
    description="Answer after some seconds, awaited on the engine's loop (a test tool; not registered: a test "
                "adds it to the registry itself).",
    parameters={"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 60}},
                "required": ["seconds"], "additionalProperties": False},
    handler=_wait,
    timeout_s=60,
)


def _sleep(ctx, args: dict) -> dict:
    time.sleep(args["seconds"])
    return {"slept": args["seconds"]}


FAKE_SLEEP = Tool(
    name="fake_sleep",
    description="A sync handler that answers after some seconds, in a pool thread (a test tool; not registered).",
    parameters={"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 60}},
                "required": ["seconds"], "additionalProperties": False},
    handler=_sleep,
    timeout_s=60,
)


def _die() -> None:
    import signal
    time.sleep(0.2)  # the work that ends in the crash (parsing, say) takes a moment
    os.kill(os.getpid(), signal.SIGKILL)


async def _crash_off_loop(ctx, args: dict) -> dict:
    """An async handler that does its heavy work off the loop, as asyncio.to_thread is meant for (a C library
    parsing an untrusted file, say), and that work kills the process."""
    await asyncio.sleep(0.5)
    await asyncio.to_thread(_die)
    return {}


FAKE_CRASH_OFF_LOOP = Tool(
    name="fake_crash_off_loop",
    description="Kill the process from asyncio.to_thread (a test tool; not registered).",
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
    handler=_crash_off_loop,
    timeout_s=60,
)


def transfer_made_under(idempotency_key: str) -> dict | None:
    """The transfer ``fake_transfer`` made under ``idempotency_key`` (as ``transfers()`` lists it), or None."""
    made = _rows("SELECT transfer_id, account, amount FROM transfers WHERE key = ?", idempotency_key)
    return _as_transfer(made[0]) if made else None



def transfer_keys() -> list[str]:
    """The idempotency keys of the transfers ``fake_transfer`` made, oldest first (one per key)."""
    return [key for key, in _rows("SELECT key FROM transfers ORDER BY transfer_id")]


class TransferBank:
    """``fake_transfer``'s handler as a bank whose answers a test scripts, the way the demo's gateway takes
    faults (``tests.demo.gateway``); ``transfer_bank`` installs it.

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
        limit = _limit(account)
        asked = sum((Decimal(str(arguments.get("amount", 0))) for arguments in group), Decimal(0))
        left = limit - _transferred(account)
        fit = asked <= left
        verdicts.append(Together(fit, f"{len(group)} pending transfers ask {asked:.2f}; "
                                      f"{'' if fit else 'only '}{left:.2f} can be transferred: "
                                      f"{'all' if fit else 'not all'} can be made"))
    return verdicts



def register_test_tools(names: list[str]) -> None:
    """Register the tools of this module named ``names`` that ``FakeToolsConfig`` leaves out (``fake_notice``),
    in a worker process whose test registered them in its own process; ``KeyError`` for a name it does not define."""
    defined = {tool.name: tool for tool in globals().values() if isinstance(tool, Tool)}
    for name in names:
        register(defined[name])
