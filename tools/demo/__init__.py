"""The demo shop: a plug-in app (label ``demo``) with orders, five tools, three completion checks,
a payment gateway of its own (a separate HTTP service) and ``manage.py demo``.

Nothing in the core imports it; take ``tools.demo`` out of ``INSTALLED_APPS``
and the product runs without it (docs/design.md#plug-ins).
"""
