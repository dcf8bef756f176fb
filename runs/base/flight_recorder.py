"""The flight recorder: which run's code each thread of a worker process is executing, readable after it dies.

A worker process with many runs in flight that is killed (a poison step,
the OOM killer, an operator's SIGKILL) leaves leases that only say *which*
runs died, not whose code killed it: the order of their starts says little
when a hundred start work every second (docs/design.md#recovery-and-the-sweeper,
"Quarantine"). So each engine process keeps a *box*: a small file mapped
into its memory, one slot per thread, where a thread notes the run whose
code it runs now and what kind of code that is:

* ``STEP``: the engine's own database work between two calls (resuming a
  run's step generator, ``runs.base.awaiting.resume``);
* ``CALL``: code that is not the engine's: a tool handler, a hook, a model
  client, from the call's start to its answer, each time the loop runs it
  (``runs.base.awaiting.settle``, ``run_blocking``).

A note is a store into shared memory: no system call, no flush. The pages
of a shared file mapping belong to the operating system's page cache, so
they outlive a process that is SIGKILLed; whoever breaks the dead
worker's leases on the same host (the sweeper, ``runs.engine.recovery.attribute_deaths``)
reads what each of its threads was running at the moment it died
(``read``). A box lives in ``TOLLGATE["FLIGHT_RECORDER_DIR"]`` under its
lease owner's name (``runs.lease.WORKER_ID``); a sweeper on another host
finds none (unless the directory is shared) and falls back to the order of
starts. A process removes its box when it exits; the sweeper removes those
of processes that died (``discard_dead``).

The idea is the aircraft's flight data recorder, as crash reporters use it
(state written before a crash, read after it: e.g. Chromium's "crash keys",
breadcrumbs in Sentry's SDKs).

Layout (little-endian): a 256-byte header (``b"TGFR"``, version u32, an
overflow flag u32: a thread found no free slot, so the box may miss one,
4 bytes of padding, the lease owner in UTF-8 padded with NULs), then
``SLOTS`` slots of 16 bytes (run id i64, kind u32, padding); run id 0 is
an empty slot.
"""

import asyncio
import atexit
import contextlib
import mmap
import os
import re
import socket
import struct
import threading
from pathlib import Path

from django.conf import settings

from runs.base import log_context

STEP = 1
CALL = 2
SLOTS = 256
_MAGIC = b"TGFR"
_VERSION = 1
_HEADER = struct.Struct("<4sII4x240s")
_SLOT = struct.Struct("<qI4x")
_SIZE = _HEADER.size + SLOTS * _SLOT.size


