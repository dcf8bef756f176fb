"""Issue 12: bulk decisions after a confirmation page, the history of decided items, claims.

Through Django's test client and the REST API, with the real worker and the
tests' own tools (``tests.support.fake_tools``).
"""

import html
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals import selectors
from approvals.bulk import decide_bulk, fingerprint, plan_bulk
from approvals.models import Interrupt, InterruptStatus
from approvals.services import decide_interrupt
from runs.engine.lifecycle import cancel_run
from runs.models import RunStatus
from tests.support.api import error_of, start_run
from tests.support.core import core_agent, lookup, transfer_items
from tests.support.fake_tools import transfers

pytestmark = pytest.mark.django_db(transaction=True)


def hidden_fields(page) -> dict:
    fields = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.content.decode()):
        fields.setdefault(name, []).append(value)
    return fields


def test_bulk_approve_decides_each_item_once_and_skips_one_whose_run_was_cancelled(
        client, api, people, worker):
    items = transfer_items(api, people, worker, accounts=("acct-101", "acct-102", "acct-103"))
    client.force_login(people["approver"])

    page = client.get(reverse("inbox-bulk"), {"item": [i.pk for i in items]})
    assert page.status_code == 200
    assert page.content.decode().count('class="bulk-item"') == 3
    assert all(Interrupt.objects.get(pk=i.pk).status == InterruptStatus.PENDING for i in items)  # nothing yet

    cancel_run(run=items[1].run, actor="user:requester")  # after the page was shown
    result = client.post(reverse("inbox-bulk"), {**hidden_fields(page), "decision": "approved", "comment": "ok"})
    worker.drain()

    assert result.status_code == 200
    body = result.content.decode()
    assert re.search(rf'class="bulk-skipped" data-interrupt-id="{items[1].pk}" data-reason="run_ended"', body)
    assert [i.decision for i in Interrupt.objects.filter(pk__in=[items[0].pk, items[2].pk])] == ["approved"] * 2
    assert {(t["account"], t["amount"]) for t in transfers()} == {("acct-101", 55), ("acct-103", 55)}
    for item in (items[0], items[2]):
        item.run.refresh_from_db()
        assert item.run.status == RunStatus.COMPLETED
        assert item.run.events.filter(type="interrupt", actor="user:approver", reason="approved").count() == 1


def test_an_item_whose_arguments_changed_after_the_page_is_skipped(api, people, worker):
    items = transfer_items(api, people, worker, accounts=("acct-101", "acct-102"))
    plan = plan_bulk(user=people["approver"], ids=[i.pk for i in items])
    shown = {i.pk: i.fingerprint for i in plan.items}
    call = items[0].tool_call
    call.arguments = {**call.arguments, "amount": 60}
    call.save(update_fields=["arguments"])

    outcomes = decide_bulk(user=people["approver"], decision="rejected", comment="not now", expected=shown)

    assert [(o.interrupt_id, o.decided, o.skipped) for o in outcomes] == [
        (items[0].pk, False, "changed"), (items[1].pk, True, "")]
    assert Interrupt.objects.get(pk=items[0].pk).status == InterruptStatus.PENDING
    assert Interrupt.objects.get(pk=items[1].pk).comment == "not now"
    worker.drain()


def test_bulk_refuses_mixed_tools_a_rejection_without_comment_and_items_one_may_not_decide(
        client, api, people, worker):
    [sent] = transfer_items(api, people, worker, accounts=("acct-101",))
    asking = core_agent(api(people["admin"]), "asking-lookup", [{"tool_calls": [lookup()]}, {"content": "Found."}],
                        approval_policy={"fake_lookup": "always"}, completion_check="default")
    run = start_run(api(people["requester"]), asking["slug"], "Look a up.")
    worker.drain()
    asked = Interrupt.objects.get(run_id=run["id"])  # an item of another tool
    client.force_login(people["approver"])

    mixed = client.get(reverse("inbox-bulk"), {"item": [sent.pk, asked.pk]})
    assert mixed.status_code == 400 and "one tool at a time" in mixed.content.decode()
    forged_mix = client.post(reverse("inbox-bulk"), {  # fingerprints of both, as no confirmation page showed them
        "item": [sent.pk, asked.pk], f"fingerprint-{sent.pk}": fingerprint(sent),
        f"fingerprint-{asked.pk}": fingerprint(asked), "decision": "approved"})
    assert forged_mix.status_code == 400 and "one tool at a time" in forged_mix.content.decode()
    assert {i.status for i in Interrupt.objects.filter(pk__in=[sent.pk, asked.pk])} == {InterruptStatus.PENDING}

    page = client.get(reverse("inbox-bulk"), {"item": [sent.pk]})
    again = client.post(reverse("inbox-bulk"), {**hidden_fields(page), "decision": "rejected", "comment": ""})
    assert again.status_code == 400 and "a rejection needs a comment" in again.content.decode()
    assert Interrupt.objects.get(pk=sent.pk).status == InterruptStatus.PENDING

    client.force_login(people["requester"])  # four eyes: the requester may not decide the transfer
    page = client.get(reverse("inbox-bulk"), {"item": [sent.pk]})
    assert 'id="bulk-nothing"' in page.content.decode()
    forged = client.post(reverse("inbox-bulk"), {"item": [sent.pk], f"fingerprint-{sent.pk}": fingerprint(sent),
                                                 "decision": "approved"})
    assert 'data-reason="gone"' in forged.content.decode()
    assert Interrupt.objects.get(pk=sent.pk).status == InterruptStatus.PENDING
    assert client.get(reverse("inbox-bulk"), {"item": ["x"]}).status_code == 400


