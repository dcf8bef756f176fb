"""Settings for drawing the state machines: the project's own, plus django-fsm-2's app.

``manage.py graph_transitions`` is a command of the ``django_fsm`` app,
which the product does not install; this module adds it for that one
command (see the README: "Regenerate the state-machine drawings").
"""

from config.settings import *  # noqa: F401,F403
from config.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "django_fsm"]
