"""Processes a test starts on loopback: a free port, ``manage.py serve``, the test database's URL for them."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url_for_subprocess() -> str:
    """A ``DATABASE_URL`` naming the database this test process is using (the test database)."""
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def worker_environment(**extra: str) -> dict:
    """The environment of a worker process a test starts: this process's (its settings module, the tests' tools'
    ledger), the test database (``DATABASE_URL``), then ``extra``."""
    return {**os.environ, "DATABASE_URL": database_url_for_subprocess(), **extra}


@contextlib.contextmanager
def serving(env: dict, log_path: Path):
    """Run ``manage.py serve`` on a free loopback port with ``env``, output to ``log_path``.

    Yields the base URL once ``/accounts/login/`` answers (within 30 s,
    else ``RuntimeError`` with the log); stops the server on exit.
    """
    with serving_process(env, log_path) as (base, _):
        yield base


@contextlib.contextmanager
def serving_process(env: dict, log_path: Path):
    """``serving``, yielding ``(base URL, the server's subprocess.Popen)``."""
    port = free_port()
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}"],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/accounts/login/", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("manage.py serve did not come up:\n" + log_path.read_text())
                time.sleep(0.2)
        yield base, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
