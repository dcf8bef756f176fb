"""The flight recorder (``runs.base.flight_recorder``): what a process SIGKILLed in the middle of runs' code
leaves for whoever reads its box, in a real child process that kills itself."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from runs.base import flight_recorder
from runs.base.flight_recorder import CALL, SLOTS, STEP

KILLED = -signal.SIGKILL


@pytest.fixture
def box_dir(settings, tmp_path):
    settings.TOLLGATE = {**settings.TOLLGATE, "FLIGHT_RECORDER_DIR": str(tmp_path)}
    return tmp_path


def _child(box_dir, body: str, *, wait: bool = True) -> tuple[subprocess.Popen, str]:
    """A Python process that opens its box as lease owner ``host:pid:test`` and runs ``body``; with ``wait``,
    its exit code once it ended, else the process. Returns (process or exit code, its owner)."""
    code = textwrap.dedent("""
        import asyncio, os, signal, socket, threading, time
        from runs.base import flight_recorder, log_context
        from runs.base.flight_recorder import CALL, STEP, executing
        owner = f"{socket.gethostname()}:{os.getpid()}:test"
        flight_recorder.open_box(owner)
        print(owner, flush=True)
    """) + textwrap.dedent(body)
    env = {**os.environ, "TOLLGATE_FLIGHT_RECORDER_DIR": str(box_dir)}
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    owner = process.stdout.readline().strip()
    assert owner.startswith(f"{socket.gethostname()}:{process.pid}:"), owner
    if wait:
        process.wait(timeout=60)
    return process, owner


def test_a_killed_process_leaves_whose_code_each_thread_was_running(box_dir):
    process, owner = _child(box_dir, """
        def hold(run_id, kind):
            with log_context.bound(run_id), executing(STEP):
                with executing(CALL):  # over before the kill: the slot says STEP again
                    pass
                with executing(kind):
                    ready.release()
                    time.sleep(60)

        ready = threading.Semaphore(0)
        threading.Thread(target=hold, args=(11, STEP), daemon=True).start()
        threading.Thread(target=hold, args=(14, CALL), daemon=True).start()
        ready.acquire(); ready.acquire()
        with log_context.bound(13), executing(STEP):  # over before the kill: no trace
            pass
        with executing(STEP):  # outside a run: nothing to note
            pass

        async def handler():
            await asyncio.sleep(0)  # a later step of the call's coroutine, run by the loop
            os.kill(os.getpid(), signal.SIGKILL)

        async def main():
            with log_context.bound(12):
                await asyncio.ensure_future(flight_recorder.recorded(handler()))

        asyncio.run(main())
    """)
    assert process.returncode == KILLED
    assert flight_recorder.read(owner) == {11: STEP, 14: CALL, 12: CALL}
    assert owner in flight_recorder.dead_owners()
    flight_recorder.discard(owner)
    assert flight_recorder.read(owner) is None
    assert flight_recorder.dead_owners() == []


def test_a_process_that_exits_removes_its_box_and_a_live_ones_is_not_dead(box_dir):
    living, owner = _child(box_dir, "time.sleep(60)", wait=False)
    try:
        assert flight_recorder.read(owner) == {}
        assert flight_recorder.dead_owners() == []
    finally:
        living.kill()
        living.wait(timeout=10)
    assert flight_recorder.dead_owners() == [owner]

    _, exited = _child(box_dir, """
        with log_context.bound(5), executing(CALL):
            pass
    """)
    assert flight_recorder.read(exited) is None  # removed on the way out: nothing to blame


def test_a_box_with_more_threads_than_slots_is_not_trusted(box_dir):
    process, owner = _child(box_dir, f"""
        def note(run_id):
            with log_context.bound(run_id), executing(STEP):
                pass

        for run_id in range(1, {SLOTS} + 2):
            thread = threading.Thread(target=note, args=(run_id,))
            thread.start()
            thread.join()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert process.returncode == KILLED
    assert flight_recorder.read(owner) is None  # the thread past the last slot went unrecorded


def test_no_box_here_reads_as_none(box_dir):
    assert flight_recorder.read(f"{socket.gethostname()}:1:none") is None
    assert flight_recorder.read("another-host:7:abc") is None