def test_history_filters_by_who_decision_day_and_tool_and_shows_the_edit(client, api, people, worker):
    items = transfer_items(api, people, worker, accounts=("acct-101", "acct-102", "acct-103"))
    decide_interrupt(interrupt=items[0], user=people["approver"], decision="approved", comment="smaller",
                     edited_arguments={"account": "acct-101", "amount": 40})
    decide_interrupt(interrupt=items[1], user=people["admin"], decision="rejected", comment="no")
    Interrupt.objects.filter(pk=items[1].pk).update(resolved_at=timezone.now() - timedelta(days=3))
    client.force_login(people["approver"])

    def listed(**query):
        page = client.get(reverse("inbox-decided"), query)
        assert page.status_code == 200
        return [int(pk) for pk in re.findall(r'class="decided-item" data-interrupt-id="(\d+)"', page.content.decode())]

    assert listed() == [items[0].pk, items[1].pk]  # the most recent decision first; pending items not listed
    assert listed(who="me") == [items[0].pk]
    assert listed(decision="rejected") == [items[1].pk]
    assert listed(when="today") == [items[0].pk]
    day = (timezone.localdate() - timedelta(days=3)).isoformat()
    assert listed(day_from=day, day_to=day) == [items[1].pk]
    assert listed(tool="fake_lookup") == []
    page = client.get(reverse("inbox-decided")).content.decode()
    shown = " ".join(re.sub(r"<[^>]+>", " ", page).split())  # the page's text, tags and spacing aside
    assert "amount : 55 → 40" in shown and "smaller" in page
    assert client.get(reverse("inbox-decided"), {"day_from": "yesterday"}).status_code == 400

    client.force_login(people["requester"])  # sees the items of their own runs
    assert listed() == [items[0].pk, items[1].pk]
    worker.drain()


