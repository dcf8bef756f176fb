"""Issue 10: who may see and decide what is written once, as querysets (runs/access.py).

The querysets must give the answers of the Python rules they replaced
(kept below as the oracle: ``user.has_perm`` and the requester rule) over
a matrix of users and of items made the way the engine makes them, from
tools with each kind of rule; and listing the inbox costs the same number
of queries however many items it holds.
"""

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AnonymousUser, Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from approvals.claims import claim_interrupt, unclaim_interrupt
from approvals.models import Interrupt
from approvals.selectors import PAGE_SIZE, interrupt_get_visible
from approvals.services import can_decide, request_approval, request_input, request_reconciliation
from runs.access import DECIDE_PERMISSION, RunAccess, flag_decidable, holds_permission, may_decide
from runs.base.errors import Forbidden
from runs.engine.lifecycle import cancel_run_as
from runs.models import Agent, Run, Session, Step
from runs.permissions import PermissionsBackend
from tools.models import ToolCall
from tools.registry import Tool

pytestmark = pytest.mark.django_db

SPECIAL_PERMISSION = "tools.approve_large_refund"


def _old_can_decide(user, item: Interrupt) -> bool:
    """The rule ``approvals.services.can_decide`` applied in Python before issue 10."""
    if not user.is_authenticated:
        return False
    if item.kind == "input":
        return user.is_active and (item.run.requested_by_id == user.pk or user.is_staff)
    if not user.has_perm(item.required_permission):
        return False
    return item.allow_requester or item.run.requested_by_id != user.pk


def _old_run_visible(user, run: Run) -> bool:
    """The rule applied before issue 10 (``run_is_visible`` in runs/selectors.py, since gone), plus: an
    inactive user sees nothing."""
    if not (user.is_authenticated and user.is_active):
        return False
    return run.requested_by_id == user.pk or user.is_staff or user.has_perm(DECIDE_PERMISSION)


def _tool(name: str, **rules) -> Tool:
    return Tool(name=name, description=name, parameters={"type": "object"}, handler=lambda ctx, args: None, **rules)


# Each kind of tool rule an item can be made from: who may decide it follows from these.
TOOLS = [
    _tool("side_effect_four_eyes", side_effect=True),                                   # requester may not
    _tool("read_only", side_effect=False),                                              # requester may
    _tool("side_effect_waived", side_effect=True, allow_requester_approval=True),       # tool waives four eyes
    _tool("read_only_strict", side_effect=False, allow_requester_approval=False),       # tool asks for four eyes
    _tool("special_permission", side_effect=True, permission=SPECIAL_PERMISSION),       # its own permission
    _tool("nobodys_permission", side_effect=False, permission="tools.granted_to_nobody"),
]


@pytest.fixture
def world():
    """Users of every kind, and the items of two runs (one per requester) for every tool rule."""
    User = get_user_model()
    decide = Permission.objects.get(codename="decide_interrupt", content_type__app_label="approvals")
    special = Permission.objects.create(codename="approve_large_refund", name="Approve large refunds",
                                        content_type=ContentType.objects.get_for_model(ToolCall))
    deciders = Group.objects.create(name="deciders")
    deciders.permissions.add(decide)
    specials = Group.objects.create(name="specials")
    specials.permissions.add(special)

    users = {
        "superuser": User.objects.create_user("superuser", is_staff=True, is_superuser=True),
        "staff": User.objects.create_user("staff", is_staff=True),
        "direct_approver": User.objects.create_user("direct_approver"),
        "group_approver": User.objects.create_user("group_approver"),
        "special_approver": User.objects.create_user("special_approver"),
        "requester": User.objects.create_user("requester"),
        "approving_requester": User.objects.create_user("approving_requester"),
        "stranger": User.objects.create_user("stranger"),
        "inactive_approver": User.objects.create_user("inactive_approver", is_active=False),
        "inactive_superuser": User.objects.create_user("inactive_superuser", is_superuser=True, is_staff=True,
                                                       is_active=False),
    }
    users["direct_approver"].user_permissions.add(decide)
    users["group_approver"].groups.add(deciders)
    users["special_approver"].groups.add(specials)
    users["approving_requester"].groups.add(deciders, specials)
    users["inactive_approver"].groups.add(deciders)

    agent = Agent.objects.create(slug="matrix", name="matrix", model={"provider": "scripted", "turns": []})
    items = []
    for requester in (users["requester"], users["approving_requester"]):
        session = Session.objects.create(owner=requester, agent=agent)
        run = Run.objects.create(session=session, agent=agent, requested_by=requester, input="x")
        step = Step.objects.create(run=run, index=0)
        for index, tool in enumerate(TOOLS):
            call = ToolCall.objects.create(run=run, step=step, index=index, provider_call_id=f"c{index}",
                                           name=tool.name, arguments={}, side_effect=tool.side_effect)
            items.append(request_approval(tool_call=call, tool=tool))
        # A call of a tool no longer registered: reconciliation item with the default permission, four eyes.
        call = ToolCall.objects.create(run=run, step=step, index=len(TOOLS), provider_call_id="gone",
                                       name="unregistered_tool", arguments={}, side_effect=True)
        items.append(request_reconciliation(tool_call=call))
        # A question of ask_user: the requester's (or staff's) to answer.
        call = ToolCall.objects.create(run=run, step=step, index=len(TOOLS) + 1, provider_call_id="ask",
                                       name="ask_user", arguments={"question": "Which order?"})
        items.append(request_input(tool_call=call, title="Which order?", expires_at=None))
    users["anonymous"] = AnonymousUser()
    return users, items


