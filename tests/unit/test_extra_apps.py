"""Which apps run, from the environment: ``TOLLGATE_EXTRA_APPS`` adds an integrator's apps (and so their tools)
without a settings module of their own; ``TOLLGATE_DEMO=false`` leaves the demo shop out."""

import os
import subprocess
import sys

from django.conf import settings

SHOW = "from tools.registry import get_tool; print(get_tool('extra_echo') is not None)"


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("TOLLGATE_EXTRA_APPS", "TOLLGATE_DEMO")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=settings.BASE_DIR, capture_output=True, text=True,
                          env={**environment, "DJANGO_SETTINGS_MODULE": "config.settings", **env}, timeout=120)


def test_an_extra_app_registers_its_tools_when_named_and_only_then():
    added = manage("shell", "-c", SHOW, TOLLGATE_EXTRA_APPS="tests.support.extra_app")
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip().splitlines()[-1] == "True"
    assert manage("shell", "-c", SHOW).stdout.strip().splitlines()[-1] == "False"


def test_a_missing_extra_app_stops_the_start_with_its_name():
    missing = manage("check", TOLLGATE_EXTRA_APPS="no_such_integrator_app")
    assert missing.returncode != 0
    assert "no_such_integrator_app" in missing.stderr


def test_the_demo_shop_is_in_by_default_and_out_with_tollgate_demo_false():
    show = ("from django.apps import apps; from tools.registry import get_tool; "
            "print(apps.is_installed('tools.demo'), get_tool('refund') is not None)")
    assert manage("shell", "-c", show).stdout.strip().splitlines()[-1] == "True True"
    left_out = manage("shell", "-c", show, TOLLGATE_DEMO="false")
    assert left_out.returncode == 0, left_out.stderr
    assert left_out.stdout.strip().splitlines()[-1] == "False False"
