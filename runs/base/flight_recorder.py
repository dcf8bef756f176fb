"""The flight recorder: which run's code each thread of a worker process is executing, readable after it dies.

A worker process with many runs in flight that is killed (a poison step,
the OOM killer, an operator's SIGKILL) leaves leases that only say *which*
runs died, not whose code killed it: the order of their starts says little
when a hundred start work every second (docs/design.md#recovery-and-the-sweeper,
"The flight recorder"). So each engine process keeps a *box*: a small file
mapped into its memory, one slot per thread, where a thread notes the run
whose code it runs now and what kind of code that is:

* ``STEP``: the engine's own database work between two calls (resuming a
  run's step generator, ``runs.base.awaiting.resume``);
* ``CALL``: code that is not the engine's: a tool handler, a hook, a model
  client, from the call's start to its answer, each time the loop runs it
  (``runs.base.awaiting.settle``, ``run_blocking``), and what that code
  starts on the engine's loop: its tasks (``task_factory``) and its work in
  the loop's default executor (``asyncio.to_thread``, ``run_in_executor``:
  ``RecordingExecutor``). Threads a handler starts itself are not seen.

A note is a store into shared memory: no system call, no flush. The pages
of a shared file mapping belong to the operating system's page cache, so
they outlive a process that is SIGKILLed; whoever breaks the dead worker's
leases on the same host (the sweeper, ``runs.engine.recovery.attribute_deaths``)
reads what each of its threads was running at the moment it died
(``read``). A box lives in ``TOLLGATE["FLIGHT_RECORDER_DIR"]`` (a
directory of this installation's own, made private to its user) under its
lease owner's name (``runs.lease.WORKER_ID``); a sweeper on another host
finds none and falls back to the order of starts. A process that stops
marks its box stopped, its slots empty (``close_box``: a Dramatiq worker's
shutdown, or the interpreter's exit): the runs it still held died with no
code of theirs to blame. The sweeper removes the boxes of processes that
are gone once none of their runs is leased to them (``dead_owners``,
``discard``).

Whether a box's process is gone is told by a lock, not its process id: the
process holds an exclusive ``flock`` on its box for as long as it lives
(the kernel drops it when the process dies, however it dies), and a reader
that can take it finds the box's process gone. A process id would mislead
where it was reused, or where workers in other pid namespaces (containers
sharing a host name and this directory) look dead from here. A child the
process forks (a handler's ``os.fork``, ``multiprocessing``) lets go of
its copy of the box at once (``os.register_at_fork``): it would hold the
lock after the process died, and write into the box.

The idea is the aircraft's flight data recorder, as crash reporters use it
(state written before a crash, read after it: e.g. Chromium's "crash keys",
breadcrumbs in Sentry's SDKs).

Layout (little-endian): a 256-byte header (``b"TGFR"``, version u32, flags
u32: ``OVERFLOW``, a thread found no free slot, so the box may miss one;
``STOPPED``, the process stopped; 4 bytes of padding, the lease owner in UTF-8 padded with NULs), then
``SLOTS`` slots of 16 bytes (run id i64, kind u32, padding); run id 0 is
an empty slot.
"""

import asyncio
import atexit
import contextlib
import fcntl
import mmap
import os
import re
import socket
import stat
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings

from runs.base import log_context

STEP = 1
CALL = 2
SLOTS = 256
OVERFLOW = 1
STOPPED = 2
_MAGIC = b"TGFR"
_VERSION = 2  # 2: the box's process holds its lock (boxes of version 1 are not read)
_HEADER = struct.Struct("<4sII4x240s")
_SLOT = struct.Struct("<qI4x")
_SIZE = _HEADER.size + SLOTS * _SLOT.size
_HOST = socket.gethostname()


