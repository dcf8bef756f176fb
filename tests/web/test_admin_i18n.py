"""The admin in the browser's language (issue 12): Tollgate's own words in Simplified Chinese or English.

Through Django's test client with ``Accept-Language``: the index (model
names), the run list (column headings, filter titles and choices), a run's
page (field labels, help texts, fieldsets, inline titles), the inbox items'
list with its bulk action and the service's refusal, the agent form's
checks of a bad config (``runs.engine.agents``), and the webhook lists
(the demo shop's are tests/demo/test_admin_i18n.py). Each page is checked for words from our catalogue and for
the absence of the other language's words. The real-browser check is in
tests/browser/test_i18n.py.
"""

import json

import pytest

from approvals.models import Interrupt
from runs.models import Run
from runs.webhooks.models import WebhookDelivery
from tests.support.web import waiting_transfer
from tests.web.test_admin import action, change_url, changelist_url, confirm
from tests.support.webhooks import subscribe, wait_settled

pytestmark = pytest.mark.django_db(transaction=True)

LANGUAGES = ["zh-hans", "en"]


@pytest.fixture(params=LANGUAGES)
def language(request):
    return request.param


@pytest.fixture
def admin_in(client, people, language):
    """The superuser's client, every request sent with ``Accept-Language: <language>``."""
    client.force_login(people["admin"])
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = language
    return client


@pytest.fixture
def waiting_run(people, worker, receiver, webhook_settings) -> Run:
    """A transfer waiting for approval, with a subscription that got its ``run.waiting`` delivery."""
    subscription = subscribe(people["requester"], receiver, "run.waiting")
    run = waiting_transfer(people, worker)
    wait_settled(subscription, 1)
    return run


def page_text(response) -> str:
    """The response's HTML with every run of white space made one space (headings span lines)."""
    assert response.status_code == 200, response.status_code
    return " ".join(response.content.decode().split())


def check(text: str, words: dict[str, list[str]], language: str) -> None:
    """Every word of ``language`` is in ``text``; none of the other language's is."""
    other = next(code for code in LANGUAGES if code != language)
    assert [word for word in words[language] if word not in text] == []
    assert [word for word in words[other] if word in text] == []


def test_index_names_our_models(admin_in, language):
    check(page_text(admin_in.get("/admin/")), {
        "zh-hans": [">智能体<", ">会话<", ">运行事件<", ">工具调用<", ">收件箱条目<", ">Webhook 投递<"],
        "en": [">Agents<", ">Sessions<", ">Run events<", ">Tool calls<", ">Inbox items<", ">Webhook deliveries<"],
    }, language)


def test_run_list_headings_and_filters(admin_in, waiting_run, language):
    check(page_text(admin_in.get(changelist_url(Run))), {
        "zh-hans": [">失败类型</a>", ">模型调用次数</a>", ">申请人</a>", ">等待原因</a>",  # columns
                    "以 失败类型", "以 结论", "以 完成时间",  # filter titles
                    ">排队中</a>", ">外部事件</a>", ">预算用尽</a>", ">未达成</a>",  # filter choices
                    ">等待中<", ">审批<",  # the row's status and waiting reason
                    ">取消所选运行</option>"],
        "en": [">Failure type</a>", ">Model calls</a>", ">Requested by</a>", ">Waiting for</a>",
               "By failure type", "By outcome", "By finished at",
               ">queued</a>", ">external event</a>", ">budget exhausted</a>", ">not achieved</a>",
               ">waiting<", ">approval<",
               ">Cancel selected runs</option>"],
    }, language)


