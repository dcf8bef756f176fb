"""The test settings without the demo app (``tools.demo``): the core product and the tests' own tools.

``TOLLGATE_DEMO=false`` is put in the environment before the settings read
it, so the processes a test starts (servers, workers, ``manage.py``) leave
the demo out too.
"""

import os

os.environ["TOLLGATE_DEMO"] = "false"

from tests.settings import *  # noqa: E402,F401,F403