def _fresh(user):
    """The user as a request would load it (no permission cache carried over)."""
    return user if not user.is_authenticated else get_user_model().objects.get(pk=user.pk)


def test_decidable_by_agrees_with_the_python_rule_for_every_user_and_item(world):
    users, items = world
    agreed = []
    for name, user in users.items():
        expected = {item.pk for item in items if _old_can_decide(_fresh(user), item)}
        assert set(Interrupt.objects.decidable_by(_fresh(user)).values_list("pk", flat=True)) == expected, name
        flags = dict(Interrupt.objects.with_decidable_flag(_fresh(user)).values_list("pk", "user_may_decide"))
        assert {pk for pk, flag in flags.items() if flag} == expected, name
        assert {item.pk for item in items if can_decide(_fresh(user), item)} == expected, name
        in_memory = _fresh(user)  # what a decision re-checks with the item and its run locked
        assert {item.pk for item in items
                if may_decide(in_memory, item, requested_by_id=item.run.requested_by_id)} == expected, name
        agreed.append((name, len(expected)))
    # The matrix is not degenerate: the rule says yes and no, for different reasons.
    counts = dict(agreed)
    assert counts["superuser"] == len(items)
    assert counts["stranger"] == counts["anonymous"] == 0
    assert counts["inactive_approver"] == counts["inactive_superuser"] == 0
    assert counts["staff"] == 2                                          # the two questions
    assert counts["requester"] == 1                                      # the question of their own run
    assert counts["direct_approver"] == counts["group_approver"] == 10  # both runs, decide-permission items
    assert counts["special_approver"] == 2                               # the special tool's items only


def _permission_names() -> set[str]:
    return {f"{app_label}.{codename}" for app_label, codename in
            Permission.objects.values_list("content_type__app_label", "codename")}


def test_the_backend_answers_as_model_backend_for_every_user_in_one_statement(world):
    """``runs.permissions.PermissionsBackend`` against Django's ``ModelBackend``, each on a user object of
    its own never read: the same sets, the same ``has_perm`` for every permission, one statement (none
    for an inactive or anonymous user), nothing more once read, nothing for an object."""
    users, items = world
    both = users["approving_requester"]  # in two groups, and granted one of their permissions directly too
    both.user_permissions.add(Permission.objects.get(codename="decide_interrupt", content_type__app_label="approvals"))
    backend, django = PermissionsBackend(), ModelBackend()
    names = _permission_names() | {"tools.granted_to_nobody", "approvals.no_such_thing"}
    asked = ("get_all_permissions", "get_user_permissions", "get_group_permissions")
    for name, user in users.items():
        ours, theirs = _fresh(user), _fresh(user)
        with CaptureQueriesContext(connection) as reading:
            held = tuple(getattr(backend, method)(ours) for method in asked)
        assert len(reading.captured_queries) == (1 if user.is_active else 0), name  # anonymous: never active
        assert held == tuple(getattr(django, method)(theirs) for method in asked), name
        with CaptureQueriesContext(connection) as cached:
            held_perms = {perm for perm in names if backend.has_perm(ours, perm)}
            assert backend.has_module_perms(ours, "approvals") == django.has_module_perms(theirs, "approvals"), name
        assert len(cached.captured_queries) == 0, name
        assert held_perms == {perm for perm in names if django.has_perm(theirs, perm)}, name
        assert [getattr(backend, method)(ours, obj=items[0]) for method in asked] == [set()] * 3, name
        assert async_to_sync(backend.aget_all_permissions)(_fresh(user)) == held[0], name
        assert async_to_sync(backend.ahas_perm)(_fresh(user), DECIDE_PERMISSION) == django.has_perm(
            theirs, DECIDE_PERMISSION), name
    assert backend.get_user_permissions(_fresh(both)) == {DECIDE_PERMISSION}
    assert backend.get_all_permissions(_fresh(users["superuser"])) == _permission_names()
    assert backend.get_all_permissions(_fresh(users["stranger"])) == set()


