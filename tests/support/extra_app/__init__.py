"""An integrator's app in a few lines, added with ``TOLLGATE_EXTRA_APPS`` (tests/unit/test_extra_apps.py)."""
