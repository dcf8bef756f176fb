"""Issue 10: one service error reads the same on every surface (config/error_display.py, config/api.py).

The same refusal from ``decide_interrupt`` is a 403 in the API, the 403
page in the browser and an error message in the admin, each with the
service's words; bad input lands on the form; other errors get the status
page with their own status.
"""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import ERROR
from django.test import RequestFactory
from django.urls import reverse

from approvals.models import Interrupt, InterruptStatus
from config.error_display import page_error
from runs.base.errors import IdempotencyKeyReused, SessionBusy
from tests.support.security import core_approval_item  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

REFUSAL = "You may not decide this item."


@pytest.fixture
def reviewer(people):
    """Staff who may look at the inbox in the admin (and so sees every run) but may not decide."""
    user = get_user_model().objects.create_user("reviewer", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_interrupt"))
    return user


def test_a_refusal_reads_the_same_in_the_api_the_pages_and_the_admin(people, api, client, reviewer, core_approval_item):
    item = core_approval_item
    from_api = api(reviewer).post(f"/api/interrupts/{item.pk}/approve/", {}, format="json")
    assert from_api.status_code == 403 and REFUSAL in from_api.content.decode()

    client.force_login(reviewer)
    page = client.post(reverse("inbox-item", args=[item.pk]), {"decision": "approved", "comment": ""})
    assert page.status_code == 403 and REFUSAL in page.content.decode()

    admin_page = client.post(reverse("admin:approvals_interrupt_changelist"),
                             {"action": "approve_selected", "_selected_action": [item.pk]}, follow=True)
    errors = [m.message for m in admin_page.context["messages"] if m.level == ERROR]
    assert errors == [f"Item {item.pk} was not approved: {REFUSAL}"]
    assert Interrupt.objects.get(pk=item.pk).status == InterruptStatus.PENDING


def test_bad_input_lands_on_the_form_field(people, client, core_approval_item):
    client.force_login(people["approver"])
    page = client.post(reverse("inbox-item", args=[core_approval_item.pk]),
                       {"decision": "approved", "edited_arguments": '{"account": "acme", "amount": -5}'})
    assert page.status_code == 400
    form = page.context["form"]
    assert [e[:17] for e in form.errors["edited_arguments"]] == ["Edited arguments "]  # the service's words
    assert not form.non_field_errors()
    assert Interrupt.objects.get(pk=core_approval_item.pk).status == InterruptStatus.PENDING


@pytest.mark.parametrize("error, status", [
    (lambda run: SessionBusy(run), 409),
    (lambda run: IdempotencyKeyReused(run.pk), 422),
])
def test_other_errors_get_the_status_page_with_their_own_status(core_approval_item, error, status):
    exc = error(core_approval_item.run)
    response = page_error(RequestFactory().get("/"), exc, back_url="/runs/")
    body = response.content.decode()
    assert response.status_code == status
    assert f"({status})" in body and exc.message in body and 'href="/runs/"' in body