class _Box:
    """This process's open box: the mapping, and the next free slot (one per thread, taken at its first note)."""

    def __init__(self, path: Path, owner: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until the process ends: it lives (module doc)
            os.ftruncate(fd, 0)  # emptied only once locked: a box of a live process is never cut under its mapping
            os.ftruncate(fd, _SIZE)
            self.memory = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # kept open: closing it would let the lock go
        self.owner = owner.encode()
        self.path = path
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        """Empty the box (no flag, every slot free) and record in it from now on."""
        self.memory[:] = bytes(_SIZE)
        self.flags = 0
        _HEADER.pack_into(self.memory, 0, _MAGIC, _VERSION, self.flags, self.owner)
        self._taken = 0
        self.local = threading.local()  # offset: this thread's slot; running: (run id, kind) it notes now

    def slot(self) -> int | None:
        """The byte offset of this thread's slot, or None when all are taken (the box is marked incomplete)."""
        offset = getattr(self.local, "offset", False)
        if offset is False:
            with self._lock:
                if self._taken < SLOTS:
                    offset = _HEADER.size + self._taken * _SLOT.size
                    self._taken += 1
                else:
                    offset = None
                    self.mark(OVERFLOW)
            self.local.offset = offset
        return offset

    def mark(self, flag: int) -> None:
        """Set ``flag`` in the header."""
        self.flags |= flag
        _HEADER.pack_into(self.memory, 0, _MAGIC, _VERSION, self.flags, self.owner)

    def leave(self) -> None:
        """In a child forked from the box's process: let go of the box. The child's copies of its descriptors
        (``_fd``, and the mapping's own) would hold the box's lock after the process died, and its writes (a
        note it unwinds, ``close_box`` at its exit) would land in the box: they go to private memory now."""
        shared, self.memory = self.memory, mmap.mmap(-1, _SIZE)
        shared.close()
        os.close(self._fd)


_box: _Box | None = None
_stopped: _Box | None = None  # the box ``close_box`` stopped: its lock is still held, so it is the one opened again


def _directory() -> Path:
    """``TOLLGATE["FLIGHT_RECORDER_DIR"]``, made if missing (mode 0700). Raises ``OSError`` when it is not a
    directory of this user's that no one else may write to (a box there could be planted or replaced)."""
    directory = Path(settings.TOLLGATE["FLIGHT_RECORDER_DIR"])
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
        raise OSError(f"{directory} must be a directory of this user's that others cannot write to")
    return directory


def _file_name(owner: str) -> str:
    """The box's file name for lease owner ``owner`` (``host:pid:nonce``), safe on any filesystem."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", owner) + ".box"


def open_box(owner: str) -> None:
    """Start recording in this process, in the box of lease owner ``owner`` (created afresh). Once per
    process (the engine calls it when it starts); later calls do nothing, until ``close_box`` (then the same
    box is started again: this process still holds its lock). Raises ``OSError`` when the directory cannot
    be used (``_directory``), or the box is another live process's (its lock is held)."""
    global _box, _stopped
    if _box is None:
        path = _directory() / _file_name(owner)
        if _stopped is not None and _stopped.path == path:
            _stopped.start()
            _box, _stopped = _stopped, None
        else:
            _box = _Box(path, owner)
            atexit.register(close_box)


def _leave_in_child() -> None:
    """After a fork, in the child (``os.register_at_fork``): no box here (``_Box.leave``)."""
    global _box, _stopped
    for box in (_box, _stopped):
        if box is not None:
            box.leave()
    _box = _stopped = None


os.register_at_fork(after_in_child=_leave_in_child)


def close_box() -> None:
    """Stop recording in this process: its box says it stopped, with every slot empty (the runs it still held
    die with no code of theirs to blame, ``read``); the sweeper removes it once the process is gone."""
    global _box, _stopped
    box, _box = _box, None
    if box is not None:
        box.mark(STOPPED)
        box.memory[_HEADER.size:_SIZE] = bytes(_SIZE - _HEADER.size)
        _stopped = box


class executing:  # noqa: N801 (used as a function: ``with executing(STEP):``)
    """Within the block, this thread's slot says it runs code of ``kind`` (``STEP`` or ``CALL``) for run
    ``run_id`` (by default the run this context is bound to: ``runs.base.log_context``); the slot's earlier
    note comes back after. Does nothing in a process with no box or outside a run. (A class, not a
    generator: it runs around every step of every run, about 1 µs.)"""

    __slots__ = ("_kind", "_run_id", "_box", "_offset", "_before", "_was")

    def __init__(self, kind: int, run_id: int | None = None):
        self._kind = kind
        self._run_id = run_id
        self._offset = None

    def __enter__(self) -> None:
        box = self._box = _box
        if box is None:
            return
        run_id = self._run_id if self._run_id is not None else log_context.run_id()
        if run_id is None:
            return
        offset = self._offset = box.slot()
        if offset is not None:
            self._before = box.memory[offset:offset + _SLOT.size]
            self._was = getattr(box.local, "running", None)
            _SLOT.pack_into(box.memory, offset, run_id, self._kind)
            box.local.running = (run_id, self._kind)

    def __exit__(self, *_exc) -> None:
        offset = self._offset
        if offset is not None:
            self._box.memory[offset:offset + _SLOT.size] = self._before
            self._box.local.running = self._was


def running_call() -> int | None:
    """The run whose call's code this thread runs now (``CALL``), or None."""
    box = _box
    running = getattr(box.local, "running", None) if box is not None else None
    return running[0] if running is not None and running[1] == CALL else None


def task_factory(loop: asyncio.AbstractEventLoop, coro, **options) -> asyncio.Task:
    """The engine loop's task factory (``loop.set_task_factory``): a task created by a call's code (``CALL``)
    runs each step noted as that run's call, as the call itself does. ``options``: ``asyncio.Task``'s
    (``context``, and ``name`` where the loop passes it)."""
    run_id = running_call()
    if run_id is not None:
        coro = _each_step_noted(coro, run_id)
    return asyncio.Task(coro, loop=loop, **options)


class RecordingExecutor(ThreadPoolExecutor):
    """The engine loop's default executor (``loop.set_default_executor``): work a call's code sends to it
    (``asyncio.to_thread``, ``loop.run_in_executor(None, ...)``) is noted as that run's call while it runs."""

    def submit(self, fn, /, *args, **kwargs):
        run_id = running_call()
        if run_id is None:
            return super().submit(fn, *args, **kwargs)
        return super().submit(_run_noted, run_id, fn, *args, **kwargs)


def _run_noted(run_id: int, fn, *args, **kwargs):
    with executing(CALL, run_id):
        return fn(*args, **kwargs)


def run(kind: int, fn, *args):
    """``fn(*args)`` noted as ``kind`` (``executing``), e.g. a sync handler in a pool thread."""
    with executing(kind):
        return fn(*args)


async def _each_step_noted(coro, run_id: int):
    return await _Noted(coro, run_id)


class _Noted:
    """A coroutine driven step by step (``send``/``throw`` forwarded, as ``yield from`` does), each step noted
    as run ``run_id``'s call."""

    __slots__ = ("_coro", "_run_id")

    def __init__(self, coro, run_id: int):
        self._coro = coro
        self._run_id = run_id

    def __await__(self):
        coro = self._coro
        advance, value = coro.send, None
        while True:
            with executing(CALL, self._run_id):
                try:
                    signal = advance(value)
                except StopIteration as stop:
                    return stop.value
            try:
                value, advance = (yield signal), coro.send
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancel (CancelledError) or a thrown error: the coroutine's to handle
                value, advance = exc, coro.throw


def _read_box(path: Path) -> tuple[str, int, dict[int, int], bool] | None:
    """``(owner, flags, {run id: kind}, whether its process lives)`` of the box at ``path``, or None when it is
    not a box (not a regular file of the right size and format; never followed through a link nor waited on).
    Its process lives while it holds the box's lock (module doc)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_size != _SIZE:
            return None
        try:  # the lock first: once the process is gone, what is read is what it left
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            alive = False  # nobody holds it: the process that made the box is gone (closing lets it go again)
        except BlockingIOError:
            alive = True
        data = os.read(fd, _SIZE)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) != _SIZE:
        return None
    magic, version, flags, owner = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION:
        return None
    running: dict[int, int] = {}
    for offset in range(_HEADER.size, _SIZE, _SLOT.size):
        run_id, kind = _SLOT.unpack_from(data, offset)
        if run_id:
            running[run_id] = max(kind, running.get(run_id, 0))
    return owner.rstrip(b"\0").decode(errors="replace"), flags, running, alive


def _here(owner: str) -> bool:
    """Whether lease owner ``owner`` (``host:pid:nonce``) names this host."""
    parts = owner.rsplit(":", 2)
    return len(parts) == 3 and parts[0] == _HOST


def read(owner: str) -> dict[int, int] | None:
    """What the threads of lease owner ``owner``'s process were running when it died: ``{run id: kind}``
    (``CALL`` wins when a run was in both; empty: none, e.g. it was stopped). None when no complete box of
    it is here (none on this host, not a box, or a thread had no slot), or when its process still lives
    (its lease ran out without a death: what it runs now says nothing)."""
    try:
        box = _read_box(_directory() / _file_name(owner))
    except OSError:
        return None
    if box is None or box[0] != owner or box[1] & OVERFLOW or not _here(owner) or box[3]:
        return None
    return {} if box[1] & STOPPED else box[2]


def dead_owners() -> list[str]:
    """The lease owners of the boxes here whose process was on this host and is gone."""
    try:
        directory = _directory()
    except OSError:
        return []
    owners = []
    for path in directory.glob(f"{_file_name(_HOST).removesuffix('.box')}_*.box"):
        box = _read_box(path)
        if box is not None and directory / _file_name(box[0]) == path and _here(box[0]) and not box[3]:
            owners.append(box[0])
    return owners


def discard(owner: str) -> None:
    """Remove the box of lease owner ``owner``, if it is still there."""
    with contextlib.suppress(OSError):
        (_directory() / _file_name(owner)).unlink()

