"""A server or worker process settles its garbage collector once booted (``runs.base.collector``), in a child
process of its own, so this test process's collector is left as it is."""

import json
import subprocess
import sys
import textwrap

from runs.base.collector import YOUNGEST_THRESHOLD


def _child(code: str) -> dict:
    """Run ``code`` (which sets ``out``, a JSON-able dict) in a fresh Python with the test settings; ``out``."""
    program = "import json, gc\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.settings_nodemo"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_settling_freezes_what_is_alive_and_still_frees_later_cycles():
    out = _child("""
        import weakref
        from runs.base import collector

        before = (gc.get_freeze_count(), gc.get_threshold())
        collector.settle()

        class Node:
            pass

        freed = []
        node = Node(); node.self = node  # a cycle made after settling: only the collector frees it
        weakref.finalize(node, freed.append, True)
        del node
        gc.collect()
        out = {"before": before, "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(), "freed": freed}
    """)
    assert out["before"][0] == 0 and out["frozen"] > 1_000  # the interpreter's own modules, at least
    assert out["threshold"] == [YOUNGEST_THRESHOLD, out["before"][1][1], out["before"][1][2]]
    assert out["freed"] == [True]


def test_the_asgi_server_and_a_booted_worker_process_settle():
    out = _child("""
        import config.asgi  # what Daphne imports
        server = (gc.get_freeze_count(), gc.get_threshold()[0])
        from runs.base import collector
        again = collector.settle() or gc.get_freeze_count()  # a second call: nothing more frozen
        gc.unfreeze(); gc.set_threshold(700, 10, 10); collector._settled = False  # as a fresh worker process

        import dramatiq
        from runs.engine.worker_middleware import CollectorMiddleware

        broker = dramatiq.get_broker()
        settling = [m for m in broker.middleware if isinstance(m, CollectorMiddleware)]
        broker.emit_after("worker_boot", None)  # what dramatiq.Worker.start() sends once its threads run
        out = {"server": server, "again": again, "settling": len(settling),
               "worker": (gc.get_freeze_count(), gc.get_threshold()[0])}
    """)
    assert out["server"][0] > 10_000 and out["server"][1] == YOUNGEST_THRESHOLD
    assert out["again"] == out["server"][0]  # once per process
    assert out["settling"] == 1
    assert out["worker"][0] > 10_000 and out["worker"][1] == YOUNGEST_THRESHOLD
