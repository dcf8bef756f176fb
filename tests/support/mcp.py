"""A real MCP server process for the tests (tests/support/fakes/mcp_server.py) and a loopback proxy that can cut connections."""

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.processes import free_port

SERVER_SCRIPT = Path(__file__).resolve().parent / "fakes" / "mcp_server.py"
TOKEN_ENV = "TOLLGATE_TEST_MCP_AUTH"


def wait_for_port(port: int, timeout_s: float = 30) -> None:
    """Block until 127.0.0.1:``port`` accepts a connection (``RuntimeError`` after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing answers on port {port}")


class McpServer:
    """The fake MCP server as a subprocess on ``port``; ``journal`` lists the calls it received.

    ``proxy``: the ``CuttingProxy`` Tollgate reaches it through, when a test set one.
    """

    def __init__(self, tmp_path: Path):
        self.proxy: "CuttingProxy | None" = None
        self.port = free_port()
        self.journal_path = tmp_path / "mcp-journal.jsonl"
        self.log_path = tmp_path / "mcp-server.log"
        self.process = None
        self.listing = (False, False)  # (changed, read_only) of the running server

    def start(self, *, changed: bool = False, read_only: bool = False) -> "McpServer":
        """Start (or restart) the server, serving the changed listing when ``changed`` (``delete_record`` marked
        read-only when ``read_only``); returns once it answers."""
        self.stop()
        self.listing = (changed, read_only)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVER_SCRIPT), str(self.port), str(self.journal_path),
                 *(["--changed"] if changed else []),
                 *(["--read-only"] if read_only else [])], stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        """Kill the server process (its connections drop), if it runs."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def journal(self, tool: str | None = None) -> list[dict]:
        """The calls received so far (``{"tool", "arguments", "meta"}``), of ``tool`` only if given."""
        if not self.journal_path.exists():
            return []
        calls = [json.loads(line) for line in self.journal_path.read_text().splitlines()]
        return [call for call in calls if tool is None or call["tool"] == tool]

    def wait_for_call(self, tool: str, count: int = 1, timeout_s: float = 30) -> list[dict]:
        """Block until the server received ``count`` calls of ``tool``; returns them."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            calls = self.journal(tool)
            if len(calls) >= count:
                return calls
            time.sleep(0.05)
        raise AssertionError(f"{tool} was called {len(self.journal(tool))} times, not {count}")


class CuttingProxy:
    """A TCP proxy from a free loopback port to ``target_port``; ``cut()`` drops every open connection."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                downstream.close()
                continue
            with self.lock:
                self.open += [downstream, upstream]
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Reset every connection open now (new ones are still accepted)."""
        with self.lock:
            sockets, self.open = self.open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()
