"""A plug-in's own kind of wait (``tests.support.courier_app``): registered from its app, no migration, no change to
``runs/``; a run waits on it, resumes when it is settled, and goes on when it times out (docs/design.md#waits)."""

import dataclasses

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs.base.errors import NotFound
from runs.models import Run, RunStatus, WaitingReason
from tests.support.api import get_run, start_run
from tests.support.courier_app.deliveries import DELIVERY, report_delivery
from tests.support.waits import sweep_later, tool_result, waiting_agent
from tools.models import Wait
from tools.waits import WaitKind, kinds, register_wait_kind

pytestmark = pytest.mark.django_db(transaction=True)

PARCEL = "PARCEL-42"


def _waiting_run(worker, people, api, timeout_s: int = 3600) -> dict:
    agent = waiting_agent(api(people["admin"]), "waits-for-courier",
                          {"name": "wait_for_delivery", "arguments": {"parcel": PARCEL, "timeout_s": timeout_s}},
                          final="The parcel is there.")
    requester = api(people["requester"])
    run = start_run(requester, agent, "Tell me when the parcel is delivered.")
    worker.drain()
    return get_run(requester, run["id"])


def test_a_run_waits_on_the_plug_ins_kind_and_resumes_when_the_courier_reports(worker, people, api):
    assert "delivery" not in WaitingReason.values  # the kernel never heard of it
    run = _waiting_run(worker, people, api)
    assert (run["status"], run["waiting_reason"]) == ("waiting", "delivery")
    assert run["waiting_for"]["kind"] == "delivery"
    listed = api(people["requester"]).get("/api/runs/", {"waiting_reason": "delivery"})
    assert listed.status_code == 200 and [r["id"] for r in listed.json()["results"]] == [run["id"]]
    assert Wait.objects.get(run_id=run["id"]).status == "pending"

    report_delivery(parcel=PARCEL, signed_by="M. Okafor", actor="courier")
    assert Run.objects.get(pk=run["id"]).status == RunStatus.RUNNING  # resumed by the settlement itself
    worker.drain()

    finished = get_run(api(people["requester"]), run["id"])
    assert (finished["status"], finished["outcome"]) == ("completed", "achieved")
    assert tool_result(run["id"], "wait_for_delivery") == {
        "status": "succeeded", "result": {"parcel": PARCEL, "signed_by": "M. Okafor"}}
    with pytest.raises(NotFound):  # settled once: a second report finds no wait
        report_delivery(parcel=PARCEL, signed_by="someone else", actor="courier")


def test_waiting_for_names_an_inbox_item_when_the_kinds_registration_says_a_person_settles_it_there(
        worker, people, api, monkeypatch):
    run = _waiting_run(worker, people, api)
    assert "interrupt" not in run["waiting_for"]  # the courier settles it, not a person in the inbox
    monkeypatch.setitem(kinds._KINDS, "delivery", dataclasses.replace(DELIVERY, inbox_item=True))
    again = get_run(api(people["requester"]), run["id"])["waiting_for"]
    assert again == {**run["waiting_for"], "interrupt": None}  # asked the registry (this call has no item)


def test_at_its_deadline_the_plug_ins_wait_times_out_with_its_own_error_and_the_run_goes_on(worker, people, api):
    run = _waiting_run(worker, people, api, timeout_s=60)
    assert sweep_later(61)["woken"] == 1
    worker.drain()

    finished = Run.objects.get(pk=run["id"])
    assert finished.status == RunStatus.COMPLETED
    assert Wait.objects.get(run_id=run["id"]).status == "timed_out"
    assert tool_result(run["id"], "wait_for_delivery") == {
        "status": "failed", "error": f"No courier reported parcel {PARCEL} delivered in time."}


def test_a_kind_needs_a_fresh_plain_name_and_a_run_waits_only_for_known_reasons(people):
    for name in ("Delivery", "two words", "x" * 33, "approval", "retry_backoff", "delivery"):
        with pytest.raises(ImproperlyConfigured):
            register_wait_kind(WaitKind(name=name))
    run = Run(status=RunStatus.RUNNING)
    with pytest.raises(ImproperlyConfigured):
        run.wait("teleport")
    assert run.status == RunStatus.RUNNING and run.waiting_reason == ""
    run.wait("delivery")
    assert (run.status, run.waiting_reason) == (RunStatus.WAITING, "delivery")
