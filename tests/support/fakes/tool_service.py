"""An integrator's service on loopback for the HTTP tools' tests: it verifies what it gets with ``standardwebhooks``.

``POST /tools/rooms`` (a read) answers ``{"rooms": [...]}``; ``POST
/tools/book`` (a side effect) books under the request's idempotency key
(once per key) and answers the booking; ``POST /tools/lookup`` answers
``{"status": "found", "result": booking}`` or ``{"status": "not_found"}``.
``mode`` changes the next answers of a path (``ok``, ``refuse`` (409),
``fail`` (503, nothing booked), ``slow`` (books, then answers after
``slow_s``), ``huge``, ``not_json``, ``off_schema``, ``unknown``).
Every request is recorded with whether its signature verified.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


class ToolService:
    """The service in a thread of the test process; ``base_url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, secret: str, slow_s: float = 2.0):
        self.webhook = Webhook(secret)
        self.slow_s = slow_s
        self.requests: list[dict] = []
        self.bookings: dict[str, dict] = {}
        self.modes: dict[str, str] = {}
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def mode(self, path: str, mode: str) -> None:
        """Answer ``path`` (e.g. ``/tools/book``) in ``mode`` from now on."""
        with self._lock:
            self.modes[path] = mode

    def to(self, path: str) -> list[dict]:
        """The requests received on ``path``: ``{"body", "headers", "verified"}``, in order."""
        with self._lock:
            return [r for r in self.requests if r["path"] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, path: str, body: dict) -> tuple[int, bytes, float]:
        """(status, body, seconds to wait first) for a verified request."""
        mode = self.modes.get(path, "ok")
        if mode == "refuse":
            return 409, json.dumps({"error": "Room 4 is taken that night."}).encode(), 0
        if mode == "fail":
            return 503, b"down for maintenance", 0
        if mode == "huge":
            return 200, json.dumps({"rooms": ["x" * 100] * 50_000}).encode(), 0
        if mode == "not_json":
            return 200, b"<html>hello</html>", 0
        if mode == "off_schema" and path != "/tools/lookup":
            return 200, json.dumps({"unexpected": True}).encode(), 0
        if path == "/tools/rooms":
            return 200, json.dumps({"rooms": [4, 7], "night": body["arguments"]["night"]}).encode(), 0
        if path == "/tools/book":
            with self._lock:
                booking = self.bookings.setdefault(body["idempotency_key"], {
                    "booking": f"B-{len(self.bookings) + 1}", "room": body["arguments"]["room"]})
            return 200, json.dumps(booking).encode(), self.slow_s if mode == "slow" else 0
        if path == "/tools/lookup":
            if mode == "unknown":
                return 200, json.dumps({"status": "unknown"}).encode(), 0
            found = self.bookings.get(body["idempotency_key"])
            answer = {"status": "found", "result": found} if found else {"status": "not_found"}
            return 200, json.dumps(answer).encode(), 0
        return 404, b"{}", 0

    def _handler(self):
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    body = service.webhook.verify(raw, headers)
                    verified = True
                except WebhookVerificationError:
                    body, verified = json.loads(raw), False
                with service._lock:
                    service.requests.append({"path": self.path, "body": body, "headers": headers,
                                             "verified": verified})
                status, answer, wait_s = service._answer(self.path, body) if verified else (401, b"{}", 0)
                time.sleep(wait_s)
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:  # the caller gave up waiting
                    pass

        return Handler
