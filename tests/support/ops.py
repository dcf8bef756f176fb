"""Real servers for the operations tests: the ASGI application in its own process, a private Redis, a TCP relay
that can cut a database off and let it back."""

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
from django.db import connection

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]


class AsgiServer:
    """``config.asgi:application`` under Daphne on a free loopback port, with ``env`` over this process's."""

    def __init__(self, env: dict, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
                cwd=ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(self.url + "/healthz", timeout=2).raise_for_status()
                return
            except httpx.HTTPError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the ASGI server did not come up:\n" + log_path.read_text())
                time.sleep(0.2)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=20)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class PrivateRedis:
    """A throwaway ``redis-server`` on a free loopback port that can be stopped and started again on that port."""

    def __init__(self, directory: Path):
        self.port = free_port()
        self.directory = directory
        self.process = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)  # down, as a crash is: no goodbye to its clients
            self.process.wait(10)


class Relay:
    """A TCP relay from a free loopback port to ``(host, port)``; ``stop()`` refuses new connections and cuts the
    open ones (the service is unreachable), ``start()`` relays again on the same port."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.port = free_port()
        self._listener = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            self._open.clear()

    def _accept(self, listener) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # stopped
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source, sink) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def database_url_copy(tmp_dir: Path, *, port: int | None = None) -> str:
    """A ``DATABASE_URL`` for a server process holding this test's data: on SQLite, a copy of the test database
    in ``tmp_dir`` (migrated, as the test database is); on PostgreSQL, the test database itself, through
    ``port`` on loopback if given (a ``Relay``)."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        tmp_dir.mkdir(parents=True, exist_ok=True)
        copy = tmp_dir / "tollgate.sqlite3"
        with sqlite3.connect(settings["NAME"]) as source, sqlite3.connect(copy) as target:
            source.backup(target)
        return f"sqlite:///{copy}"
    credentials = quote(settings["USER"]) + (f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else "")
    host, db_port = ("127.0.0.1", port) if port else (settings["HOST"], settings["PORT"])
    return f"postgres://{credentials}@{host}:{db_port}/{settings['NAME']}"


def have_redis_server() -> bool:
    """Whether a `redis-server` program is on PATH (the broker outage test starts its own)."""
    return shutil.which("redis-server") is not None
