"""Webhook URLs that slipped past the SSRF guard: IPv6 addresses outside global unicast.

Found by attacking the API: ``https://[::127.0.0.1]/`` (the deprecated
IPv4-compatible form of 127.0.0.1) and other IPv6 addresses outside
``2000::/3`` were accepted, because Python's ``is_global`` calls them
global. They are refused when saved and when a delivery connects; that
public ones stay allowed is tests/unit/test_webhook_address_guard.py.
"""

import socket

import pytest

from runs.webhooks import urlguard
from runs.webhooks.models import WebhookSubscription
from runs.webhooks.services import create_subscription
from tests.support.api import error_of
from runs.engine.lifecycle import start_run
from tests.support.core import asking_agent
from tests.support.webhooks import wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

NOT_GLOBAL_UNICAST = ["https://[::127.0.0.1]/hook", "https://[::169.254.169.254]/latest/meta-data/",
                      "https://[::10.0.0.1]/hook", "https://[::8.8.8.8]/hook", "https://[4000::1]/hook",
                      "https://[e000::1]/hook"]


@pytest.mark.parametrize("url", NOT_GLOBAL_UNICAST)
def test_ipv6_outside_global_unicast_is_refused_when_saved(people, api, url):
    response = api(people["requester"]).post("/api/webhooks/", {"url": url}, format="json")

    error = error_of(response, 400)
    assert error["code"] == "unsafe_url"
    assert "is a reserved or private address" in error["details"]["fields"]["url"][0]
    assert not WebhookSubscription.objects.exists()


def test_a_name_resolving_to_an_ipv4_compatible_loopback_is_refused_at_delivery(people, worker, receiver,
                                                                                 webhook_settings, settings,
                                                                                 monkeypatch):
    real_getaddrinfo = socket.getaddrinfo
    answers = {"compat.test": "93.184.216.34"}

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "compat.test":
            family = socket.AF_INET6 if ":" in answers[host] else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (answers[host], port))]
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(urlguard.socket, "getaddrinfo", getaddrinfo)
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": []}
    subscription = create_subscription(owner=people["requester"], url="http://compat.test:8443/hook",
                                       event_types=["run.waiting"])
    answers["compat.test"] = "::127.0.0.1"
    start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme.")
    worker.drain()
    delivery, = wait_settled(subscription, 1)

    assert receiver.requests == []
    assert (delivery.status, delivery.last_status_code) == ("failed", None)
    assert delivery.last_error.startswith("Refused: compat.test (::127.0.0.1) is a reserved or private address")