def test_run_page_labels_help_fieldsets_and_inlines(admin_in, waiting_run, language):
    check(page_text(admin_in.get(change_url(waiting_run))), {
        "zh-hans": ["<label>幂等键:</label>", "<label>租约令牌:</label>", "<label>结论原因:</label>",
                    "防护令牌（fencing token）；每次获取租约都会增大。",  # a help text
                    'class="fieldset-heading">用量</h2>',
                    'class="inline-heading"> 工具调用 </h2>', 'class="inline-heading"> 收件箱条目 </h2>',
                    'class="inline-heading"> 时间线 </h2>',
                    ">等待审批<",  # the tool call's status in its inline
                    ],
        "en": ["<label>Idempotency key:</label>", "<label>Lease token:</label>", "<label>Outcome reason:</label>",
               "Fencing token; grows with every acquisition.",
               'class="fieldset-heading">Usage</h2>',
               'class="inline-heading"> Tool calls </h2>', 'class="inline-heading"> Inbox items </h2>',
               'class="inline-heading"> Timeline </h2>',
               ">awaiting approval<"],
    }, language)


def test_inbox_item_list_and_its_bulk_action(admin_in, waiting_run, language):
    check(page_text(admin_in.get(changelist_url(Interrupt))), {
        "zh-hans": [">认领人</a>", ">决定人</a>", ">申请人</a>", "以 所需权限", ">待处理<",
                    ">批准所选事项</option>", ">拒绝所选事项</option>"],
        "en": [">Claimed by</a>", ">Resolved by</a>", ">Requested by</a>", "By required permission", ">pending<",
               ">Approve selected items</option>", ">Reject selected items</option>"],
    }, language)

    page = action(admin_in, Interrupt, "reject_selected", [waiting_run.interrupts.get()])
    check(page_text(page), {"zh-hans": ["确认这些决定"], "en": ["Confirm the decisions"]}, language)
    # The service's refusal (runs.base.errors.InvalidInput from approvals.bulk) is in the page's language too.
    refused = confirm(admin_in, "reject_selected", page, "")
    check(page_text(refused), {"zh-hans": ["请说明原因：拒绝需要填写备注。"],
                               "en": ["Say why: a rejection needs a comment."]}, language)
    assert waiting_run.interrupts.get().status == "pending"


def test_agent_form_refuses_a_bad_config_in_the_pages_language(admin_in, language):
    response = admin_in.post("/admin/runs/agent/add/", {
        "slug": "bad", "name": "Bad", "model": json.dumps({"provider": "nope"}), "tools": ["fake_transfer"],
        "approval_policy": json.dumps({"fake_transfer": "sometimes", "teleport": "always"}),
        "completion_check": "default", "max_turns": 5,
    })
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"model", "approval_policy"}
    text = page_text(response)
    check(text, {
        "zh-hans": ["未知的模型提供方 &#x27;nope&#x27;；已知的有：", "未知工具 &#x27;teleport&#x27;。",
                    "fake_transfer：审批子句 &#x27;sometimes&#x27; 不是", ">完成判定:</label>",
                    'for="id_approval_policy">审批策略:</label>'],
        "en": ["Unknown model provider &#x27;nope&#x27;; known:", "Unknown tool &#x27;teleport&#x27;.",
               "fake_transfer: Approval clause &#x27;sometimes&#x27; is not", ">Completion check:</label>",
               'for="id_approval_policy">Approval policy:</label>'],
    }, language)


def test_webhook_lists(admin_in, waiting_run, language):
    assert WebhookDelivery.objects.filter(event_type="run.waiting").count() == 1
    check(page_text(admin_in.get(changelist_url(WebhookDelivery))), {
        "zh-hans": [">事件类型</a>", ">尝试次数</a>", ">下次尝试时间</a>", "以 事件类型", ">运行等待中<",
                    ">重新发送所选投递</option>"],
        "en": [">Event type</a>", ">Attempts</a>", ">Next attempt at</a>", "By event type", ">run waiting<",
               ">Send selected deliveries again</option>"],
    }, language)
    check(page_text(admin_in.get(changelist_url(WebhookDelivery).replace("delivery", "subscription"))), {
        "zh-hans": [">所有者</a>", ">事件类型</a>", ">启用</a>", "以 启用"],
        "en": [">Owner</a>", ">Event types</a>", ">Active</a>", "By active"],
    }, language)
