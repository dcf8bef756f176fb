"""Attacks on the approval decision path (EventBatch, the trusted ``user_may_decide`` flag, the ASGI chain)."""

import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.authtoken.models import Token

from approvals.models import Interrupt
from approvals.services import decide_interrupt
from runs.base.errors import Forbidden
from runs.models import Run
from tools.models import ToolCall
from django_fsm import TransitionNotAllowed
from tests.support.security import core_approval_item, stored_state  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _seqs_gapless(run_id: int) -> list[int]:
    # The run first: a worker may log more meanwhile (PostgreSQL runs), never fewer.
    run = Run.objects.get(pk=run_id)
    seqs = list(run.events.filter(seq__lte=run.last_event_seq).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, run.last_event_seq + 1)), seqs
    return seqs


def _second_decider():
    other = get_user_model().objects.create_user("approver2")
    other.user_permissions.add(Permission.objects.get(codename="decide_interrupt", content_type__app_label="approvals"))
    return get_user_model().objects.get(pk=other.pk)


def test_a_decision_logs_item_call_and_run_events_in_order_with_gapless_seqs(people, core_approval_item, api, worker):
    before = _seqs_gapless(core_approval_item.run_id)
    response = api(people["approver"]).post(f"/api/interrupts/{core_approval_item.pk}/approve/", {"comment": "ok"},
                                          format="json")
    assert response.status_code == 200, response.content
    after = _seqs_gapless(core_approval_item.run_id)
    new = list(Run.objects.get(pk=core_approval_item.run_id).events.filter(seq__gt=before[-1]).order_by("seq")
               .values_list("type", "from_status", "to_status"))[:3]  # a worker may log more meanwhile
    assert new == [("interrupt", "pending", "resolved"), ("tool_call", "awaiting_approval", "ready"),
                   ("transition", "waiting", "running")], new
    assert len(after) >= len(before) + 3
    worker.drain()  # the decision queued the run's wake-up: it goes on to its end
    assert Run.objects.get(pk=core_approval_item.run_id).status == "completed"
    _seqs_gapless(core_approval_item.run_id)


def test_two_deciders_with_items_loaded_before_either_decided_apply_one_decision(people, core_approval_item):
    # Both load the item with their flag (as their requests' lookups do), then decide one after the other.
    from approvals.selectors import interrupt_get_visible

    other = _second_decider()
    first = interrupt_get_visible(user=people["approver"], interrupt_id=core_approval_item.pk)
    second = interrupt_get_visible(user=other, interrupt_id=core_approval_item.pk)
    decide_interrupt(interrupt=first, user=people["approver"], decision="approved")
    fields = ("status", "decision", "resolved_by", "comment")
    decided = Interrupt.objects.values_list(*fields).get(pk=core_approval_item.pk)
    item_events = Run.objects.get(pk=core_approval_item.run_id).events.filter(type="interrupt").count()
    with pytest.raises(TransitionNotAllowed):
        decide_interrupt(interrupt=second, user=other, decision="rejected", comment="no")
    # (the run itself may move on meanwhile: a worker runs the approved call)
    assert Interrupt.objects.values_list(*fields).get(
        pk=core_approval_item.pk) == decided == ("resolved", "approved", people["approver"].pk, "")
    assert Run.objects.get(pk=core_approval_item.run_id).events.filter(type="interrupt").count() == item_events
    assert not ToolCall.objects.filter(pk=core_approval_item.tool_call_id, status="rejected").exists()
    _seqs_gapless(core_approval_item.run_id)


def test_a_flag_loaded_for_one_user_is_not_trusted_for_another(people, core_approval_item):
    from approvals.selectors import interrupt_get_visible

    item = interrupt_get_visible(user=people["approver"], interrupt_id=core_approval_item.pk)
    assert item.user_may_decide
    state = stored_state()
    with pytest.raises(Forbidden):
        decide_interrupt(interrupt=item, user=people["requester"], decision="approved")
    assert stored_state() == state


def test_a_decider_revoked_after_the_item_lookup_cannot_decide(people, core_approval_item):
    from approvals.selectors import interrupt_get_visible

    other = _second_decider()
    item = interrupt_get_visible(user=other, interrupt_id=core_approval_item.pk)
    assert item.user_may_decide
    other.user_permissions.clear()
    revoked = get_user_model().objects.get(pk=other.pk)  # fresh: no cached permissions
    state = stored_state()
    with pytest.raises(Forbidden):
        decide_interrupt(interrupt=item, user=revoked, decision="approved")
    assert stored_state() == state


def _asgi(method, path, *, body=b"", headers=()):
    from config.asgi import application

    communicator = HttpCommunicator(application, method, path, body=body,
                                    headers=[(b"host", b"testserver"), *headers])
    return async_to_sync(communicator.get_response)(timeout=10)


@pytest.mark.parametrize("body,content_type", [
    (b'{"comment": ', b"application/json"),
    (b'{"arguments": "not an object"}', b"application/json"),
    (b'{"arguments": {"account": 123, "amount": "lots"}}', b"application/json"),
    (json.dumps({"comment": "x" * 200_000}).encode(), b"application/json"),
    (b"\xff\xfe\x00garbage", b"application/json"),
    (b"<xml/>", b"application/xml"),
    (b'[1, 2]', b"application/json"),
])
def test_bad_approval_bodies_over_asgi_are_4xx_and_change_nothing(people, core_approval_item, body, content_type):
    token = Token.objects.get_or_create(user=people["approver"])[0].key
    state = stored_state()
    response = _asgi("POST", f"/api/interrupts/{core_approval_item.pk}/approve/", body=body, headers=[
        (b"authorization", f"Token {token}".encode()), (b"content-type", content_type),
        (b"content-length", str(len(body)).encode())])
    assert 400 <= response["status"] < 500, (response["status"], response["body"][:300])
    assert stored_state() == state


def test_a_requester_cannot_approve_their_own_four_eyes_item_over_asgi(people, core_approval_item):
    Interrupt.objects.filter(pk=core_approval_item.pk).update(allow_requester=False)
    requester = people["requester"]
    requester.user_permissions.add(Permission.objects.get(codename="decide_interrupt",
                                                          content_type__app_label="approvals"))
    token = Token.objects.get_or_create(user=requester)[0].key
    state = stored_state()
    response = _asgi("POST", f"/api/interrupts/{core_approval_item.pk}/approve/", body=b"{}", headers=[
        (b"authorization", f"Token {token}".encode()), (b"content-type", b"application/json"),
        (b"content-length", b"2")])
    assert response["status"] == 403, response["body"][:300]
    assert stored_state() == state
