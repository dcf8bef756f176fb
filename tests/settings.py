"""Settings for the test suite: ``config.settings`` as production has them, with a key made per run.

Plus the tests' own small tools (``tests.support.fake_tools``), installed as a
plug-in app beside the demo's, and a plug-in's own kind of wait
(``tests.support.courier_app``).

DEBUG stays off (the default), so tests see what users see. The key and
high throttle rates are put in the environment before the settings read
them, so the processes a test starts (workers, servers, ``manage.py``
commands) inherit them; so is a flight recorder directory of the run's own
(``runs.base.flight_recorder``), so that suites side by side never read or
remove each other's.
"""

import os
import tempfile

from django.core.management.utils import get_random_secret_key

os.environ.setdefault("SECRET_KEY", get_random_secret_key())
# Throttle rates far above what any test sends (servers a test starts inherit them);
# the throttle tests set low rates of their own.
for _rate in ("THROTTLE_USER", "THROTTLE_ANON", "THROTTLE_RUNS", "THROTTLE_WS_TOKEN", "THROTTLE_WS_ADDRESS"):
    os.environ.setdefault(_rate, "100000/min")
os.environ.setdefault("TOLLGATE_FLIGHT_RECORDER_DIR", tempfile.mkdtemp(prefix="tollgate-flight-recorder-"))

from config.settings import *  # noqa: E402,F401,F403
from config.settings import INSTALLED_APPS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.fake_tools.FakeToolsConfig", "tests.support.courier_app.apps.CourierConfig"]
