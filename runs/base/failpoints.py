"""Failpoints: named places where a worker can be made to die, for crash tests.

``TOLLGATE_FAILPOINTS=tool_call_returned`` (comma-separated names) makes
the process SIGKILL itself when it reaches that point — a real ``kill -9``
at an exact place, which the crash-recovery tests and the chaos harness
use. Unset (the default) they do nothing. The idea is FreeBSD's and
TiKV's failpoints.

Names: ``model_call_started`` (a step is recorded, the model not yet
answered), ``model_call_returned`` (the answer is stored, not yet acted on;
detail: the finish reason, e.g. ``model_call_returned:stop``), ``tool_call_ready`` (a call is ready to run, not yet started),
``tool_call_started`` (``running`` and the key committed, the external
call not yet sent; details: the tool's name and ``agent=<slug>``),
``tool_call_returned`` (the external call answered, the result not yet
stored).
"""

import os
import signal

from django.conf import settings


def failpoint(name: str, *details: str) -> None:
    """Kill this process with SIGKILL if failpoint ``name`` (or ``name:detail`` for any detail) is switched on.

    ``details`` narrow a failpoint, e.g. ``tool_call_started:refund``
    fires only for calls of the ``refund`` tool, and
    ``tool_call_started:agent=crasher`` only in runs of agent ``crasher``.
    """
    switched_on = settings.TOLLGATE["FAILPOINTS"]
    if not switched_on:
        return
    if name in switched_on or any(f"{name}:{detail}" in switched_on for detail in details if detail):
        os.kill(os.getpid(), signal.SIGKILL)
