"""Who may decide an item, after the decision path stopped asking the database for it: the in-memory rule
(``runs.access.may_decide`` / ``flag_decidable``), a user's permissions read in one statement
(``runs.permissions.PermissionsBackend``), the decider checked again under the lock (``approvals.services._lock_item``), and
output serializers whose fields are built once per class (``config.api.OutputSerializer``).

A right taken away between two requests counts from the second; four eyes, questions, inactive and
concurrent deciders hold; the cloned fields answer as DRF's own for item after item and user after user."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client
from rest_framework import serializers
from rest_framework.test import APIRequestFactory

from approvals.api import items as items_api
from approvals.api.serializers import InterruptSerializer
from approvals.models import Interrupt, InterruptKind
from approvals.services import decide_interrupt
from runs.access import DECIDE_PERMISSION, may_decide
from runs.base.errors import Forbidden
from runs.engine.lifecycle import start_run
from tests.support.api import all_at_once
from tests.support.core import pending_transfer
from tests.support.durability import make_agent
from tests.support.security import core_approval_item  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)

User = get_user_model()


def _decide_perm():
    return Permission.objects.get(codename="decide_interrupt", content_type__app_label="approvals")


def _approve(client, item):
    return client.post(f"/api/interrupts/{item.pk}/approve/", {"comment": "ok"}, format="json")


def _status(item) -> str:
    return Interrupt.objects.get(pk=item.pk).status


@pytest.fixture
def question(people, worker) -> Interrupt:
    """A pending question (ask_user) of a run of people["requester"]."""
    agent = make_agent("asker", [{"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which one?"}}]},
                                 {"content": "Thanks."}], tools=["ask_user"])
    run = start_run(agent=agent, user=people["requester"], input="Ask me.")
    worker.drain()
    return Interrupt.objects.get(run=run, kind=InterruptKind.INPUT, status="pending")


# --- permission revoked between two requests -----------------------------------------------------------------

def test_group_membership_removed_between_requests_is_404(people, api):
    item = pending_transfer(requester=people["requester"])
    client = api(people["approver"])
    assert client.get(f"/api/interrupts/{item.pk}/").json()["can_decide"] is True
    people["approver"].groups.clear()
    assert _approve(client, item).status_code == 404  # no longer sees others' runs either
    assert _status(item) == "pending"


def test_direct_permission_revoked_between_requests_is_404_or_403_for_staff(people, api):
    item = pending_transfer(requester=people["requester"])
    direct = User.objects.create_user("direct")
    direct.user_permissions.add(_decide_perm())
    staff = User.objects.create_user("staffer", is_staff=True)
    staff.user_permissions.add(_decide_perm())
    assert api(direct).get(f"/api/interrupts/{item.pk}/").json()["can_decide"] is True
    direct.user_permissions.clear()
    assert _approve(api(direct), item).status_code == 404
    staff.user_permissions.clear()  # staff still sees every run: 403, not 404
    assert _approve(api(staff), item).status_code == 403
    assert _status(item) == "pending"


def test_group_loses_the_permission_between_requests_is_403_for_staff_member(people, api):
    item = pending_transfer(requester=people["requester"])
    staff = User.objects.create_user("staffer", is_staff=True)
    staff.groups.add(Group.objects.get(name="approvers"))
    assert api(staff).get(f"/api/interrupts/{item.pk}/").json()["can_decide"] is True
    Group.objects.get(name="approvers").permissions.clear()
    assert _approve(api(staff), item).status_code == 403
    assert _status(item) == "pending"


# --- permission revoked within one request (after the lookup, before the lock) ---------------------------------

def _revoke_before_service(monkeypatch, revoke):
    real = items_api.decide_interrupt

    def revoking(**kwargs):
        revoke()
        return real(**kwargs)

    monkeypatch.setattr(items_api, "decide_interrupt", revoking)






def test_requester_with_the_permission_may_not_approve_own_item_api_or_web(people, api, core_approval_item):
    requester = people["requester"]
    requester.groups.add(Group.objects.get(name="approvers"))
    assert _approve(api(requester), core_approval_item).status_code == 403
    web = Client()
    web.force_login(requester)
    response = web.post(f"/inbox/{core_approval_item.pk}/", {"decision": "approved", "comment": "mine"})
    assert response.status_code == 403
    assert _status(core_approval_item) == "pending"
    # and the service itself, with a fresh user object and with one whose flag was faked
    fresh = User.objects.get(pk=requester.pk)
    forged = Interrupt.objects.get(pk=core_approval_item.pk)
    forged.user_may_decide, forged.decidable_flag_for = True, fresh.pk  # can_decide trusts it: the lock must not
    with pytest.raises(Forbidden):
        decide_interrupt(interrupt=forged, user=fresh, decision="approved", comment="")
    assert _status(core_approval_item) == "pending"


def test_superuser_requester_may_not_approve_own_four_eyes_item(people, api, idle_worker):
    admin = people["admin"]
    item = pending_transfer(requester=admin)
    assert _approve(api(admin), item).status_code == 403
    assert _approve(api(people["approver"]), item).status_code == 200


# --- questions ---------------------------------------------------------------------------------------------------

def test_question_not_answerable_by_an_approver_but_by_staff_and_requester(people, api, question):
    url = f"/api/interrupts/{question.pk}/respond/"
    assert api(people["approver"]).post(url, {"answer": "x"}, format="json").status_code == 403
    superuser_not_staff = User.objects.create_user("su", is_superuser=True, is_staff=False)
    assert api(superuser_not_staff).post(url, {"answer": "x"}, format="json").status_code == 403
    stranger = User.objects.create_user("stranger")
    assert api(stranger).post(url, {"answer": "x"}, format="json").status_code == 404
    staff = User.objects.create_user("staffer", is_staff=True)
    assert api(staff).post(url, {"answer": "by staff"}, format="json").status_code == 200
    assert api(people["requester"]).post(url, {"answer": "again"}, format="json").status_code == 409


def test_in_memory_rule_equals_sql_for_a_staff_superuser_and_odd_users(people, question, core_approval_item):
    su_not_staff = User.objects.create_user("su", is_superuser=True, is_staff=False)
    staff = User.objects.create_user("staffer", is_staff=True)
    odd = User.objects.create_user("odd")
    odd.user_permissions.add(_decide_perm())
    inactive_su = User.objects.create_user("isu", is_superuser=True, is_staff=True, is_active=False)
    for user in (su_not_staff, staff, odd, inactive_su, *people.values()):
        for item in Interrupt.objects.select_related("run"):
            fresh = User.objects.get(pk=user.pk)
            sql = Interrupt.objects.decidable_by(fresh).filter(pk=item.pk).exists()
            memory = may_decide(User.objects.get(pk=user.pk), item, requested_by_id=item.run.requested_by_id)
            assert sql == memory, (user.username, item.kind)


# --- inactive -------------------------------------------------------------------------------------------------------

def test_inactive_approver_decides_nothing(people, api):
    item = pending_transfer(requester=people["requester"])
    approver = people["approver"]
    User.objects.filter(pk=approver.pk).update(is_active=False)
    assert _approve(api(approver), item).status_code in (401, 403, 404)
    stale = Interrupt.objects.get(pk=item.pk)
    inactive = User.objects.get(pk=approver.pk)
    stale.user_may_decide, stale.decidable_flag_for = True, inactive.pk
    with pytest.raises(Forbidden):
        decide_interrupt(interrupt=stale, user=inactive, decision="approved", comment="")
    assert _status(item) == "pending"


# --- stale permission caches on a reused user object (a long-lived process, a socket's user) ---------------------

def test_reused_user_object_keeps_stale_permissions_as_django_does(people):
    """Documents (not a regression): a user object read once keeps its permissions, as with ModelBackend's
    own caches (``runs.permissions`` keeps them on the object too)."""
    item = pending_transfer(requester=people["requester"])
    approver = User.objects.get(pk=people["approver"].pk)
    assert may_decide(approver, item, requested_by_id=item.run.requested_by_id)
    people["approver"].groups.clear()
    assert approver.has_perm(DECIDE_PERMISSION) is True  # the backend's cache, same object
    assert may_decide(approver, item, requested_by_id=item.run.requested_by_id) is True
    assert may_decide(User.objects.get(pk=approver.pk), item, requested_by_id=item.run.requested_by_id) is False


# --- concurrency and 409 --------------------------------------------------------------------------------------------

def test_two_approvers_at_once_one_wins_the_other_409(people, api):
    item = pending_transfer(requester=people["requester"])
    second = User.objects.create_user("approver2")
    second.groups.add(Group.objects.get(name="approvers"))
    clients = [api(people["approver"]), api(second)]
    answers = all_at_once(2, lambda n: _approve(clients[n], item).status_code)
    assert sorted(answers) == [200, 409], answers
    assert _status(item) == "resolved"
    assert _approve(clients[0], item).status_code == 409


def test_approve_and_revoke_at_once_never_both(people, api):
    """A decision racing its decider's removal from the group: either it was decided, or it is 403/404."""
    item = pending_transfer(requester=people["requester"])
    client = api(people["approver"])

    def go(n):
        if n == 0:
            return _approve(client, item).status_code
        people["approver"].groups.clear()
        return None

    status = all_at_once(2, go)[0]
    assert status in (200, 403, 404)
    assert (_status(item) == "resolved") == (status == 200)


