"""The demo's payment gateway (``tools.demo.gateway_server``) as a process of its own on loopback."""

import subprocess
import sys
import time

import httpx

from tests.support.processes import free_port


class GatewayProcess:
    """The demo payment gateway running as its own process on loopback: ``url``, ``start()``, ``stop()``."""

    def __init__(self, tmp_dir):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ledger_path = str(tmp_dir / "gateway-ledger.sqlite3")
        self.process = None

    def start(self) -> None:
        """Start it and wait until ``/health`` answers; ``RuntimeError`` after 10 s."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tools.demo.gateway_server", "--port", str(self.port), "--ledger", self.ledger_path],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/health", timeout=0.5)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("payment gateway did not start")

    def ensure_running(self) -> None:
        """Restart the gateway if a test crashed it on purpose."""
        if self.process.poll() is not None:
            self.start()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def reset(self) -> None:
        """A fresh ledger, no faults."""
        httpx.post(f"{self.url}/reset", timeout=5).raise_for_status()

    def faults(self, **faults) -> None:
        """Set fault injection (see ``tools/demo/gateway_server.py``)."""
        httpx.post(f"{self.url}/faults", json=faults, timeout=5).raise_for_status()

    def ledger(self) -> dict:
        """The gateway's ledger, as ``tools.demo.gateway.ledger`` reads it."""
        from tools.demo import gateway

        return gateway.ledger()
