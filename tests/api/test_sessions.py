"""Issue 11, item 6: the sessions API: open a session, continue it with runs, read its history and runs."""

import pytest

from runs.models import Session
from tests.support.api import error_of, field_errors


def _open(client, agent: str, **body):
    response = client.post("/api/sessions/", {"agent": agent, **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_a_session_is_opened_with_title_and_metadata_and_read_back(people, api, asking):
    requester = api(people["requester"])

    session = _open(requester, asking, title="  Ticket 4711  ", metadata={"ticket": 4711, "tags": ["vip"]})

    assert {k: session[k] for k in ("agent", "owner", "title", "metadata")} == {
        "agent": asking, "owner": "requester", "title": "Ticket 4711",
        "metadata": {"ticket": 4711, "tags": ["vip"]}}
    assert requester.get(f"/api/sessions/{session['id']}/").json() == session
    assert [s["id"] for s in requester.get("/api/sessions/").json()["results"]] == [session["id"]]
    assert Session.objects.get().owner == people["requester"]


@pytest.mark.parametrize("body, field", [
    ({"metadata": [1, 2]}, "metadata"),
    ({"metadata": "ticket 4711"}, "metadata"),
    ({"metadata": {"note": "x" * 20_000}}, "metadata"),
    ({"title": "t" * 201}, "title"),
    ({"agent": "no-such-agent"}, "agent"),
    ({"owner": "admin"}, "owner"),
])
def test_bad_session_bodies_are_400_and_open_nothing(people, api, body, field, asking):
    response = api(people["requester"]).post("/api/sessions/", {"agent": asking, **body}, format="json")

    assert field in field_errors(response)
    assert not Session.objects.exists()


def test_metadata_is_bounded_by_its_size_as_json(people, api, settings, asking):
    settings.TOLLGATE = {**settings.TOLLGATE, "MAX_SESSION_METADATA_BYTES": 30}
    requester = api(people["requester"])

    assert _open(requester, asking, metadata={"k": "x" * 20})["metadata"] == {"k": "x" * 20}  # 28 bytes
    too_big = requester.post("/api/sessions/", {"agent": asking, "metadata": {"k": "é" * 12}},
                             format="json")  # 12 characters, 32 bytes
    assert "32 bytes" in field_errors(too_big)["metadata"][0]


def test_runs_continue_a_session_and_its_history_is_paged_in_order(people, api, worker, asking):
    requester = api(people["requester"])
    session = _open(requester, asking, title="Transfers")

    run = requester.post("/api/runs/", {"agent": asking, "input": "Send 80 to acme.",
                                        "session": session["id"]}, format="json").json()
    worker.drain()

    assert run["session"] == session["id"]
    assert [r["id"] for r in requester.get(f"/api/sessions/{session['id']}/runs/").json()["results"]] == [run["id"]]
    messages, url = [], f"/api/sessions/{session['id']}/messages/?page_size=2"
    while url:
        page = requester.get(url).json()
        messages += page["results"]
        url = page["next"]
    assert [m["id"] for m in messages] == sorted(m["id"] for m in messages)
    assert (messages[0]["role"], messages[0]["content"], messages[0]["run"]) == ("user", "Send 80 to acme.", run["id"])
    assert [m["role"] for m in messages[1:3]] == ["assistant", "tool"]
    assert messages[1]["tool_calls"][0]["name"] == "fake_lookup"
    assert messages[2]["tool_call_id"] == messages[1]["tool_calls"][0]["id"]


def test_another_users_session_is_404_everywhere_and_not_listed(people, api, outsider, asking):
    session = _open(api(people["requester"]), asking)
    client = api(outsider)

    for path in ("", "messages/", "runs/"):
        assert error_of(client.get(f"/api/sessions/{session['id']}/{path}"), 404)["code"] == "not_found"
    assert client.get("/api/sessions/").json()["results"] == []
    response = client.post("/api/runs/", {"agent": asking, "input": "hi", "session": session["id"]},
                           format="json")
    assert "session" in field_errors(response)


def test_approvers_and_staff_see_every_session(people, api, asking):
    session = _open(api(people["requester"]), asking)

    for username in ("approver", "admin"):
        assert api(people[username]).get(f"/api/sessions/{session['id']}/").json()["owner"] == "requester"


def test_sessions_are_filtered_by_agent_and_creation_time(people, api, asking, refused):
    requester = api(people["requester"])
    sending, refusing = _open(requester, asking), _open(requester, refused)

    def ids(**query):
        return [s["id"] for s in requester.get("/api/sessions/", query).json()["results"]]

    assert ids() == [refusing["id"], sending["id"]]
    assert ids(agent=refused) == [refusing["id"]]
    assert ids(created_after=refusing["created_at"]) == [refusing["id"]]
    assert ids(created_before=refusing["created_at"]) == [sending["id"]]
