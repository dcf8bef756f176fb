"""The engine: what advances runs and ends them.

The agent loop (``loop``, with what it keeps between passes: ``state``), the run lifecycle (``lifecycle``: start, begin,
end, cancel), takeover recovery and blame (``recovery``), the sweeper's jobs (``sweep_jobs``), the
Dramatiq actor (``actors``), and what they consult: context building,
completion checks, budgets, agent definitions. The engine may import the
approvals and tools services and the runs kernel below it; nothing below
imports the engine (docs/design.md#layers; enforced by tests/unit/test_layers.py).
"""
