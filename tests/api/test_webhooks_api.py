"""The webhooks API and admin: own subscriptions only, the secret shown once, deliveries readable and sent again."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from runs.webhooks.models import EventType, WebhookDelivery, WebhookSubscription
from tests.support.api import error_of, field_errors
from tests.support.core import transfer_needing_approval
from tests.support.webhooks import wait_settled, wait_until


@pytest.fixture
def subscribed(people, api, receiver, webhook_settings):
    """The requester's subscription to run.waiting, created through the API: ``(client, created JSON)``."""
    client = api(people["requester"])
    response = client.post("/api/webhooks/", {"url": receiver.url, "event_types": ["run.waiting"]}, format="json")
    assert response.status_code == 201, response.json()
    return client, response.json()


def test_the_secret_is_in_the_creation_answer_and_nowhere_after(people, worker, subscribed, receiver):
    client, created = subscribed
    secret = created["secret"]
    assert secret.startswith("whsec_") and len(secret) == len("whsec_") + 44
    assert created["event_types"] == ["run.waiting"] and created["active"] is True

    transfer_needing_approval(people["requester"])
    worker.drain()
    delivery, = wait_settled(WebhookSubscription.objects.get(pk=created["id"]), 1)
    answers = [
        client.get("/api/webhooks/"),
        client.get(f"/api/webhooks/{created['id']}/"),
        client.patch(f"/api/webhooks/{created['id']}/", {"active": True}, format="json"),
        client.get(f"/api/webhooks/{created['id']}/deliveries/"),
        client.get(f"/api/webhooks/deliveries/{delivery.pk}/"),
        client.post(f"/api/webhooks/deliveries/{delivery.pk}/redeliver/", {}, format="json"),
    ]
    for response in answers:
        assert response.status_code in (200, 202), response.content
        assert secret.encode() not in response.content and b"secret" not in response.content
    assert secret.encode() not in receiver.requests[0]["body"]
    assert WebhookSubscription.objects.get(pk=created["id"]).secret == secret  # kept to sign with


def test_two_subscriptions_get_different_secrets(subscribed, receiver):
    client, first = subscribed
    second = client.post("/api/webhooks/", {"url": receiver.url}, format="json").json()
    assert first["secret"] != second["secret"]
    assert second["event_types"] == sorted(EventType.values)  # omitted: every type


def test_deliveries_are_listed_with_the_answer_and_can_be_sent_again(people, worker, subscribed, receiver):
    client, created = subscribed
    receiver.answer(500)
    transfer_needing_approval(people["requester"])
    worker.drain()
    wait_settled(WebhookSubscription.objects.get(pk=created["id"]), 1)

    listed = client.get(f"/api/webhooks/{created['id']}/deliveries/").json()["results"]
    assert len(listed) == 1
    delivery = listed[0]
    assert (delivery["event_type"], delivery["status"], delivery["attempt_count"]) == ("run.waiting", "delivered", 2)
    assert (delivery["last_status_code"], delivery["last_response"]) == (200, "answered 200")
    assert delivery["payload"]["type"] == "run.waiting"
    assert client.get(f"/api/webhooks/{created['id']}/deliveries/", {"status": "failed"}).json()["results"] == []
    assert client.get(f"/api/webhooks/{created['id']}/deliveries/", {"status": "nope"}).status_code == 400

    response = client.post(f"/api/webhooks/deliveries/{delivery['id']}/redeliver/", format="json")
    assert response.status_code == 202, response.json()
    assert (response.json()["status"], response.json()["attempt_count"]) == ("pending", 0)
    receiver.wait_for(3)
    again = wait_until(lambda: (d := WebhookDelivery.objects.get(pk=delivery["id"])).status == "delivered" and d)
    assert again.attempt_count == 1
    assert receiver.requests[2]["headers"]["webhook-id"] == receiver.requests[0]["headers"]["webhook-id"]
    assert receiver.requests[2]["body"] == receiver.requests[0]["body"]


def test_another_users_subscriptions_and_deliveries_are_404(people, worker, api, subscribed):
    _, created = subscribed
    transfer_needing_approval(people["requester"])
    worker.drain()
    delivery, = wait_settled(WebhookSubscription.objects.get(pk=created["id"]), 1)
    other = api(people["approver"])

    assert other.get("/api/webhooks/").json()["results"] == []
    assert other.get(f"/api/webhooks/{created['id']}/").status_code == 404
    assert other.patch(f"/api/webhooks/{created['id']}/", {"active": False}, format="json").status_code == 404
    assert other.delete(f"/api/webhooks/{created['id']}/").status_code == 404
    assert other.get(f"/api/webhooks/{created['id']}/deliveries/").status_code == 404
    assert other.get(f"/api/webhooks/deliveries/{delivery.pk}/").status_code == 404
    assert other.post(f"/api/webhooks/deliveries/{delivery.pk}/redeliver/").status_code == 404
    assert WebhookSubscription.objects.get(pk=created["id"]).active is True
    assert api(people["requester"]).delete(f"/api/webhooks/{created['id']}/").status_code == 204
    assert not WebhookDelivery.objects.exists()


