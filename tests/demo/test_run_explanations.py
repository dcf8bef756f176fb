"""Issue 27: the run page tells the outcome and the timeline in the reader's language, from recorded facts.

Finished demo runs (the real worker, the test payment gateway) read through
Django's test client with Accept-Language; the API keeps the stored English.
"""

import html
import re

import pytest
from django.urls import reverse

from approvals.models import Interrupt, InterruptStatus
from approvals.services import decide_interrupt
from runs.engine.lifecycle import start_run
from runs.models import Agent, Outcome, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def finished_run(demo, worker, slug: str, decision: str = "", comment: str = "", edited: dict | None = None):
    """A run of demo agent ``slug``, its approval item (if any) decided by the approver, run to its end."""
    run = start_run(agent=Agent.objects.get(slug=slug), user=demo["requester"], input="please")
    worker.drain()
    if decision:
        item = Interrupt.objects.get(run=run, status=InterruptStatus.PENDING)
        decide_interrupt(interrupt=item, user=demo["approver"], decision=decision, comment=comment,
                         edited_arguments=edited)
        worker.drain()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    return run


def text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def outcome_of(page: str) -> str:
    start = page.index(">", page.index('id="run-outcome"')) + 1
    return text(page[start:page.index("</dd>", start)])


def timeline_of(page: str) -> list[tuple[str, str]]:
    """``(event type, what the row says)`` per timeline row."""
    section = page[page.index('id="timeline"'):]
    rows = re.findall(r'<tr class="event type-([a-z_]+)".*?</tr>', section, re.S)
    cells = re.findall(r'<tr class="event type-[a-z_]+".*?<td data-label="[^"]*">((?:(?!</td>).)*)</td>\s*</tr>',
                       section, re.S)
    return list(zip(rows, map(text, cells)))


def page_in(client, user, run, language: str) -> str:
    client.force_login(user)
    response = client.get(reverse("run-detail", args=[run.pk]), HTTP_ACCEPT_LANGUAGE=language)
    assert response.status_code == 200
    return response.content.decode()


LATIN_WORDS = re.compile(r"\b[A-Za-z]{3,}\b")


def test_an_approved_refund_reads_in_chinese_on_a_chinese_page_and_the_api_keeps_the_english(
        client, api, demo, worker):
    run = finished_run(demo, worker, "refund-order", "approved")
    refund = run.tool_calls.get(name="refund")

    page = page_in(client, demo["requester"], run, "zh-hans")

    assert outcome_of(page) == f"已达成 完成：#{refund.pk} 订单 123 退款 80.00 已成功。"
    timeline = timeline_of(page)
    assert len(timeline) == run.events.count()
    told = dict(enumerate(row for _, row in timeline))
    assert f"#{refund.pk} 订单 123 退款 80.00 需要人工审批（规则：sum(amount) per target within 30d > 50）" in told.values()
    assert "收件箱事项 #%d 已处理：已批准" % Interrupt.objects.get(run=run).pk in told.values()
    assert told[len(told) - 1] == "运行完成：已达成"
    # No English sentence is left: what is Latin is machine text (the approval rule, tool names never shown here).
    for kind, row in timeline:
        assert not LATIN_WORDS.findall(row.replace("sum(amount) per target within", "")), (kind, row)
    assert "done: refund" not in page

    api_run = api(demo["requester"]).get(f"/api/runs/{run.pk}/", HTTP_ACCEPT_LANGUAGE="zh-hans").json()
    assert api_run["outcome_reason"] == f"done: refund #{refund.pk} succeeded" == run.outcome_reason


def test_the_same_run_reads_in_english_on_an_english_page(client, demo, worker):
    run = finished_run(demo, worker, "refund-order", "approved")
    refund, lookup = run.tool_calls.get(name="refund"), run.tool_calls.get(name="query_order")

    page = page_in(client, demo["requester"], run, "en")

    assert outcome_of(page) == f"achieved Done: #{refund.pk} Refund 80.00 on order 123 succeeded."
    told = [row for _, row in timeline_of(page)]
    assert told[:4] == ["Run created", "Run started", "The model proposed 1 tool call",
                        f"#{lookup.pk} Look up order 123 proposed by the model"]
    assert f"#{refund.pk} Refund 80.00 on order 123 approved: ready to run" in told
    assert told[-1] == "Run completed: achieved"


