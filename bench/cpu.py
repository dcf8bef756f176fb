"""CPU per step of the throughput workload in one process, with nothing else running: the engine's own cost.

``bench/throughput.py`` measures a whole cluster (workers, API, PostgreSQL,
Redis, the driver) sharing two cores, so its CPU per step moves with
whatever else the machine does. This drives the same runs (one order and
one scripted agent each, ``bench.throughput.create_agents``: 5 model calls
and 4 tool calls, the refund approved by a person) in this process, one
after another, with ``runs.engine.loop.advance`` (the slice on a private
event loop in this thread) and ``approvals.services.decide_interrupt``, and
counts only that: not the runs' creation.

Printed: user and system CPU per step in ms (``os.times``: this process,
its threads included, so the sync handler pool's work too), wall time per
step, database statements per step (``pg_stat_statements``, reset before
the measured runs: every statement of every connection, this process being
the only client then; ``all`` and ``data`` as bench/throughput.py counts
them, PostgreSQL's own foreign-key checks included: ``SELECT 1 FROM ONLY
... FOR KEY SHARE``, one per row inserted or key changed), with
``--top-statements N`` the N statements sent most often, and with
``--by-function`` the CPU each engine function took per step and per call
(its thread's CPU time while it ran, so nested functions count in their
callers too, and work it handed to another thread does not): a diagnostic
that wraps those functions in place, in the modules that call them (a
name imported elsewhere keeps the original there: a function listed but
never called through the wrapper is named as such), which adds its own
CPU to the total.

Needs ``DATABASE_URL`` (PostgreSQL; ``bash bench/run.sh cpu --runs 100``
starts a private one), and the demo payment gateway, which it starts.
Not a test: nothing here asserts a speed.
"""

import argparse
import collections
import functools
import importlib
import inspect
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import Cluster, free_port, healthy, prepare_django, wait_for  # noqa: E402
from bench.throughput import STEPS_PER_RUN, Database, create_agents  # noqa: E402

# (module, function names) timed by --by-function: plain functions, wrapped in the module whose code calls them
# (where the engine looks the name up).
TIMED = (
    ("runs.engine.loop", ("_record_model_answer", "_finish", "set_phase", "deliver_tool_results", "_model_request",
                          "begin_run", "request_approval", "_wait_for_approval", "_end", "hand_back",
                          "propose_tool_calls", "ending_reads", "apply", "append_message")),
    ("runs.lease", ("acquire", "release")),
    ("tools.services.execution", ("_key_and_reusable_result", "_store_result", "apply")),
    ("approvals.services", ("decide_interrupt",)),
    ("runs.engine.completion", ("evaluate", "call_facts")),
    ("runs.transitions", ("append_events",)),
    ("runs.services", ("_reserve", "update_and_insert_numbered", "update_columns", "insert_row")),
    ("runs.base.rows", ("counter", "insert_many")),  # called as rows.<name>: the module's own attribute
    ("runs.base.selects", ("select", "values_one", "count", "exists")),
)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs measured (default 100)")
    parser.add_argument("--warmup-runs", type=int, default=10, help="runs driven first, not measured (default 10)")
    parser.add_argument("--by-function", action="store_true", help="also the CPU of each engine function (see doc)")
    parser.add_argument("--top-statements", type=int, default=0, metavar="N",
                        help="also the N statements sent most often, with their calls per step")
    return parser.parse_args()


class FunctionTimes:
    """Calls of plain functions and their thread's CPU seconds while they ran (``time.thread_time``), the
    functions wrapped in place in their modules (``TIMED``)."""

    def __init__(self):
        self.spent = collections.defaultdict(lambda: [0, 0.0])

    def wrap(self, module, name: str) -> None:
        """Replace ``module.name`` (a plain function) by a timed one; ``TypeError`` for another kind."""
        original = getattr(module, name)
        if inspect.isgeneratorfunction(original) or inspect.iscoroutinefunction(original):
            raise TypeError(f"{module.__name__}.{name} is not a plain function")
        label = f"{module.__name__}.{name}"

        @functools.wraps(original)
        def timed(*args, **kwargs):
            started = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                entry = self.spent[label]
                entry[0] += 1
                entry[1] += time.thread_time() - started

        setattr(module, name, timed)

    def lines(self, steps: int, wrapped: list[str]) -> list[str]:
        """One line per function called through its wrapper, most CPU first, then one naming those never called
        (``wrapped``: every label wrapped)."""
        lines = [f"{label}: {1000 * seconds / steps:.3f} ms/step, {calls / steps:.2f} calls/step, "
                 f"{1000 * seconds / max(calls, 1):.3f} ms/call"
                 for label, (calls, seconds) in sorted(self.spent.items(), key=lambda item: -item[1][1])]
        never = [label for label in wrapped if label not in self.spent]
        return lines + ([f"never called through its wrapper: {', '.join(never)}"] if never else [])


