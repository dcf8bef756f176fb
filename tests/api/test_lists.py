"""Issue 11, item 3: filters and cursor pages on the REST lists.

Each filter narrows the list to what it names, within what the user may
see; a value the filter cannot take is a 400 naming it; pages follow
``next``/``previous`` cursors, newest first, with no row twice or lost.
"""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Interrupt
from runs.models import Run
from tests.support.api import field_errors, start_run
from tests.support.security import core_approval_item  # noqa: F401
from tests.support.waits import waiting_agent


@pytest.fixture
def runs(people, api, asking, refused):
    """Four runs: three of the requester (a transfer, another in the same session, a refused one), one of the
    approver."""
    requester = api(people["requester"])
    sent = start_run(requester, asking, "Send 80 to acme.")
    follow_up = requester.post("/api/runs/", {"agent": asking, "input": "And 20 more.",
                                              "session": sent["session"]}, format="json").json()
    not_sent = start_run(requester, refused, "Send 500 to acme.")
    own = start_run(api(people["approver"]), asking, "Send 80 to acme, please.")
    Run.objects.filter(pk=not_sent["id"]).update(status="waiting", waiting_reason="approval")
    Run.objects.filter(pk=own["id"]).update(status="completed", created_at=timezone.now() - timedelta(days=3))
    return {"transfer": sent["id"], "follow_up": follow_up["id"], "refused": not_sent["id"], "own": own["id"]}


def _ids(client, path, **query) -> set[int]:
    response = client.get(path, query)
    assert response.status_code == 200, response.json()
    assert response.json()["next"] is None
    return {item["id"] for item in response.json()["results"]}


def test_run_filters_narrow_the_list(people, api, runs, asking, refused):
    approver = api(people["approver"])
    session = Run.objects.get(pk=runs["transfer"]).session_id
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()

    assert _ids(approver, "/api/runs/") == set(runs.values())
    assert _ids(approver, "/api/runs/", status="queued") == {runs["transfer"], runs["follow_up"]}
    assert _ids(approver, "/api/runs/", agent=refused) == {runs["refused"]}
    assert _ids(approver, "/api/runs/", session=session) == {runs["transfer"], runs["follow_up"]}
    assert _ids(approver, "/api/runs/", waiting_reason="approval") == {runs["refused"]}
    assert _ids(approver, "/api/runs/", created_before=yesterday) == {runs["own"]}
    assert _ids(approver, "/api/runs/", created_after=yesterday) == {runs["transfer"], runs["follow_up"],
                                                                     runs["refused"]}
    assert _ids(approver, "/api/runs/", requested_by="me") == {runs["own"]}
    assert _ids(approver, "/api/runs/", agent=asking, status="completed") == {runs["own"]}
    assert _ids(api(people["requester"]), "/api/runs/", agent=asking) == {runs["transfer"], runs["follow_up"]}


def test_filters_never_widen_what_a_user_sees(people, api, runs):
    outsider = api(get_user_model().objects.create_user("outsider", password="x"))
    session = Run.objects.get(pk=runs["transfer"]).session_id

    assert _ids(outsider, "/api/runs/", session=session) == set()
    assert _ids(outsider, "/api/runs/", requested_by="me") == set()


@pytest.mark.parametrize("path, name, value", [
    ("/api/runs/", "status", "finished"),
    ("/api/runs/", "agent", "not a slug!"),
    ("/api/runs/", "session", "first"),
    ("/api/runs/", "waiting_reason", "coffee"),
    ("/api/runs/", "created_after", "yesterday"),
    ("/api/runs/", "created_before", "2026-13-01T00:00:00Z"),
    ("/api/runs/", "requested_by", "approver"),
    ("/api/interrupts/", "status", "done"),
    ("/api/interrupts/", "kind", "vibe"),
    ("/api/interrupts/", "tool", "x" * 101),
    ("/api/interrupts/", "run", "-3"),
    ("/api/sessions/", "agent", "a\x00b"),
    ("/api/sessions/", "created_after", "9999-12-31T23:59:59-23:59"),
])
def test_invalid_filter_values_are_400_naming_the_parameter(people, api, path, name, value):
    response = api(people["approver"]).get(path, {name: value})

    assert name in field_errors(response)


