"""The cyclic garbage collector of a long-lived process, settled once the process has booted.

A worker or API process imports Django, the apps, the SDKs and their
types at start: hundreds of thousands of objects that live as long as the
process. CPython's collector walks all of them on every full (oldest
generation) collection, and its youngest generation is collected after
every 700 net allocations of container objects, which a step's rows,
dicts and SDK models reach many times over. Measured in the slow-model
benchmark (``bench/latency.py``, 1,000 runs), a worker process spent 6 %
of its CPU in the collector.

``settle()`` collects once, then moves every object alive into the
permanent generation (``gc.freeze``), which later collections never walk,
and raises the youngest generation's threshold, so that objects a step
frees by reference counting are seldom walked before they go. Cycles are
still found and freed: the collector stays on.

The idea is Instagram's ("Dismissing Python Garbage Collection at
Instagram", 2017), which led to ``gc.freeze`` (CPython 3.7, bpo-31558).
"""

import gc

YOUNGEST_THRESHOLD = 10_000  # net container allocations between two collections of the youngest generation

_settled = False


def settle() -> None:
    """Collect, freeze what is alive now (``gc.freeze``), and collect the youngest generation after
    ``YOUNGEST_THRESHOLD`` net allocations (the older generations' thresholds unchanged).

    Call it once the process has imported what it runs. Only the first call in a process does anything:
    a process that boots workers and then serves (``manage.py serve``, the test process) would otherwise
    freeze what its runs hold at the time, and what of it later became cyclic garbage could never be freed.
    """
    global _settled
    if _settled:
        return
    _settled = True
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNGEST_THRESHOLD, middle, oldest)
