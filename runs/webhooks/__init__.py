"""Webhooks: tell an integrator's system what happened to runs, without polling (docs/design.md#webhooks).

A surface app (label ``webhooks``) reading the kernel's event log
(``runs.models.RunEvent``); nothing in the core imports it. Modules:
``events`` (event types), ``outbox`` (an entry per mapped event, then one
delivery per subscription), ``delivery`` (signed posts, in order, retried),
``urlguard`` (subscriptions kept away from this server and private networks).
"""
