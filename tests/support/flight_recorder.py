"""Real processes that keep a flight recorder (``runs.base.flight_recorder``) in the test's box directory:
``box_process`` runs code after opening its box, ``dead_box`` leaves the box of a process SIGKILLed while its
threads ran given runs' code, as a worker killed in the middle of them would."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

KILLED = -signal.SIGKILL
_PROLOGUE = """
import asyncio, os, signal, socket, threading, time
from runs.base import flight_recorder, log_context
from runs.base.flight_recorder import CALL, STEP, executing
owner = f"{socket.gethostname()}:{os.getpid()}:test"
flight_recorder.open_box(owner)
print(owner, flush=True)
"""


def box_process(body: str, *, wait: bool = True) -> tuple[subprocess.Popen, str]:
    """A Python process (this test's settings and environment) that opens its box as lease owner
    ``host:pid:test``, then runs ``body``. Returns (the process, its owner), once it ended with ``wait``."""
    process = subprocess.Popen([sys.executable, "-c", _PROLOGUE + textwrap.dedent(body)], env=dict(os.environ),
                               stdout=subprocess.PIPE, text=True)
    owner = process.stdout.readline().strip()
    assert owner.startswith(f"{socket.gethostname()}:{process.pid}:"), owner
    if wait:
        process.wait(timeout=60)
    return process, owner


def dead_box(running: dict[int, int]) -> str:
    """The lease owner of a process SIGKILLed while each of its threads ran one of ``running`` (run id: kind,
    ``STEP`` or ``CALL``), whose box it left."""
    process, owner = box_process(f"""
        def hold(run_id, kind):
            with log_context.bound(run_id), executing(kind):
                ready.release()
                time.sleep(60)

        ready = threading.Semaphore(0)
        running = {running!r}
        for run_id, kind in running.items():
            threading.Thread(target=hold, args=(run_id, kind), daemon=True).start()
        for _ in running:
            ready.acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert process.returncode == KILLED
    return owner
