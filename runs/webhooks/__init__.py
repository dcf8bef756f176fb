"""Webhooks: tell an integrator's system what happened to runs, without polling (docs/design.md#webhooks).

A surface app (label ``webhooks``) reading ``runs.models.RunEvent``; nothing in the core imports it. Modules:
``events``, ``outbox``, ``delivery`` (signed posts, in order, retried), ``urlguard`` (no own-server/private targets).
"""
