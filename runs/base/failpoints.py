"""Failpoints (the idea is FreeBSD's and TiKV's): named places where a worker SIGKILLs itself, for crash tests.

``TOLLGATE_FAILPOINTS`` (comma-separated; unset: nothing happens) names them: ``model_call_started`` (step recorded,
no answer yet), ``model_call_returned`` (answer stored, not acted on; detail: finish reason), ``tool_call_ready``,
``tool_call_started`` (``running`` and key committed, not sent; details: tool name, ``agent=<slug>``),
``tool_call_returned`` (answered, result not stored).
"""

import os
import signal

from django.conf import settings


def failpoint(name: str, *details: str) -> None:
    """Kill this process with SIGKILL if failpoint ``name``, or ``name:detail`` for any of ``details``, is switched on
    (``tool_call_started:refund``: calls of ``refund`` only; ``tool_call_started:agent=crasher``: that agent's runs only).
    """
    switched_on = settings.TOLLGATE["FAILPOINTS"]
    if not switched_on:
        return
    if name in switched_on or any(f"{name}:{detail}" in switched_on for detail in details if detail):
        os.kill(os.getpid(), signal.SIGKILL)
