"""Settings for the test suite: ``config.settings`` as production has them, with a key made per run.

DEBUG stays off (the default), so tests see what users see. The key is
put in the environment before the settings read it, so the processes a
test starts (workers, servers, ``manage.py`` commands) inherit it.
"""

import os

from django.core.management.utils import get_random_secret_key

os.environ.setdefault("SECRET_KEY", get_random_secret_key())

from config.settings import *  # noqa: E402,F401,F403
