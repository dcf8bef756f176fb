"""The flight recorder (``runs.base.flight_recorder``): what a process SIGKILLed in the middle of runs' code
leaves for whoever reads its box, in a real child process that kills itself."""

import fcntl
import os
import signal
import socket
import subprocess
import sys
import types

import pytest

from runs.base import flight_recorder
from runs.base.flight_recorder import CALL, SLOTS, STEP
from tests.support.flight_recorder import KILLED, box_process, dead_box


@pytest.fixture(autouse=True)
def box_dir(settings, tmp_path, monkeypatch):
    """A box directory of the test's own, for this process and the ones it starts."""
    monkeypatch.setenv("TOLLGATE_FLIGHT_RECORDER_DIR", str(tmp_path))
    settings.TOLLGATE = {**settings.TOLLGATE, "FLIGHT_RECORDER_DIR": str(tmp_path)}
    return tmp_path


def test_a_killed_process_leaves_whose_code_each_thread_was_running():
    process, owner = box_process("""
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

        def die():
            os.kill(os.getpid(), signal.SIGKILL)

        async def child():
            await asyncio.sleep(0)
            await asyncio.to_thread(die)  # in the loop's default executor, for the call that made the task

        async def handler():
            await asyncio.sleep(0)  # a later step of the call's coroutine, run by the loop
            await asyncio.create_task(child())  # a task of its own

        async def main():
            asyncio.get_running_loop().set_task_factory(flight_recorder.task_factory)
            asyncio.get_running_loop().set_default_executor(flight_recorder.RecordingExecutor())
            with log_context.bound(12):
                with executing(CALL):  # as the engine starts a call (runs.base.awaiting.settle)
                    call = asyncio.ensure_future(handler())
                await call

        asyncio.run(main())
    """)
    assert process.returncode == KILLED
    assert flight_recorder.read(owner) == {11: STEP, 14: CALL, 12: CALL}
    assert owner in flight_recorder.dead_owners()
    flight_recorder.discard(owner)
    assert flight_recorder.read(owner) is None
    assert flight_recorder.dead_owners() == []


def test_a_box_is_read_only_once_its_process_is_gone_and_names_nobody_once_it_stopped():
    living, owner = box_process("""
        with log_context.bound(5), executing(CALL):
            print("noted", flush=True)
            time.sleep(60)
    """, wait=False)
    assert living.stdout.readline().strip() == "noted"
    try:
        assert flight_recorder.read(owner) is None  # still running: what it runs now says nothing of a death
        assert flight_recorder.dead_owners() == []
    finally:
        living.kill()
        living.wait(timeout=10)
    assert flight_recorder.read(owner) == {5: CALL}
    assert flight_recorder.dead_owners() == [owner]

    _, exited = box_process("""
        with log_context.bound(5), executing(CALL):
            time.sleep(0)
            flight_recorder.close_box()  # stopped while it ran run 5's code (as a Dramatiq worker's shutdown does)
    """)
    assert flight_recorder.read(exited) == {}  # stopped: no code of its runs to blame