class _Box:
    """This process's open box: the mapping, and the next free slot (one per thread, taken at its first note)."""

    def __init__(self, path: Path, owner: str):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, _SIZE)
            self.memory = mmap.mmap(fd, _SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.owner = owner.encode()
        _HEADER.pack_into(self.memory, 0, _MAGIC, _VERSION, 0, self.owner)
        self.path = path
        self._lock = threading.Lock()
        self._taken = 0
        self._local = threading.local()

    def slot(self) -> int | None:
        """The byte offset of this thread's slot, or None when all are taken (the box is marked incomplete)."""
        offset = getattr(self._local, "offset", False)
        if offset is False:
            with self._lock:
                if self._taken < SLOTS:
                    offset = _HEADER.size + self._taken * _SLOT.size
                    self._taken += 1
                else:
                    offset = None
                    _HEADER.pack_into(self.memory, 0, _MAGIC, _VERSION, 1, self.owner)
            self._local.offset = offset
        return offset

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


_box: _Box | None = None


def _file_name(owner: str) -> str:
    """The box's file name for lease owner ``owner`` (``host:pid:nonce``), safe on any filesystem."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", owner) + ".box"


def box_path(owner: str) -> Path:
    """Where the box of lease owner ``owner`` is (``TOLLGATE["FLIGHT_RECORDER_DIR"]``)."""
    return Path(settings.TOLLGATE["FLIGHT_RECORDER_DIR"]) / _file_name(owner)


def open_box(owner: str) -> None:
    """Start recording in this process, in the box of lease owner ``owner`` (created afresh; removed when
    the process exits normally). Once per process (the engine calls it when it starts); later calls do
    nothing. Raises ``OSError`` when the directory cannot be written."""
    global _box
    if _box is None:
        _box = _Box(box_path(owner), owner)
        atexit.register(_box.close)


class executing:  # noqa: N801 (used as a function: ``with executing(STEP):``)
    """Within the block, this thread's slot says it runs code of ``kind`` (``STEP`` or ``CALL``) for the
    run this context is bound to (``runs.base.log_context``); the slot's earlier note comes back after.
    Does nothing in a process with no box or outside a run. (A class, not a generator: it runs around
    every step of every run, about 1 µs.)"""

    __slots__ = ("_kind", "_offset", "_before")

    def __init__(self, kind: int):
        self._kind = kind
        self._offset = None

    def __enter__(self) -> None:
        box = _box
        if box is None:
            return
        run_id = log_context.run_id()
        if run_id is None:
            return
        offset = self._offset = box.slot()
        if offset is not None:
            self._before = box.memory[offset:offset + _SLOT.size]
            _SLOT.pack_into(box.memory, offset, run_id, self._kind)

    def __exit__(self, *_exc) -> None:
        offset = self._offset
        if offset is not None:
            _box.memory[offset:offset + _SLOT.size] = self._before


def read(owner: str) -> dict[int, int] | None:
    """What the threads of lease owner ``owner``'s process were running when it stopped: ``{run id: kind}``
    (``CALL`` wins when a run was in both), or None when no complete box of it is here (none on this host,
    another format, or a thread had no slot)."""
    try:
        data = box_path(owner).read_bytes()
    except OSError:
        return None
    if len(data) != _SIZE:
        return None
    magic, version, overflow, _owner = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION or overflow:
        return None
    running: dict[int, int] = {}
    for offset in range(_HEADER.size, _SIZE, _SLOT.size):
        run_id, kind = _SLOT.unpack_from(data, offset)
        if run_id:
            running[run_id] = max(kind, running.get(run_id, 0))
    return running


def dead_owners() -> list[str]:
    """The lease owners of the boxes here whose process was on this host and is gone (the pid of the
    box's name no longer runs; a box whose pid was reused stays until that process ends too)."""
    directory = Path(settings.TOLLGATE["FLIGHT_RECORDER_DIR"])
    host = _file_name(socket.gethostname()).removesuffix(".box")
    owners = []
    for path in directory.glob(f"{host}_*.box") if directory.is_dir() else ():
        pid = path.name[len(host) + 1:].split("_", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError, struct.error, UnicodeDecodeError):
            magic, _version, _overflow, owner = _HEADER.unpack_from(path.read_bytes(), 0)
            if magic == _MAGIC and box_path(owner := owner.rstrip(b"\0").decode()) == path:
                owners.append(owner)
    return owners


def discard(owner: str) -> None:
    """Remove the box of lease owner ``owner``, if it is still there."""
    with contextlib.suppress(OSError):
        box_path(owner).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def run(kind: int, fn, *args):
    """``fn(*args)`` noted as ``kind`` (``executing``), e.g. a sync handler in a pool thread."""
    with executing(kind):
        return fn(*args)


def recorded(awaitable):
    """``awaitable`` with each step of its coroutine noted as ``CALL`` (``executing``) while the event loop
    runs it; unchanged when it is not a coroutine or this process has no box."""
    if _box is None or not asyncio.iscoroutine(awaitable):
        return awaitable
    return _Recorded(awaitable)


class _Recorded:
    """A coroutine driven step by step (``send``/``throw`` forwarded, as ``yield from`` does), each step noted."""

    __slots__ = ("_coro",)

    def __init__(self, coro):
        self._coro = coro

    def __await__(self):
        coro = self._coro
        advance, value = coro.send, None
        while True:
            with executing(CALL):
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
