"""A travel company's Tollgate plug-in: three tools, a completion check and a fake booking backend.

The example of docs/integrating.md. Add it to an installed Tollgate with
``TOLLGATE_EXTRA_APPS=examples.bookings`` (run from a checkout, where
``examples`` is importable); nothing in the product imports it.
"""
