"""A plug-in's own kind of wait, in a test app: a run waits until a courier reports a parcel delivered.

It adds the kind ``delivery``, the tool ``wait_for_delivery`` that opens it
and the service ``report_delivery`` that settles it, with no migration and
nothing changed in ``runs/`` (tests/engine/test_waits_new_kind.py). The test
settings install it (``tests.support.courier_app.apps.CourierConfig``).
"""
