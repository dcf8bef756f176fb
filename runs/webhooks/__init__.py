"""Webhooks: tell an integrator's system what happened to runs, without polling.

A Django app of its own (label ``webhooks``) in the surface layer: it reads
the kernel's append-only event log (``runs.models.RunEvent``) and nothing in
the core imports it. How an event travels (docs/design.md#webhooks):

1. ``outbox``: a post-save receiver on ``RunEvent`` adds an ``OutboxEntry``
   for every event that maps to a webhook type (``events``), in the
   transaction that appends the event, so a crash after the run's commit
   loses nothing;
2. ``outbox.dispatch`` turns entries into one ``WebhookDelivery`` per
   matching subscription (woken after commit, and by the sweeper);
3. ``delivery`` posts each delivery, signed (Standard Webhooks), in event
   order per run and subscription, retrying on its own schedule;
4. ``urlguard`` keeps subscriptions away from this server and private
   networks, when they are saved and again at every connection.
"""