def test_a_box_with_more_threads_than_slots_is_not_trusted():
    process, owner = box_process(f"""
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


def test_no_box_here_reads_as_none():
    assert flight_recorder.read(f"{socket.gethostname()}:1:none") is None
    assert flight_recorder.read("another-host:7:abc") is None


def test_what_is_planted_in_the_directory_is_never_waited_on_nor_followed(box_dir):
    """A FIFO or a link under a box's name (anyone who could write there) neither hangs the sweeper nor
    decides blame; a box of a dead process that names another owner is not that owner's."""
    host = socket.gethostname()
    os.mkfifo(box_dir / f"{host}_999999_fifo.box")
    (box_dir / f"{host}_999998_link.box").symlink_to("/dev/zero")
    assert flight_recorder.read(f"{host}:999999:fifo") is None
    assert flight_recorder.read(f"{host}:999998:link") is None
    owner = dead_box({7: CALL})
    os.rename(box_dir / (owner.replace(":", "_") + ".box"), box_dir / f"{host}_999997_copy.box")
    assert flight_recorder.read(f"{host}:999997:copy") is None
    assert flight_recorder.dead_owners() == []


def test_a_directory_others_may_write_to_is_refused(box_dir):
    owner = dead_box({7: CALL})
    box_dir.chmod(0o777)
    assert flight_recorder.read(owner) is None  # what is in it may have been planted
    assert flight_recorder.dead_owners() == []
    opening = subprocess.run([sys.executable, "-c", "from runs.base import flight_recorder; "
                              "flight_recorder.open_box('host:1:x')"], capture_output=True, text=True)
    assert opening.returncode != 0 and "others cannot write to" in opening.stderr


def _box_under(owner: str, *, then: str) -> subprocess.Popen:
    """A process that opens its box as lease owner ``owner`` (whatever pid that names), notes a call of run 5,
    says so, then runs ``then``."""
    process = subprocess.Popen([sys.executable, "-c", f"""
import os, signal, time
from runs.base import flight_recorder, log_context
from runs.base.flight_recorder import CALL, executing
flight_recorder.open_box({owner!r})
with log_context.bound(5), executing(CALL):
    print("ready", flush=True)
    {then}
"""], env=dict(os.environ), stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def test_a_live_process_whose_pid_this_host_cannot_see_is_not_taken_for_dead():
    """A worker in another pid namespace (a container sharing this host name and directory) names a pid that
    does not exist here: its lock, not its pid, says it lives."""
    owner = f"{socket.gethostname()}:4194999:elsewhere"
    process = _box_under(owner, then="time.sleep(60)")
    try:
        assert flight_recorder.read(owner) is None
        assert owner not in flight_recorder.dead_owners()
    finally:
        process.kill()
        process.wait()
    assert flight_recorder.read(owner) == {5: CALL}
    assert owner in flight_recorder.dead_owners()


def test_a_dead_process_whose_pid_was_reused_is_read():
    """The box names a pid that lives now (here: this test's own): its process is gone all the same."""
    owner = f"{socket.gethostname()}:{os.getpid()}:reused"
    process = _box_under(owner, then="os.kill(os.getpid(), signal.SIGKILL)")
    assert process.wait(timeout=60) == KILLED
    assert flight_recorder.read(owner) == {5: CALL}
    assert owner in flight_recorder.dead_owners()


def test_a_dead_process_whose_forked_child_lives_on_is_read():
    """A handler forks (``os.fork``, ``multiprocessing`` with its default start method): the child inherits the
    box's file descriptor, and with it the box's lock. The worker is killed, the child lives on: the worker
    is gone all the same, and its box is read."""
    process, owner = box_process("""
        with log_context.bound(5), executing(CALL):
            forked, running = os.pipe()
            child = os.fork()
            if child == 0:
                os.write(running, b"x")  # past the fork's handlers: what it let go of is gone
                time.sleep(60)
                os._exit(0)
            os.read(forked, 1)
            print(child, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    child = int(process.stdout.readline())
    try:
        assert process.returncode == KILLED
        assert flight_recorder.read(owner) == {5: CALL}
        assert owner in flight_recorder.dead_owners()
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_forked_child_that_exits_leaves_its_parents_box_as_it_was():
    """A child forked in the middle of a call that leaves through the interpreter's exit (its ``with`` blocks
    unwound, its ``atexit`` hooks run) writes nothing into its parent's box: the parent, killed later, is
    still found in that call, not stopped."""
    process, owner = box_process("""
        import sys
        with log_context.bound(5), executing(CALL):
            child = os.fork()
            if child == 0:
                sys.exit(0)
            os.waitpid(child, 0)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert process.returncode == KILLED
    assert flight_recorder.read(owner) == {5: CALL}


def test_a_box_is_read_as_its_process_left_it_when_it_dies_while_being_read(box_dir, monkeypatch):
    """The process dies while the sweeper reads its box (between opening it and learning from its lock that
    the process is gone): what is read is what its threads ran when it died, not a moment before."""
    go = box_dir / "go"
    living, owner = box_process(f"""
        with log_context.bound(5), executing(STEP):
            print("noted", flush=True)
            while not os.path.exists({str(go)!r}):
                time.sleep(0.01)
            with log_context.bound(6), executing(CALL):
                os.kill(os.getpid(), signal.SIGKILL)
    """, wait=False)
    assert living.stdout.readline().strip() == "noted"

    def dying_meanwhile(fd, operation):
        if living.poll() is None:
            go.touch()
            living.wait(timeout=60)
        return fcntl.flock(fd, operation)

    monkeypatch.setattr(flight_recorder, "fcntl", types.SimpleNamespace(
        flock=dying_meanwhile, LOCK_SH=fcntl.LOCK_SH, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB))
    assert flight_recorder.read(owner) == {6: CALL}


def test_a_box_opened_again_under_its_owner_while_its_process_lives_is_left_whole():
    """A forked child starts recording under the owner name it inherited (``runs.lease.WORKER_ID``, named at
    import): its box cannot be opened while the parent holds the lock, and the parent's box is left as it
    was (not truncated under the parent's mapping), so the parent, killed later, is read."""
    process, owner = box_process("""
        with log_context.bound(5), executing(CALL):
            child = os.fork()
            if child == 0:
                try:
                    flight_recorder.open_box(owner)
                except OSError:
                    os._exit(3)
                os._exit(0)
            print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
            with executing(CALL):
                os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert process.stdout.readline().strip() == "3"
    assert process.returncode == KILLED
    assert flight_recorder.read(owner) == {5: CALL}


def test_a_process_that_stopped_recording_can_start_again():
    """A process whose Dramatiq worker shut down (``close_box``) and that starts an engine again (a test
    process's in-process workers, one after another) records again in its box: it still holds the box's
    lock, which must not shut it out of its own box."""
    process, owner = box_process("""
        flight_recorder.close_box()
        flight_recorder.open_box(owner)
        with log_context.bound(5), executing(CALL):
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert process.returncode == KILLED
    assert flight_recorder.read(owner) == {5: CALL}
