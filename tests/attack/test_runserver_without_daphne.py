"""``manage.py runserver`` once ``daphne`` left ``INSTALLED_APPS``.

With the ``daphne`` app installed, ``runserver`` was Daphne's: it loaded
``config.asgi`` (WebSockets, the body limit, ``require_secret_key``). Now
it is ``django.contrib.staticfiles``' WSGI server, which loads none of
that: with DEBUG off and no ``SECRET_KEY`` it starts listening and answers
every request 500, where ``serve`` and every ASGI server refuse to start
(config.secret_key: "Whatever serves calls require_secret_key() before it
listens").
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_runserver_without_a_secret_key_refuses_to_start_as_serve_does(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "REDIS_URL")},
           "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
           "GATEWAY_URL": "http://192.0.2.1:9"}
    server = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{_free_port()}", "--noreload"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        out, err = server.communicate()
        raise AssertionError(f"runserver started serving without a SECRET_KEY (DEBUG off):\n{out}{err}") from None

    assert server.returncode != 0 and "SECRET_KEY must be set" in err