def test_interrupt_filters(people, api, core_approval_item):
    approver = api(people["approver"])
    item = core_approval_item.pk

    assert _ids(approver, "/api/interrupts/", status="pending", kind="approval", tool="fake_transfer") == {item}
    assert _ids(approver, "/api/interrupts/", run=core_approval_item.run_id) == {item}
    assert _ids(approver, "/api/interrupts/", tool="fake_lookup") == set()
    assert _ids(approver, "/api/interrupts/", status="resolved") == set()
    assert _ids(approver, "/api/interrupts/", kind="reconciliation") == set()


def test_list_filters_neither_hide_nor_refuse_an_item(people, api, core_approval_item, runs):
    """Filters narrow lists; an item and its actions are found by id alone (and its visibility)."""
    approver = api(people["approver"])
    item = core_approval_item.pk

    assert approver.get(f"/api/interrupts/{item}/", {"status": "resolved"}).json()["id"] == item
    assert approver.get(f"/api/interrupts/{item}/", {"status": "no such status"}).status_code == 200
    assert approver.get(f"/api/runs/{runs['transfer']}/", {"status": "completed"}).json()["id"] == runs["transfer"]
    response = approver.post(f"/api/interrupts/{item}/approve/?kind=reconciliation", {}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "resolved"
    assert api(people["requester"]).get(f"/api/runs/{runs['own']}/").status_code == 404  # still not visible


def test_cursor_pages_walk_every_run_newest_first_and_back(people, api, asking):
    client = api(people["requester"])
    created = [start_run(client, asking, f"Send {n} to acme.")["id"] for n in range(7)]
    # Two share a creation instant: the id breaks the tie, so neither is lost or shown twice.
    Run.objects.filter(pk=created[3]).update(created_at=Run.objects.get(pk=created[4]).created_at)

    seen, url, pages = [], "/api/runs/?page_size=3", []
    while url:
        page = client.get(url).json()
        assert set(page) == {"next", "previous", "results"}
        pages.append(page)
        seen += [run["id"] for run in page["results"]]
        url = page["next"]

    expected = list(Run.objects.order_by("-created_at", "-id").values_list("pk", flat=True))
    assert seen == expected and sorted(seen) == sorted(created)
    assert [len(p["results"]) for p in pages] == [3, 3, 1]
    back = client.get(pages[-1]["previous"]).json()
    assert [run["id"] for run in back["results"]] == [run["id"] for run in pages[1]["results"]]


def test_a_cursor_the_api_did_not_make_is_400(people, api):
    for cursor in ("not-base64!", "cD1ub3QtYS1kYXRl"):  # the second: p=not-a-date
        assert "cursor" in field_errors(api(people["requester"]).get("/api/runs/", {"cursor": cursor}))


def test_other_lists_are_cursor_pages_too(people, api, worker, refused, asking):
    client = api(people["approver"])
    # Two inbox items, each run with two tool calls (a lookup, then the transfer that waits).
    run, _ = [start_run(api(people["requester"]), asking, "Send 80 to acme.") for _ in range(2)]
    worker.drain()
    assert client.post("/api/sessions/", {"agent": refused}, format="json").status_code == 201
    for path in ("/api/agents/", "/api/interrupts/", "/api/sessions/", f"/api/runs/{run['id']}/events/",
                 f"/api/runs/{run['id']}/tool-calls/"):
        page = client.get(path, {"page_size": 1}).json()
        assert set(page) == {"next", "previous", "results"} and len(page["results"]) == 1, path
        assert "cursor=" in (page["next"] or ""), path


def test_waiting_for_costs_the_same_queries_for_two_runs_or_six(people, api, worker):
    agent = waiting_agent(api(people["admin"]), "asks", {"name": "ask_user", "arguments": {"question": "A or B?"}})
    requester = api(people["requester"])

    def listing_queries(runs: int) -> int:
        for _ in range(runs - Run.objects.count()):
            start_run(requester, agent, "Which one?")
        worker.drain()
        with CaptureQueriesContext(connection) as queries:
            page = requester.get("/api/runs/").json()["results"]
        assert len(page) == runs and {run["status"] for run in page} == {"waiting"}
        for run in page:  # the prefetched answer is the right one
            item = Interrupt.objects.get(run_id=run["id"], kind="input")
            assert run["waiting_for"]["kind"] == "input"
            assert (run["waiting_for"]["interrupt"], run["waiting_for"]["tool_call"]) == (item.pk, item.tool_call_id)
        return len(queries)

    assert listing_queries(2) == listing_queries(6)