@pytest.mark.parametrize("body, field", [
    ({"url": "https://93.184.216.34/", "event_types": ["run.exploded"]}, "event_types"),
    ({"url": "https://93.184.216.34/", "event_types": []}, "event_types"),
    ({"url": "https://93.184.216.34/", "event_types": "run.waiting"}, "event_types"),
    ({"url": "https://93.184.216.34/", "secret": "whsec_mine"}, "secret"),
    ({"url": "https://93.184.216.34/", "owner": 1}, "owner"),
    ({"event_types": ["run.waiting"]}, "url"),
    ({"url": "https://93.184.216.34/" + "a" * 2000}, "url"),
])
def test_bad_bodies_are_refused_field_by_field(people, api, body, field):
    response = api(people["requester"]).post("/api/webhooks/", body, format="json")
    assert field in field_errors(response)
    assert not WebhookSubscription.objects.exists()


def test_subscriptions_per_user_are_bounded(people, api, settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "WEBHOOK_MAX_SUBSCRIPTIONS_PER_USER": 2}
    client = api(people["requester"])
    for _ in range(2):
        assert client.post("/api/webhooks/", {"url": "https://93.184.216.34/"}, format="json").status_code == 201
    response = client.post("/api/webhooks/", {"url": "https://93.184.216.34/"}, format="json")
    assert "the most allowed" in error_of(response, 400)["message"]
    assert WebhookSubscription.objects.count() == 2


def test_a_delivery_being_sent_cannot_be_queued_again(people, api, subscribed):
    client, created = subscribed
    delivery = WebhookDelivery.objects.create(
        subscription_id=created["id"], event_id=1, event_type="run.waiting", run_id=1, event_seq=1, payload={},
        next_attempt_at=timezone.now(), claimed_until=timezone.now() + timedelta(minutes=1))
    response = client.post(f"/api/webhooks/deliveries/{delivery.pk}/redeliver/")
    assert "being sent right now" in error_of(response, 409)["message"]


def test_the_admin_shows_answers_hides_the_secret_and_sends_again(people, worker, subscribed, receiver):
    _, created = subscribed
    receiver.answer(418, 418, 418)  # every attempt of the schedule
    transfer_needing_approval(people["requester"])
    worker.drain()
    subscription = WebhookSubscription.objects.get(pk=created["id"])
    delivery, = wait_settled(subscription, 1)
    assert (delivery.status, delivery.last_status_code) == ("failed", 418)
    admin = Client()
    admin.force_login(people["admin"])

    page = admin.get("/admin/webhooks/webhookdelivery/")
    assert page.status_code == 200 and b"answered 418" in page.content
    page = admin.get(f"/admin/webhooks/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200 and b"answered 418" in page.content
    page = admin.get(f"/admin/webhooks/webhooksubscription/{subscription.pk}/change/")
    assert page.status_code == 200 and subscription.secret.encode() not in page.content
    assert admin.get("/admin/webhooks/webhooksubscription/add/").status_code == 403

    response = admin.post("/admin/webhooks/webhookdelivery/", {
        "action": "redeliver_selected", "_selected_action": [delivery.pk]}, follow=True)
    assert b"Queued 1 delivery again." in response.content
    receiver.wait_for(4)
    assert wait_until(lambda: WebhookDelivery.objects.get(pk=delivery.pk).status == "delivered")


def test_the_admin_switches_a_subscription_off(people, subscribed):
    _, created = subscribed
    admin = Client()
    admin.force_login(people["admin"])
    response = admin.post(f"/admin/webhooks/webhooksubscription/{created['id']}/change/", {})
    assert response.status_code == 302
    assert WebhookSubscription.objects.get(pk=created["id"]).active is False


def test_anonymous_requests_are_refused(people):
    anonymous = Client()
    assert anonymous.get("/api/webhooks/").status_code in (401, 403)
    assert anonymous.post("/api/webhooks/", {"url": "https://93.184.216.34/"},
                          content_type="application/json").status_code in (401, 403)
    assert not get_user_model().objects.filter(webhook_subscriptions__isnull=False).exists()


def test_fuzzed_subscription_bodies_never_500_and_save_nothing_on_4xx(people, api):
    client = api(people["requester"])
    created = client.post("/api/webhooks/", {"url": "https://93.184.216.34/"}, format="json").json()
    text = st.text(max_size=40) | st.sampled_from(["\x00", "https://93.184.216.34/\x00", "https://[::1", "https://"
                                                   + "a" * 300 + ".com/", "https://xn--/", "https://.../"])
    value = st.recursive(st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | text,
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                         max_leaves=6)
    fields = {"url": text | value, "event_types": st.lists(st.sampled_from(["run.waiting", "x"]) | value,
                                                          max_size=3) | value, "active": value}
    bodies = st.fixed_dictionaries({}, optional=fields).map(json.dumps) | value.map(json.dumps) | text

    @hypothesis_settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(body=bodies, method=st.sampled_from(["post", "patch"]))
    @example(body='{"url": "https://93.184.216.34/", "event_types": ["run.waiting"], "active": NaN}', method="post")
    @example(body="[" * 1000 + "]" * 1000, method="patch")
    def attempt(body, method):
        cache.clear()
        url = "/api/webhooks/" if method == "post" else f"/api/webhooks/{created['id']}/"
        before = list(WebhookSubscription.objects.values_list("id", "url", "event_types", "active"))
        response = getattr(client, method)(url, data=body.encode("utf-8", "surrogatepass"),
                                           content_type="application/json")
        assert response.status_code < 500
        if response.status_code >= 400:
            assert list(WebhookSubscription.objects.values_list("id", "url", "event_types", "active")) == before
        WebhookSubscription.objects.exclude(pk=created["id"]).delete()

    attempt()
