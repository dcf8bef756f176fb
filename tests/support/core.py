"""Helpers of the tests about the core on the tests' own tools (``tests.support.fake_tools``), without the demo.

* ``lookup(key)`` / ``transfer(account, amount)``: one tool call of a scripted
  turn (``{"name", "arguments"}``) of ``fake_lookup`` / ``fake_transfer``;
* ``core_agent(admin_api, slug, turns, **extra)``: a scripted agent defined
  over the API with both fake tools and the completion check
  ``fake_transfer`` (``extra`` overrides them);
* ``transfer_run(people, api, worker, slug, turns, decide=None)``: such an
  agent's run, drained, each approval it asks decided over the API;
* ``transfer_items(api, people, worker, accounts, amount)``: one waiting run
  per account, its pending approval item each;
* ``asking_agent()`` / ``refused_agent()``: stored scripted agents whose run
  waits for an approval (80 to acme) / completes ``not_achieved`` (500 to
  acme, denied);
* ``pending_transfer(requester=...)``: a pending approval of a transfer made
  without running a model (``tests.support.inbox.pending_call``).

Users come from the ``people`` fixture (``tests/conftest.py``).
"""

from runs.models import Agent
from tests.support.api import create_agent, get_run, pending_interrupts, start_run
from tests.support.durability import make_agent

CORE_TOOLS = ["fake_lookup", "fake_transfer"]


def lookup(key: str = "a") -> dict:
    """A ``fake_lookup`` call of ``key``."""
    return {"name": "fake_lookup", "arguments": {"key": key}}


def transfer(account: str = "acme", amount: float = 60) -> dict:
    """A ``fake_transfer`` call of ``amount`` to ``account`` (over 10 asks a person)."""
    return {"name": "fake_transfer", "arguments": {"account": account, "amount": amount}}


def core_agent(admin_api, slug: str, turns: list[dict], **extra) -> dict:
    """POST a scripted agent with ``CORE_TOOLS`` and the ``fake_transfer`` completion check; its JSON."""
    return create_agent(admin_api, slug, turns, **{"tools": CORE_TOOLS, "completion_check": "fake_transfer", **extra})


def transfer_run(people, api, worker, slug: str, turns: list[dict], decide: dict | None = None,
                 text: str = "Please send 60 to acme.") -> dict:
    """The requester's run of ``core_agent(slug, turns)``, drained, each pending approval approved by
    ``approver`` with the body ``decide`` (as proposed if None) and drained again; the run's JSON."""
    agent = core_agent(api(people["admin"]), slug, turns)
    run = start_run(api(people["requester"]), agent["slug"], text)
    worker.drain()
    approver = api(people["approver"])
    for item in pending_interrupts(approver, run["id"]):
        response = approver.post(f"/api/interrupts/{item['id']}/approve/", decide or {}, format="json")
        assert response.status_code == 200, response.json()
        worker.drain()
    return get_run(api(people["requester"]), run["id"])


def transfer_items(api, people, worker, accounts=("acct-1", "acct-2", "acct-3"), amount: float = 55):
    """One run per account in ``accounts``, each transferring ``amount`` (over 10: asks a person) and drained until
    it waits; their pending ``Interrupt`` items, in order."""
    from approvals.models import Interrupt

    items = []
    for account in accounts:
        agent = core_agent(api(people["admin"]), f"transfer-{account}", [
            {"tool_calls": [transfer(account, amount)]}, {"content": f"Sent {amount} to {account}."}])
        run = start_run(api(people["requester"]), agent["slug"], f"Send {amount} to {account}.")
        worker.drain()
        items.append(Interrupt.objects.get(run_id=run["id"]))
    return items


def asking_agent(slug: str = "send-80"):
    """The scripted agent ``slug`` (made on first use): looks acme up, transfers 80 to it (asks a person), then
    says so; its completion check is ``fake_transfer``. A run of it waits for an approval."""
    return Agent.objects.filter(slug=slug).first() or make_agent(
        slug, [{"tool_calls": [lookup("acme")]}, {"tool_calls": [transfer("acme", 80)]}, {"content": "Sent 80."}],
        tools=CORE_TOOLS, check="fake_transfer")


def refused_agent(slug: str = "send-500"):
    """The scripted agent ``slug`` (made on first use): transfers 500 to acme, which its precondition denies (over
    the account's limit), then answers; a run of it completes ``not_achieved`` without waiting."""
    return Agent.objects.filter(slug=slug).first() or make_agent(
        slug, [{"tool_calls": [transfer("acme", 500)]}, {"content": "Could not send it."}],
        tools=CORE_TOOLS, check="fake_transfer")


def pending_transfer(*, requester, account: str = "acme", amount: float = 80, **options):
    """``tests.support.inbox.pending_call`` of ``fake_transfer`` (``amount`` to ``account``, its rule ``amount >
    10``): a pending approval item in a new waiting run; ``options`` as ``pending_call`` takes them."""
    from tests.support.inbox import pending_call

    return pending_call(requester=requester, name="fake_transfer", arguments={"account": account, "amount": amount},
                        rule="amount > 10", **options)




def transfer_needing_approval(user, slug: str = "wh-transfer"):
    """A queued run of ``user``'s of ``asking_agent(slug)``, started by the service (not over the API); drained,
    it looks acme up and waits for the approval of a transfer of 80. The ``Run``."""
    from runs.engine.lifecycle import start_run as start

    return start(agent=asking_agent(slug), user=user, input="Send 80 to acme.")



def serving_core(people, tmp_path, **env):
    """``tests.support.browser.serving_tests`` of the product without the demo app (``TOLLGATE_DEMO=false``: no payment
    gateway started or needed): a context manager yielding ``(base URL, its subprocess.Popen)`` of ``manage.py
    serve`` against the test database, users from ``people``, ``env`` added to its environment."""
    from types import SimpleNamespace

    from tests.support.browser import serving_tests

    return serving_tests(people, SimpleNamespace(url=""), tmp_path, **{"TOLLGATE_DEMO": "false", **env})



def transfer_turns(account: str = "acme", amount: float = 10) -> list[dict]:
    """Scripted turns: look ``account`` up, transfer ``amount`` to it (10 or less: no person is asked), say so."""
    return [{"tool_calls": [lookup(account)]}, {"tool_calls": [transfer(account, amount)]},
            {"content": f"Transferred {amount} to {account}."}]


def transfer_agent(slug: str, account: str = "acme", amount: float = 10, check: str = "fake_transfer") -> Agent:
    """A stored scripted agent ``slug`` of ``transfer_turns(account, amount)`` with both fake tools and ``check``."""
    return make_agent(slug, transfer_turns(account, amount), tools=CORE_TOOLS, check=check)
