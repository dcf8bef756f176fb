"""The test settings without the demo app (``tools.demo``): the core product and the tests' fake tools."""

from tests.settings import *  # noqa: F401,F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "tools.demo"]