def test_an_unsaved_users_permissions_are_refused_as_model_backend_refuses_them(db):
    """Reviewer: the statement built once bound a missing id and answered nothing, where ``ModelBackend`` raises."""
    unsaved = get_user_model()(username="not-yet", is_active=True)
    with pytest.raises(ValueError):
        ModelBackend().get_all_permissions(unsaved)
    with pytest.raises(ValueError):
        PermissionsBackend().get_all_permissions(unsaved)


def test_a_users_permissions_are_read_once_in_one_statement_through_the_settings_backend(world):
    """What every surface asks (``RunAccess.of``, ``holds_permission``, ``may_decide``, ``user.has_perm``)
    reads a user's permissions once, in one statement, through ``AUTHENTICATION_BACKENDS``; a superuser's
    are never read (``User.has_perm`` answers first)."""
    users, items = world
    User = get_user_model()
    for name, user in users.items():
        if not user.is_authenticated:
            continue
        read = _fresh(user)
        with CaptureQueriesContext(connection) as reading:
            access = RunAccess.of(read)
            holds_permission(read, "required_permission")
            decided = {item.pk for item in items if may_decide(read, item, requested_by_id=item.run.requested_by_id)}
            read.has_perm(SPECIAL_PERMISSION)
        reads = 1 if user.is_active and not user.is_superuser else 0  # a superuser holds every permission unread
        assert len(reading.captured_queries) == reads, name
        django = User.objects.get(pk=user.pk)
        assert read.get_all_permissions() == ModelBackend().get_all_permissions(django), name
        assert access.sees_all == bool(django.is_active and (django.is_staff or django.has_perm(DECIDE_PERMISSION)))
        assert decided == {item.pk for item in items if _old_can_decide(django, item)}, name


def test_can_decide_takes_a_loaded_flag_only_for_the_user_it_was_loaded_for(world):
    users, items = world
    everything = list(Interrupt.objects.with_decidable_flag(_fresh(users["superuser"])))  # every flag true
    assert all(item.user_may_decide for item in everything)
    for name, user in users.items():
        expected = {item.pk for item in items if _old_can_decide(_fresh(user), item)}
        fresh = _fresh(user)
        mine = list(Interrupt.objects.with_decidable_flag(fresh).select_related("run"))
        with CaptureQueriesContext(connection) as own_flag:
            assert {item.pk for item in mine if can_decide(fresh, item)} == expected, name
        if user.is_authenticated:
            assert len(own_flag.captured_queries) == 0, name  # the flag answered
        flagged = list(Interrupt.objects.select_related("run"))  # one item's lookup sets the flag in memory
        for item in flagged:
            flag_decidable(fresh, item, requested_by_id=item.run.requested_by_id)
        with CaptureQueriesContext(connection) as own_flag:
            assert {item.pk for item in flagged if can_decide(fresh, item)} == expected, name
        if user.is_authenticated:
            assert len(own_flag.captured_queries) == 0, name
        # the superuser's flags say nothing about anyone else
        assert {item.pk for item in everything if can_decide(_fresh(user), item)} == expected, name


def test_the_requester_rule_follows_the_tool(world):
    users, items = world
    user = users["approving_requester"]  # holds both permissions and requested one of the runs
    decidable = {(item.run.requested_by == user, item.tool_call.name) for item in items if can_decide(user, item)}
    assert {name for own, name in decidable if own} == {"read_only", "side_effect_waived", "ask_user"}
    assert {name for own, name in decidable if not own} == {
        "side_effect_four_eyes", "read_only", "side_effect_waived", "read_only_strict", "special_permission",
        "unregistered_tool"}


def test_visible_to_agrees_with_the_python_rules(world):
    users, items = world
    runs = list(Run.objects.all())
    for name, user in users.items():
        expected_runs = {run.pk for run in runs if _old_run_visible(_fresh(user), run)}
        assert set(Run.objects.visible_to(_fresh(user)).values_list("pk", flat=True)) == expected_runs, name
        assert set(Run.objects.cancellable_by(_fresh(user)).values_list("pk", flat=True)) == expected_runs, name
        in_memory = RunAccess.of(_fresh(user))  # what a live socket keeps and asks per event
        assert {run.pk for run in runs if in_memory.sees(run.requested_by_id)} == expected_runs, name
        expected_items = {item.pk for item in items
                          if _old_can_decide(_fresh(user), item) or _old_run_visible(_fresh(user), item.run)}
        assert set(Interrupt.objects.visible_to(_fresh(user)).values_list("pk", flat=True)) == expected_items, name
    special = users["special_approver"]
    assert set(Interrupt.objects.visible_to(special).values_list("tool_call__name", flat=True)) == {
        "special_permission"}  # decides them, so sees them, without seeing the rest of those runs


