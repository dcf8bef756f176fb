"""Webhook URLs never reach this server, loopback, metadata or private addresses: refused when saved and when sent.

The address rules one by one (no database) are tests/unit/test_webhook_address_guard.py.
"""

import socket

import pytest

from runs.webhooks import urlguard
from runs.webhooks.models import WebhookDelivery, WebhookSubscription
from runs.webhooks.services import create_subscription
from runs.engine.lifecycle import start_run
from tests.support.api import error_of
from tests.support.core import asking_agent
from tests.support.webhooks import subscribe, wait_settled

PUBLIC = "https://93.184.216.34/hook"  # a public address literal: no DNS needed

REFUSED = [
    ("https://127.0.0.1/hook", "this server"),  # one of ALLOWED_HOSTS
    ("https://127.8.9.10:8443/hook", "loopback"),
    ("https://[::1]/hook", "loopback"),
    ("https://0.0.0.0/hook", "loopback"),
    ("https://[::ffff:127.0.0.1]/hook", "loopback"),
    ("https://[2002:7f00:1::1]/hook", "loopback"),  # 6to4 wrapping 127.0.0.1
    ("https://localhost/hook", "this server"),  # one of ALLOWED_HOSTS
    ("https://169.254.169.254/latest/meta-data/", "metadata"),
    ("https://[fd00:ec2::254]/latest/meta-data/", "metadata"),
    ("https://[fe80::1]/hook", "metadata"),
    ("https://10.0.0.5/hook", "private"),
    ("https://172.16.3.4/hook", "private"),
    ("https://192.168.1.10/hook", "private"),
    ("https://100.64.0.1/hook", "private"),
    ("https://[fd12:3456::1]/hook", "private"),
    ("https://224.0.0.1/hook", "multicast"),
    ("https://192.0.2.1/hook", "reserved"),
    ("https://no-such-host.invalid/hook", "could not be resolved"),
    ("http://93.184.216.34/hook", "plain http is off"),
    ("https://user:secret@93.184.216.34/hook", "user name or password"),
    ("ftp://93.184.216.34/hook", "valid http"),
    ("file:///etc/passwd", "valid http"),
    ("javascript:alert(1)", "valid http"),
    ("https://93.184.216.34:99999/hook", "not a valid port"),
    ("https://intranet/hook", "valid http"),
    ("not a url", "valid http"),
]


@pytest.mark.parametrize("url, reason", REFUSED)
def test_the_api_refuses_a_url_that_is_not_public_with_a_clear_400(people, api, url, reason):
    response = api(people["requester"]).post("/api/webhooks/", {"url": url}, format="json")

    message, = error_of(response, 400)["details"]["fields"]["url"]
    assert reason in message
    assert not WebhookSubscription.objects.exists()


def test_a_name_this_server_answers_to_is_refused_before_it_is_looked_up(people, settings):
    settings.ALLOWED_HOSTS = ["tollgate.example.com", ".internal.example.com"]
    for url in ["https://tollgate.example.com/hook", "https://api.internal.example.com/hook"]:
        with pytest.raises(urlguard.UnsafeURL, match="is this server"):
            create_subscription(owner=people["requester"], url=url)


def test_a_public_address_is_accepted(people, api):
    response = api(people["requester"]).post("/api/webhooks/", {"url": PUBLIC}, format="json")
    assert response.status_code == 201, response.json()


def test_changing_the_url_is_checked_the_same_way(people, api):
    client = api(people["requester"])
    created = client.post("/api/webhooks/", {"url": PUBLIC}, format="json").json()

    response = client.patch(f"/api/webhooks/{created['id']}/", {"url": "https://169.254.169.254/"}, format="json")
    assert "metadata" in error_of(response, 400)["details"]["fields"]["url"][0]
    assert WebhookSubscription.objects.get().url == PUBLIC


def test_private_networks_may_be_allowed_but_never_loopback_or_metadata(people, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOW_PRIVATE_NETWORKS": True}
    for url in ["https://10.0.0.5/hook", "https://192.168.1.10/hook", "https://[fd12:3456::1]/hook"]:
        create_subscription(owner=people["requester"], url=url)
    for url in ["https://127.0.0.1/hook", "https://169.254.169.254/", "https://[fd00:ec2::254]/",
                "https://localhost/hook"]:
        with pytest.raises(urlguard.UnsafeURL):
            create_subscription(owner=people["requester"], url=url)
    assert WebhookSubscription.objects.count() == 3


def test_an_operator_may_allow_named_hosts_and_networks(people, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": ["localhost", "10.9.0.0/16"]}
    create_subscription(owner=people["requester"], url="https://localhost:9000/hook")
    create_subscription(owner=people["requester"], url="https://10.9.4.2/hook")
    with pytest.raises(urlguard.UnsafeURL):
        create_subscription(owner=people["requester"], url="https://10.8.4.2/hook")


def test_a_url_allowed_when_saved_is_refused_at_delivery_once_it_is_not(people, worker, receiver, webhook_settings,
                                                                       settings):
    subscription = subscribe(people["requester"], receiver, "run.waiting")
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": []}
    start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme.")
    worker.drain()
    delivery, = wait_settled(subscription, 1)

    assert receiver.requests == []
    assert (delivery.status, delivery.attempt_count, delivery.last_status_code) == ("failed", 3, None)
    assert delivery.last_error.startswith("Refused: 127.0.0.1 is this server.")


def test_a_name_that_resolves_elsewhere_at_delivery_time_is_refused(people, worker, receiver, webhook_settings,
                                                                    settings, monkeypatch):
    """DNS rebinding: public when the subscription was saved, loopback when the delivery connects."""
    real_getaddrinfo = socket.getaddrinfo
    answers = {"rebind.test": "93.184.216.34"}

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "rebind.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]
        return real_getaddrinfo(host, port, *args, **kwargs)

    monkeypatch.setattr(urlguard.socket, "getaddrinfo", getaddrinfo)
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_ALLOWED_HOSTS": []}
    port = receiver.url.split(":")[2].split("/")[0]
    subscription = create_subscription(owner=people["requester"], url=f"http://rebind.test:{port}/hook",
                                       event_types=["run.waiting"])
    answers["rebind.test"] = "127.0.0.1"  # where the receiver listens
    start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme.")
    worker.drain()
    delivery, = wait_settled(subscription, 1)

    assert receiver.requests == []
    assert delivery.status == "failed"
    assert "rebind.test (127.0.0.1) is a loopback address" in delivery.last_error
    assert WebhookDelivery.objects.count() == 1
