"""The engine: what advances runs and ends them (``loop``, ``state``, ``lifecycle``, ``recovery``, ``sweep_jobs``, ``actors``).

It may import the approvals and tools services and the runs kernel; nothing below imports it
(docs/design.md#layers, enforced by tests/unit/test_layers.py).
"""
