"""The demo payment gateway: a separate HTTP service with its own ledger.

Run: ``python -m tools.demo.gateway_server --port 8765 --ledger var/gateway.sqlite3``.
It stands in for a real payment provider, so it knows nothing of Django or
Tollgate and keeps its ledger in its own SQLite file.

API (JSON):

* ``POST /refunds`` ``{"order_id": int, "amount": "12.50"}`` with an
  ``Idempotency-Key`` header -> 201 and the refund; the same key again ->
  200 and the first refund (never a second charge); no key -> 400.
* ``GET /refunds/<key>`` -> 200 and the refund, or 404 (reconciliation).
* ``GET /refunds?order_id=N`` -> ``{"refunds": [...], "total": "..."}``;
  ``&since=T`` (seconds since the epoch) counts only refunds made at or after T.
* ``GET /ledger`` -> every refund and, per key, how many requests came.
* ``POST /faults`` -> set fault injection for ``POST /refunds``:
  ``{"latency_s": float, "hang_s": float, "p_timeout_after_commit": float,
  "p_error_before_commit": float, "p_crash_after_commit": float,
  "script": ["ok" | "timeout_after_commit" | "error_before_commit" |
  "crash_after_commit", ...]}``. ``script`` entries are used first, one per
  request, then the probabilities. "timeout after commit" commits the
  charge, then waits ``hang_s`` before answering (longer than the
  client's timeout); "error before commit" answers 503 without charging;
  "crash after commit" commits and kills the process.
* ``POST /reset`` -> empty ledger, no faults. ``GET /health`` -> 200.

``/faults`` and ``/reset`` are test controls: they answer only requests
from a loopback address (403 otherwise), whatever ``--host`` says.
"""

import argparse
import ipaddress
import json
import os
import random
import sqlite3
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

SCHEMA = """
CREATE TABLE IF NOT EXISTS refunds (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    order_id INTEGER NOT NULL,
    amount TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (idempotency_key TEXT NOT NULL, received_at REAL NOT NULL);
"""
NO_FAULTS = {"latency_s": 0.0, "hang_s": 30.0, "p_timeout_after_commit": 0.0,
             "p_error_before_commit": 0.0, "p_crash_after_commit": 0.0, "script": []}


class Ledger:
    """The gateway's refunds, one per idempotency key, in a SQLite file."""

    def __init__(self, path: str):
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()

    def charge(self, key: str, order_id: int, amount: Decimal) -> tuple[dict, bool]:
        """Record the refund for ``key`` unless one exists; returns (refund, created)."""
        with self.lock:
            existing = self.find(key)
            if existing:
                return existing, False
            self.db.execute("INSERT INTO refunds (idempotency_key, order_id, amount, created_at) VALUES (?, ?, ?, ?)",
                            (key, order_id, str(amount), time.time()))
            return self.find(key), True

    def note_request(self, key: str) -> None:
        """Count one refund request for ``key``, whatever became of it."""
        with self.lock:
            self.db.execute("INSERT INTO requests VALUES (?, ?)", (key, time.time()))

    def find(self, key: str) -> dict | None:
        row = self.db.execute("SELECT id, idempotency_key, order_id, amount FROM refunds WHERE idempotency_key = ?",
                              (key,)).fetchone()
        return _refund(row) if row else None

    def for_order(self, order_id: int, since: float = 0.0) -> list[dict]:
        """The refunds of ``order_id`` made at or after ``since`` (seconds since the epoch), oldest first."""
        rows = self.db.execute("SELECT id, idempotency_key, order_id, amount FROM refunds WHERE order_id = ? "
                               "AND created_at >= ? ORDER BY id", (order_id, since)).fetchall()
        return [_refund(row) for row in rows]

    def dump(self) -> dict:
        rows = self.db.execute("SELECT id, idempotency_key, order_id, amount FROM refunds ORDER BY id").fetchall()
        requests = dict(self.db.execute("SELECT idempotency_key, COUNT(*) FROM requests GROUP BY idempotency_key"))
        return {"refunds": [_refund(row) for row in rows], "requests_per_key": requests}

    def reset(self) -> None:
        with self.lock:
            self.db.execute("DELETE FROM refunds")
            self.db.execute("DELETE FROM requests")


