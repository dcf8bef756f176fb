"""A real webhook endpoint for the tests: an HTTP server on loopback that records what it gets."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """``http://127.0.0.1:<port>/hook`` in a thread of the test process.

    Every POST is recorded (``requests``: headers, raw body, arrival time);
    it answers the codes given to ``answer()`` in turn, then 200, each
    ``delay_s`` seconds after it arrived (a slow endpoint). With ``hold()``
    it keeps each request waiting, without answering, until ``release()``.
    ``most_at_once`` is the largest number of requests it held at one time.
    """

    def __init__(self, delay_s: float = 0):
        self.delay_s = delay_s
        self.requests: list[dict] = []
        self.most_at_once = 0
        self._open = 0
        self._codes: list[int] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()
        self.arrived = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def answer(self, *codes: int) -> None:
        """Answer the next requests with these status codes, in order (then 200 again)."""
        with self._lock:
            self._codes = list(codes)

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def bodies(self) -> list[dict]:
        """The JSON bodies received so far, in arrival order."""
        with self._lock:
            return [json.loads(request["body"]) for request in self.requests]

    def wait_for(self, count: int, timeout_s: float = 30) -> list[dict]:
        """Block until ``count`` requests arrived; returns all of them."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            time.sleep(0.02)
        raise AssertionError(f"the receiver got {len(self.requests)} request(s), expected {count}")

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):  # keep test output quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    receiver.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body, "at": time.monotonic()})
                    code = receiver._codes.pop(0) if receiver._codes else 200
                    receiver._open += 1
                    receiver.most_at_once = max(receiver.most_at_once, receiver._open)
                receiver.arrived.set()
                time.sleep(receiver.delay_s)
                receiver._released.wait(60)
                try:
                    self.send_response(code)
                    self.send_header("content-type", "text/plain")
                    self.end_headers()
                    self.wfile.write(f"answered {code}".encode())
                except OSError:  # the sender is gone (killed mid-request)
                    pass
                finally:
                    with receiver._lock:
                        receiver._open -= 1

        return Handler
