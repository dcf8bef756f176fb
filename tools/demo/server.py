"""The demo payment gateway as a companion of ``manage.py serve`` (through ``runs.serving``)."""

import subprocess
import sys
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from tools.demo import conf

# Hosts the gateway (an IPv4 server) can be started on here.
STARTABLE_HOSTS = ("127.0.0.1", "localhost")


def start_gateway_with_server(sender, stdout, **kwargs):
    """Start the demo payment gateway at ``GATEWAY_URL`` unless something already answers there.

    Only for a loopback ``GATEWAY_URL`` (anything else is another machine's
    to run); its ledger is ``GATEWAY_LEDGER`` (``tools.demo.conf``). Returns the
    callable that stops it (``process.terminate``), or None when nothing
    was started. A receiver of ``runs.serving.serve_starting``.
    """
    base = conf.gateway_url()
    url = urlsplit(base)
    if url.hostname not in STARTABLE_HOSTS:
        return None
    try:
        httpx.get(f"{base}/health", timeout=0.5)
        return None
    except httpx.TransportError:
        pass
    ledger = conf.gateway_ledger()
    ledger.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen([sys.executable, "-m", "tools.demo.gateway_server", "--host", url.hostname,
                                "--port", str(url.port or 80), "--ledger", str(ledger)], cwd=settings.BASE_DIR)
    stdout.write(f"Demo payment gateway started at {base} (ledger {ledger}).")
    return process.terminate