def _refund(row) -> dict:
    return {"refund_id": row[0], "idempotency_key": row[1], "order_id": row[2], "amount": row[3]}


class GatewayHandler(BaseHTTPRequestHandler):
    """HTTP front of the ledger, with fault injection (see module doc)."""

    ledger: Ledger
    faults: dict
    # Keep-alive: a client's pooled connection serves many requests (HTTP/1.0 would close each one,
    # so every request would pay a TCP connect on both sides). Every answer carries Content-Length.
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the headers and the body are two writes; on a kept-alive connection Nagle's algorithm
    # holds the body back until the client acknowledges the headers, which it delays (~40 ms a request).
    disable_nagle_algorithm = True

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def _send(self, status: int, body: dict) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return {}

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/health":
            return self._send(200, {"ok": True})
        if url.path == "/ledger":
            return self._send(200, self.ledger.dump())
        if url.path == "/refunds":
            query = parse_qs(url.query)
            try:
                order_id = int(query["order_id"][0])
                since = float(query.get("since", ["0"])[0])
            except (KeyError, ValueError):
                return self._send(400, {"error": "order_id is required; since must be a number"})
            refunds = self.ledger.for_order(order_id, since)
            total = sum((Decimal(r["amount"]) for r in refunds), Decimal("0"))
            return self._send(200, {"refunds": refunds, "total": str(total)})
        if url.path.startswith("/refunds/"):
            found = self.ledger.find(url.path.removeprefix("/refunds/"))
            return self._send(200, found) if found else self._send(404, {"error": "no such refund"})
        return self._send(404, {"error": "not found"})

    def _from_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.client_address[0]).is_loopback
        except ValueError:
            return False

    def do_POST(self):
        path = urlparse(self.path).path
        if path in ("/faults", "/reset") and not self._from_loopback():
            return self._send(403, {"error": "test controls answer on loopback only"})
        if path == "/faults":
            type(self).faults = {**NO_FAULTS, **self._body()}
            return self._send(200, type(self).faults)
        if path == "/reset":
            self.ledger.reset()
            type(self).faults = dict(NO_FAULTS)
            return self._send(200, {"ok": True})
        if path == "/refunds":
            return self._refund()
        return self._send(404, {"error": "not found"})

    def _next_fault(self) -> str:
        faults = self.faults
        if faults["script"]:
            return faults["script"].pop(0)
        roll = random.random()
        for name in ("timeout_after_commit", "error_before_commit", "crash_after_commit"):
            if roll < faults[f"p_{name}"]:
                return name
            roll -= faults[f"p_{name}"]
        return "ok"

    def _refund(self):
        key = self.headers.get("Idempotency-Key", "").strip()
        body = self._body()
        if not key:
            return self._send(400, {"error": "Idempotency-Key header is required"})
        try:
            order_id, amount = int(body["order_id"]), Decimal(str(body["amount"]))
        except (KeyError, ValueError, ArithmeticError):
            return self._send(400, {"error": "order_id and amount are required"})
        self.ledger.note_request(key)
        fault = self._next_fault()
        time.sleep(self.faults["latency_s"])
        if fault == "error_before_commit":
            return self._send(503, {"error": "injected failure before commit"})
        refund, created = self.ledger.charge(key, order_id, amount)
        if fault == "crash_after_commit":
            os._exit(17)
        if fault == "timeout_after_commit":
            time.sleep(self.faults["hang_s"])
        return self._send(201 if created else 200, refund)


def serve(port: int, ledger_path: str, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A gateway server bound to ``host:port`` (not yet serving: call ``serve_forever``)."""
    handler = type("Handler", (GatewayHandler,), {"ledger": Ledger(ledger_path), "faults": dict(NO_FAULTS)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description="Demo payment gateway for Tollgate.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--ledger", default="gateway-ledger.sqlite3")
    args = parser.parse_args()
    server = serve(args.port, args.ledger, args.host)
    print(f"payment gateway on http://{args.host}:{server.server_port} (ledger {args.ledger})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