# --- the serializer's cloned fields ----------------------------------------------------------------------------------

class _FreshInterruptSerializer(InterruptSerializer):
    def get_fields(self):
        return serializers.ModelSerializer.get_fields(self)  # DRF's own, built for this serializer


def test_cloned_fields_answer_as_drf_for_items_and_users_in_a_row(people, question, core_approval_item):
    factory = APIRequestFactory()
    items = list(Interrupt.objects.select_related("run", "tool_call", "resolved_by", "answer_file").order_by("pk"))
    assert len(items) >= 2
    outputs = []
    for user in (people["approver"], people["requester"], people["admin"], people["approver"]):
        request = factory.get("/")
        request.user = User.objects.get(pk=user.pk)
        for item in items + items[::-1]:
            item = Interrupt.objects.select_related("run", "tool_call", "resolved_by", "answer_file").get(pk=item.pk)
            cloned = InterruptSerializer(item, context={"request": request}).data
            fresh = _FreshInterruptSerializer(item, context={"request": request}).data
            assert cloned == fresh, (user.username, item.kind)
            outputs.append((user.username, item.pk, cloned["can_decide"]))
        many = InterruptSerializer(items, many=True, context={"request": request}).data
        assert list(many) == list(_FreshInterruptSerializer(items, many=True, context={"request": request}).data)
    # can_decide follows the request's user, not the first serializer built
    by = {(name, pk): flag for name, pk, flag in outputs}
    assert by[("approver", core_approval_item.pk)] is True and by[("requester", core_approval_item.pk)] is False
    assert by[("requester", question.pk)] is True and by[("approver", question.pk)] is False