def test_a_rejected_refund_names_the_call_and_shows_the_persons_comment_beneath(client, demo, worker):
    run = finished_run(demo, worker, "refund-order", "rejected", comment="Too much for this order.")
    refund = run.tool_calls.get(name="refund")
    assert run.outcome == Outcome.NOT_ACHIEVED
    assert run.outcome_reason == "The refund was rejected or the order is not refundable."  # the check's words

    page = page_in(client, demo["requester"], run, "zh-hans")

    assert outcome_of(page) == f"未达成 #{refund.pk} 订单 123 退款 80.00：已拒绝 Too much for this order."
    told = [row for _, row in timeline_of(page)]
    assert f"#{refund.pk} 订单 123 退款 80.00 被人工拒绝" in told
    assert "The refund was rejected" not in page


def test_an_approval_with_edits_and_a_denied_cancellation_read_from_their_facts(client, demo, worker):
    edited = finished_run(demo, worker, "refund-order", "approved", edited={"order_id": 123, "amount": 50})
    page = page_in(client, demo["requester"], edited, "zh-hans")
    item = Interrupt.objects.get(run=edited)
    assert any(row.startswith(f"收件箱事项 #{item.pk} 已批准，参数经过修改") for _, row in timeline_of(page))

    denied = finished_run(demo, worker, "cancel-order")
    cancel = denied.tool_calls.get(name="cancel_order")
    page = page_in(client, demo["requester"], denied, "zh-hans")
    # The tool's own error is shown beneath, as stored: no template of ours wrote it.
    assert outcome_of(page) == (f"未达成 #{cancel.pk} 取消订单 124：不允许 "
                                "Order 124 has already shipped and cannot be cancelled.")
    assert (f"#{cancel.pk} 取消订单 124 被策略拒绝 Order 124 has already shipped and cannot be cancelled."
            in [row for _, row in timeline_of(page)])


def test_the_contract_email_run_reads_in_chinese(client, demo, worker):
    run = finished_run(demo, worker, "send-contract-email", "approved")
    email = run.tool_calls.get(name="send_email")
    page = page_in(client, demo["approver"], run, "zh-hans")
    assert outcome_of(page).startswith(f"已达成 完成：#{email.pk} ")
    told = [row for _, row in timeline_of(page)]
    assert f"#{email.pk} " in told[-6] and told[-6].endswith("获批，可以执行")
    assert "approval rule" not in page and "picked up by worker" not in page


def test_a_failed_lookup_beside_a_refund_that_succeeded_is_achieved_and_named(client, demo, worker):
    """The goal is the effect: a lookup of a missing order is denied, the refund of order 123 succeeds."""
    turns = [{"tool_calls": [{"name": "query_order", "arguments": {"order_id": 99999}}]},
             {"tool_calls": [{"name": "refund", "arguments": {"order_id": 123, "amount": 30}}]},
             {"content": "Refunded 30.00."}]
    agent = Agent.objects.create(slug="lookup-then-refund", name="lookup then refund", tools=["query_order", "refund"],
                                 model={"provider": "scripted", "turns": turns})
    run = start_run(agent=agent, user=demo["requester"], input="please")
    worker.drain()
    run.refresh_from_db()
    lookup, refund = run.tool_calls.get(name="query_order"), run.tool_calls.get(name="refund")
    assert (run.status, run.outcome) == (RunStatus.COMPLETED, Outcome.ACHIEVED)
    assert run.outcome_reason == (f"done: refund #{refund.pk} succeeded; read-only call(s) without their result: "
                                  f"query_order #{lookup.pk} denied: Order 99999 does not exist or does not belong to the "
                                  f"requester.")

    page = page_in(client, demo["requester"], run, "en")
    assert outcome_of(page) == (f"achieved Done: #{refund.pk} Refund 30.00 on order 123 succeeded. Read-only calls "
                                f"without their result (not held against the goal): #{lookup.pk} Look up order "
                                f"99999: denied.")
    page = page_in(client, demo["requester"], run, "zh-hans")
    assert not LATIN_WORDS.findall(outcome_of(page))
