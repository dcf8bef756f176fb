"""The demo shop: a plug-in app (label ``demo``) with orders, five tools, three completion checks,
a payment gateway of its own (a separate HTTP service) and ``manage.py demo``.

Nothing in the core imports it; it can leave ``INSTALLED_APPS`` (docs/design.md#plug-ins).
"""