def _decided_before(item, count: int, *, tie: int = 7) -> None:
    """``count`` more rejected items on ``item``'s run and call, decided before it, ``tie`` of them at each instant
    (inserted at once: the history only reads rows, however they were decided)."""
    Interrupt.objects.bulk_create([
        Interrupt(run_id=item.run_id, tool_call_id=item.tool_call_id, kind=item.kind, title=f"older {n}",
                  status=InterruptStatus.RESOLVED, decision="rejected", comment="no", resolved_by=item.resolved_by,
                  resolved_at=item.resolved_at - timedelta(seconds=1 + n // tie))
        for n in range(count)])


def _history(client, query) -> tuple[list[int], str]:
    """The item ids the history page lists for ``query`` (a dict or an encoded query string), and its HTML."""
    page = client.get(reverse("inbox-decided") + "?" + query) if isinstance(query, str) else client.get(
        reverse("inbox-decided"), query)
    assert page.status_code == 200
    body = page.content.decode()
    return [int(pk) for pk in re.findall(r'class="decided-item" data-interrupt-id="(\d+)"', body)], body


def _link(body: str, link_id: str) -> str | None:
    """The query string of the page's link ``link_id`` (unescaped), or None when the page has no such link."""
    found = re.search(rf'<a href="\?([^"]*)"[^>]* id="{link_id}"', body)
    return html.unescape(found.group(1)) if found else None


def test_history_pages_by_keyset_forward_and_back(client, people, worker, api):
    items = transfer_items(api, people, worker, accounts=("acct-101", "acct-102"))
    for item in items:
        decide_interrupt(interrupt=item, user=people["approver"], decision="rejected", comment="no")
    size = selectors.HISTORY_PAGE_SIZE
    _decided_before(Interrupt.objects.get(pk=items[0].pk), 2 * size + 8)  # ties at one instant cross page ends
    expected = list(Interrupt.objects.filter(status=InterruptStatus.RESOLVED).order_by("-resolved_at", "-id")
                    .values_list("pk", flat=True))
    client.force_login(people["approver"])

    first, body = _history(client, {"decision": "rejected"})
    assert first == expected[:size] and _link(body, "decided-previous") is None
    assert f"{2 * size + 10} decided items" in body
    following = _link(body, "decided-next")
    assert "decision=rejected" in following and "page=2" in following

    second, body = _history(client, following)
    assert second == expected[size:2 * size] and "Page 2" in body
    third, body = _history(client, _link(body, "decided-next"))
    assert third == expected[2 * size:] and _link(body, "decided-next") is None and "Page 3" in body

    back, body = _history(client, _link(body, "decided-previous"))  # read backwards from the third page's first row
    assert back == second and "Page 2" in body and _link(body, "decided-next") and _link(body, "decided-previous")
    back, body = _history(client, _link(body, "decided-previous"))
    assert back == first and _link(body, "decided-previous") is None and "Page 1" in body

    assert _history(client, {"decision": "approved"})[0] == []  # the filters hold on every page
    assert client.get(reverse("inbox-decided"), {"after": 1, "before": 2}).status_code == 400
    worker.drain()


def test_history_counts_at_most_the_cap_and_its_queries_do_not_grow_with_the_rows(client, people, worker, api,
                                                                                  monkeypatch):
    [item] = transfer_items(api, people, worker, accounts=("acct-101",))
    decide_interrupt(interrupt=item, user=people["approver"], decision="rejected", comment="no")
    item = Interrupt.objects.get(pk=item.pk)
    size = selectors.HISTORY_PAGE_SIZE
    client.force_login(people["approver"])

    def queries_of_first_and_deeper_page() -> tuple[int, int]:
        """Statements of the first page and of one after a cursor; each read of the items is bounded (LIMIT)
        and skips nothing (no OFFSET), so none costs more as the history grows."""
        counts = []
        for query in ({}, {"after": item.pk, "page": 2}):
            with CaptureQueriesContext(connection) as queries:
                _history(client, query)
            counts.append(len(queries))
            reads = [q["sql"] for q in queries.captured_queries if '"approvals_interrupt"' in q["sql"]]
            assert len(reads) >= 2 and all("LIMIT" in sql and "OFFSET" not in sql for sql in reads), reads
        return tuple(counts)

    _decided_before(item, 2 * size)
    with_few = queries_of_first_and_deeper_page()
    _decided_before(item, 6 * size)
    assert queries_of_first_and_deeper_page() == with_few

    monkeypatch.setattr(selectors, "COUNT_CAP", 5 * size)
    assert f"More than {5 * size} decided items" in _history(client, {})[1]
    assert "0 decided items" in _history(client, {"decision": "approved"})[1]  # under the cap: the number itself
    worker.drain()


def test_claims_through_the_api_inform_replay_with_a_key_and_filter_the_inbox(client, api, people, worker):
    [item] = transfer_items(api, people, worker, accounts=("acct-101",))
    approver, admin = api(people["approver"]), api(people["admin"])
    key = {"Idempotency-Key": "claim-1"}

    first = approver.post(f"/api/interrupts/{item.pk}/claim/", headers=key)
    replay = approver.post(f"/api/interrupts/{item.pk}/claim/", headers=key)
    assert first.status_code == 200 and first.json()["claimed_by"] == "approver"
    assert replay.headers["Idempotent-Replayed"] == "true" and replay.json() == first.json()
    assert item.run.events.filter(type="claim").count() == 1

    assert error_of(admin.post(f"/api/interrupts/{item.pk}/claim/"), 409)["details"]["claimed_by"] == "approver"
    assert error_of(api(people["requester"]).post(f"/api/interrupts/{item.pk}/claim/"), 403)
    assert [i["id"] for i in approver.get("/api/interrupts/", {"assigned": "me"}).json()["results"]] == [item.pk]
    assert admin.get("/api/interrupts/", {"assigned": "me"}).json()["results"] == []

    client.force_login(people["approver"])
    assert f'data-interrupt-id="{item.pk}"' in client.get(reverse("inbox"), {"assigned": "me"}).content.decode()
    item_page = client.get(reverse("inbox-item", args=[item.pk])).content.decode()
    assert "Being handled by <strong>approver</strong>" in item_page
    assert re.search(r'id="item-goes-to">For the group\(s\): approvers<', item_page)

    decided = approver.post(f"/api/interrupts/{item.pk}/reject/", {"comment": "no"}, format="json")
    assert decided.status_code == 200  # a claim informs; it locks nothing
    assert error_of(approver.post(f"/api/interrupts/{item.pk}/unclaim/"), 409)["details"]["status"] == "resolved"
    worker.drain()


@pytest.mark.parametrize("verb", ["claim", "unclaim"])
def test_a_claim_over_the_api_reads_the_run_only_with_the_item_and_for_its_lock(verb, api, people, worker):
    """The decide rule's requester comes with the item's lookup (``VERB_RELATIONS``): no read of its own."""
    [item] = transfer_items(api, people, worker, accounts=("acct-102",))
    approver = api(people["approver"])
    if verb == "unclaim":
        approver.post(f"/api/interrupts/{item.pk}/claim/")
    with CaptureQueriesContext(connection) as queries:
        assert approver.post(f"/api/interrupts/{item.pk}/{verb}/").status_code == 200
    run_reads = [q["sql"] for q in queries.captured_queries if re.match(r'SELECT .* FROM "runs_run"', q["sql"])]
    assert len(run_reads) == 1, run_reads  # its lock's (runs.tx.locked; FOR UPDATE where the database has it)
    worker.drain()


def test_unclaim_by_the_claimer_or_staff_only(client, api, people, worker, django_user_model):
    [item] = transfer_items(api, people, worker, accounts=("acct-101",))
    other = django_user_model.objects.create_user("other-approver")
    other.groups.add(*people["approver"].groups.all())
    api(people["approver"]).post(f"/api/interrupts/{item.pk}/claim/")

    assert error_of(api(other).post(f"/api/interrupts/{item.pk}/unclaim/"), 403)
    client.force_login(people["admin"])
    response = client.post(reverse("inbox-item-claim", args=[item.pk]), {"action": "unclaim"})
    assert response.status_code == 302
    assert api(other).post(f"/api/interrupts/{item.pk}/claim/").json()["claimed_by"] == "other-approver"


def test_an_item_one_may_not_see_is_404_alike_for_its_page_its_state_and_a_claim(client, api, people, worker,
                                                                                django_user_model):
    """One lookup (``approvals.web.lookups``) answers every inbox page: an unseen item and no item look the same."""
    [item] = transfer_items(api, people, worker, accounts=("acct-101",))
    client.force_login(django_user_model.objects.create_user("stranger"))
    missing = Interrupt.objects.order_by("-pk").first().pk + 1

    for pk in (item.pk, missing):
        assert client.post(reverse("inbox-item-claim", args=[pk]), {"action": "claim"}).status_code == 404
        assert client.get(reverse("inbox-item", args=[pk])).status_code == 404
        assert client.get(reverse("inbox-item-state", args=[pk])).status_code == 404
    assert Interrupt.objects.get(pk=item.pk).claimed_by is None

    client.force_login(people["approver"])  # the control: one who may see it claims it
    assert client.post(reverse("inbox-item-claim", args=[item.pk]), {"action": "claim"}).status_code == 302
    assert Interrupt.objects.get(pk=item.pk).claimed_by == people["approver"]


def test_the_bulk_result_keeps_watching_an_unknown_outcome_its_tool_will_still_reconcile(people, settings):
    from approvals.selectors import item_outcomes
    from tests.support.core import pending_transfer
    from tools.models import ToolCall

    item = pending_transfer(requester=people["requester"])  # its tool has a reconcile hook
    ToolCall.objects.filter(pk=item.tool_call_id).update(status="unknown", error="The bank timed out.")

    outcome, = item_outcomes(user=people["approver"], ids=[item.pk])
    assert (outcome.call_status, outcome.settled, outcome.detail) == ("unknown", False, "The bank timed out.")

    ToolCall.objects.filter(pk=item.tool_call_id).update(reconcile_attempts=settings.TOLLGATE["RECONCILE_MAX_TRIES"])
    outcome, = item_outcomes(user=people["approver"], ids=[item.pk])
    assert outcome.settled  # the hook's tries are spent: only a person settles it now