def test_the_item_pages_lookup_flags_each_item_as_decidable_by_says_in_one_statement(world):
    """``approvals.selectors.interrupt_get_visible``: the items ``visible_to`` finds, each with the flag of
    ``decidable_by`` for this user, set in memory (``flag_decidable``): one statement once the user's
    permissions are read (none for a user who sees nothing)."""
    users, items = world
    for name, user in users.items():
        fresh = _fresh(user)
        fresh.get_all_permissions()  # read, as a request's first check (``RunAccess.of``) mostly has
        visible = set(Interrupt.objects.visible_to(fresh).values_list("pk", flat=True))
        decidable = set(Interrupt.objects.decidable_by(fresh).values_list("pk", flat=True))
        found, flagged = set(), set()
        for item in items:
            with CaptureQueriesContext(connection) as lookup:
                shown = interrupt_get_visible(user=fresh, interrupt_id=item.pk)
            assert len(lookup.captured_queries) == (1 if user.is_active else 0), name
            if shown is not None:
                found.add(shown.pk)
                assert shown.decidable_flag_for == fresh.pk and can_decide(fresh, shown) == shown.user_may_decide
                if shown.user_may_decide:
                    flagged.add(shown.pk)
        assert found == visible and flagged == decidable, name


def test_who_may_claim_an_item_is_who_may_decide_it(world):
    """``approvals.claims``: a claim (and an unclaim) is refused to whoever ``decidable_by`` leaves out,
    whether the item comes with its run (the item page's lookup: no statement before the refusal) or not."""
    users, items = world
    for name, user in users.items():
        expected = {item.pk for item in items if _old_can_decide(_fresh(user), item)}
        claimed = set()
        for item in Interrupt.objects.select_related("run"):
            fresh = _fresh(user)
            fresh.get_all_permissions()  # read, as the request's lookup of the item has
            if item.pk in expected:
                claim_interrupt(interrupt=item, user=fresh)
                assert Interrupt.objects.get(pk=item.pk).claimed_by_id == fresh.pk, name
                unclaim_interrupt(interrupt=Interrupt.objects.get(pk=item.pk), user=_fresh(user))  # run not loaded
                claimed.add(item.pk)
                continue
            with CaptureQueriesContext(connection) as refused:
                for change in (claim_interrupt, unclaim_interrupt):
                    with pytest.raises(Forbidden):
                        change(interrupt=item, user=fresh)
            assert refused.captured_queries == [], name
            with pytest.raises(Forbidden):
                claim_interrupt(interrupt=Interrupt.objects.get(pk=item.pk), user=_fresh(user))
        assert claimed == expected, name
    assert not Interrupt.objects.filter(claimed_by__isnull=False).exists()


def test_cancel_is_refused_to_whoever_may_not_see_the_run(world):
    users, items = world
    run = items[0].run
    with pytest.raises(Forbidden):
        cancel_run_as(run=run, user=users["stranger"])
    run.refresh_from_db()
    assert run.cancel_requested_at is None and run.status == "queued"
    assert cancel_run_as(run=run, user=users["group_approver"]).status == "cancelled"


def _add_pending_items(run: Run, count: int) -> None:
    step = run.steps.first()
    start = run.tool_calls.count()
    for index in range(start, start + count):
        call = ToolCall.objects.create(run=run, step=step, index=index, provider_call_id=f"more{index}",
                                       name="side_effect_four_eyes", arguments={"n": index}, side_effect=True)
        request_approval(tool_call=call, tool=TOOLS[0])


@pytest.mark.parametrize("approver", ["group_approver", "superuser"])
def test_listing_the_inbox_costs_the_same_queries_for_2_or_22_items(world, client, approver):
    users, items = world
    user = users[approver]
    client.force_login(user)
    api = APIClient()  # each request loads its user afresh, as in production
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")

    def cost() -> tuple[int, int, int, int]:
        with CaptureQueriesContext(connection) as page:
            page_response = client.get(reverse("inbox"))
        with CaptureQueriesContext(connection) as listing:
            api_response = api.get("/api/interrupts/", {"status": "pending", "limit": 1000})
        assert page_response.status_code == api_response.status_code == 200
        shown = page_response.content.decode().count('class="inbox-item"')
        listed = api_response.json()
        listed = listed["results"] if isinstance(listed, dict) else listed
        return len(page.captured_queries), len(listing.captured_queries), shown, len(listed)

    few = cost()
    _add_pending_items(items[0].run, 20)
    many = cost()
    # The new items are listed (the page shows its first PAGE_SIZE of them).
    assert many[2] == min(few[2] + 20, PAGE_SIZE) and many[3] == few[3] + 20
    # The page reads items that expire, then (if it is not full yet) those that never do: one
    # query fewer once the first alone fills it; never more with more items.
    assert many[0] <= few[0] and many[1] == few[1]