def drive(run_ids: list[int], approver) -> None:
    """Advance each run until it waits for its approval, approve every item, advance each run to its end."""
    from approvals import services as approvals
    from approvals.models import Interrupt
    from runs.base import selects
    from runs.engine import loop
    from runs.models import Run, RunStatus

    for run_id in run_ids:
        loop.advance(run_id)
    for run_id in run_ids:  # a run that did not come to its approval is left as it is (and counted so)
        for item in selects.select(Interrupt, {"run": run_id, "status": "pending"}):
            approvals.decide_interrupt(interrupt=item, user=approver, decision="approved")
    for run_id in run_ids:
        while selects.values_one(Run, {"pk": run_id}, ("status",))[0] == RunStatus.RUNNING:
            loop.advance(run_id)


def main() -> int:
    args = parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        print("cpu: needs DATABASE_URL of a PostgreSQL (bash bench/run.sh cpu ...)", file=sys.stderr)
        return 2
    port = free_port()
    prepare_django("cpu", {"GATEWAY_URL": f"http://127.0.0.1:{port}"})
    from django.contrib.auth import get_user_model

    from runs.engine.lifecycle import start_run
    from runs.models import Run

    users = get_user_model().objects
    requester, approver = users.get(username="requester"), users.get(username="approver")
    database = Database()
    gateway = Cluster(dict(os.environ), workers=0, threads=1, log_dir=Path(tempfile.mkdtemp(prefix="tollgate-cpu-")))
    try:
        gateway.start_gateway(port)
        wait_for(lambda: healthy(f"http://127.0.0.1:{port}/health"), 15, "gateway")

        def started(count: int) -> list[int]:
            return [start_run(agent=agent, user=requester, input=f"refund order {number}").pk
                    for number, agent in create_agents(count)]

        times, wrapped = FunctionTimes(), []
        if args.by_function:
            for module_name, names in TIMED:
                module = importlib.import_module(module_name)
                for name in names:
                    times.wrap(module, name)
                    wrapped.append(f"{module_name}.{name}")
        drive(started(args.warmup_runs), approver)
        run_ids = started(args.runs)
        times.spent.clear()
        database.reset()
        before, wall = os.times(), time.perf_counter()
        drive(run_ids, approver)
        wall, after = time.perf_counter() - wall, os.times()
        statements = database.statements_by_role()
        top = database.top_statements("", args.top_statements)
    finally:
        gateway.stop()
    steps = STEPS_PER_RUN * args.runs
    ended = collections.Counter(f"{status}/{outcome}" for status, outcome in
                                Run.objects.filter(pk__in=run_ids).values_list("status", "outcome"))
    print(f"cpu: {args.runs} runs of {STEPS_PER_RUN} steps in one process ({args.warmup_runs} warm-up runs first)")
    print(f"  runs_ended: {dict(ended)}")
    print(f"  cpu_ms_per_step: {1000 * (after.user - before.user + after.system - before.system) / steps:.2f} "
          f"(user {1000 * (after.user - before.user) / steps:.2f}, system {1000 * (after.system - before.system) / steps:.2f})")
    print(f"  wall_ms_per_step: {1000 * wall / steps:.2f}")
    if statements:  # the reset's and the count's own statements are in it: two of thousands
        print("  statements_per_step: " + ", ".join(
            f"{kind} {sum(counts[kind] for counts in statements.values()) / steps:.2f}" for kind in ("all", "data"))
              + " (the approvals' included)")
    else:
        print("  statements_per_step: not counted (pg_stat_statements unavailable)")
    if top:
        print(f"  top {len(top)} statements (calls per step):")
        for calls, query in top:
            print(f"    {calls / steps:5.2f}  {' '.join(query.split())[:220]}")
    if args.by_function:
        print("  by function (the thread's CPU while it ran, callees included; the wrapping adds its own):")
        for line in times.lines(steps, wrapped):
            print(f"    {line}")
    return 0 if set(ended) == {"completed/achieved"} else 1


if __name__ == "__main__":
    sys.exit(main())
