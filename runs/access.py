"""Who may see, cancel and decide what: the two querysets every surface asks.

* ``Run.objects.visible_to(user)`` (``RunQuerySet``): the runs ``user`` may
  see — and so cancel (``cancellable_by``). Staff and holders of
  ``DECIDE_PERMISSION`` see every run; anyone else the runs they requested.
  The rule is ``RunAccess``: two facts about the user, applied in SQL by
  the queryset and in memory by a live socket (no query per event).
* ``Interrupt.objects.decidable_by(user)`` (``InterruptQuerySet``): the inbox
  items ``user`` may resolve. A question (``input`` item) is answered by the
  run's requester or by staff. Any other item names the permission it needs
  (``required_permission``, the tool's ``permission``) and whether the run's
  requester may decide it (``allow_requester``, the tool's
  ``requester_may_decide``: four eyes for side effects unless the tool says
  otherwise). Both are read per row, so the permission check is done in
  SQL (``holds_permission``), not in a loop in Python.
* ``Interrupt.objects.visible_to(user)``: items ``user`` may look at, those
  they may decide and those of runs they may see.
* ``may_decide(user, item, requested_by_id=...)``: ``decidable_by``'s rule
  for one item already loaded, in memory (``flag_decidable`` sets the flag
  ``with_decidable_flag`` loads): the API's and the item page's lookup of
  one item, a claim's check, and a decision's second check with the item
  and run locked, take no statement.

* ``may_deliver_event(user, run)``: who may deliver an external event to a
  run waiting for one (``POST /api/events/``): its requester, or a holder of
  ``DELIVER_EVENT_PERMISSION`` (the integrator's service account).

An inactive or anonymous user sees and decides nothing. API, pages,
WebSocket consumers, the admin's actions and the engine's cancel ask these
querysets; a single object is checked with ``.filter(pk=...).exists()``, so
each rule is written here once (docs/design.md#who-may-see-and-decide), the
in-memory forms (``RunAccess.sees``, ``may_decide``) beside the SQL they
must agree with (``tests/kernel/test_access_rules.py`` holds them to it).
A user's permissions are Django's (``user.has_perm``,
``user.get_all_permissions``), read once per user object, in one statement,
by the authentication backend (``runs.permissions.PermissionsBackend``).

This module is in the runs kernel (``tests/unit/test_layers.py``): it names the
approvals app's permission and ``Interrupt`` fields as strings, never by
import.
"""

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import models
from django.db.models import BooleanField, ExpressionWrapper, IntegerField, Q, Value

DECIDE_PERMISSION = "approvals.decide_interrupt"
# Django's "add" permission of tools.ExternalEvent (runs.add_externalevent until issue 24): adding one delivers it.
DELIVER_EVENT_PERMISSION = "tools.add_externalevent"
INPUT_KIND = "input"  # approvals.models.InterruptKind.INPUT: a question to the run's requester


def _active(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active)


def holds_permission(user, field: str) -> Q:
    """A condition on a row: the permission named by its ``field`` (``"app_label.codename"``) is held by ``user``.

    The same answer as ``user.has_perm`` (``ModelBackend``'s): nothing for an
    inactive or anonymous user, everything for an active superuser, else
    ``field IN`` the names of ``user.get_all_permissions()`` (one statement
    the first time, ``runs.permissions``, then kept on the user). Why a list
    and not a subquery: docs/design.md#who-may-see-and-decide.
    """
    if not _active(user):
        return Q(Value(False, output_field=BooleanField()))
    if user.is_superuser:
        return Q(Value(True, output_field=BooleanField()))
    granted = sorted(user.get_all_permissions())
    if not granted:
        return Q(Value(False, output_field=BooleanField()))
    return Q(**{f"{field}__in": granted})


def may_decide(user, item, *, requested_by_id: int | None) -> bool:
    """Whether ``user`` may resolve ``item``, an inbox item as loaded (its ``kind``, ``required_permission``
    and ``allow_requester``) of a run requested by user ``requested_by_id``: ``decidable_by``'s rule, in
    memory (no statement once the user's permissions are read: ``user.has_perm``).

    The same answer as ``Interrupt.objects.decidable_by(user).filter(pk=item.pk).exists()`` for the item
    and run as loaded.
    """
    if not _active(user):
        return False
    own_run = requested_by_id is not None and requested_by_id == user.pk
    if item.kind == INPUT_KIND:
        return own_run or user.is_staff
    return user.has_perm(item.required_permission) and (item.allow_requester or not own_run)


def flag_decidable(user, item, *, requested_by_id: int | None) -> None:
    """Set on ``item``, one inbox item already loaded, what ``with_decidable_flag(user)`` would have
    loaded with it: ``user_may_decide`` (``may_decide``) and ``decidable_flag_for``. For a lookup of one
    item, whose SQL flag costs more CPU to build than the rest of the statement."""
    item.user_may_decide = may_decide(user, item, requested_by_id=requested_by_id)
    item.decidable_flag_for = user.pk


@dataclass(frozen=True)
class RunAccess:
    """Which runs one user sees, read once: ``user_id`` (None: an inactive or anonymous user, who sees
    nothing) and ``sees_all`` (active staff, or an active holder of ``DECIDE_PERMISSION``); anyone
    else sees the runs they requested."""

    user_id: int | None
    sees_all: bool = False

    @classmethod
    def of(cls, user) -> "RunAccess":
        """The facts for ``user`` as loaded (``has_perm``: one statement the first time, kept on the user)."""
        if not _active(user):
            return cls(None)
        return cls(user.pk, bool(user.is_staff or user.has_perm(DECIDE_PERMISSION)))

    def sees(self, requested_by: int) -> bool:
        """Whether the user sees a run requested by user ``requested_by`` (in memory)."""
        return self.user_id is not None and (self.sees_all or requested_by == self.user_id)

    def filter(self, rows: models.QuerySet, *, owner_field: str = "requested_by") -> models.QuerySet:
        """``rows`` narrowed to those the user sees (in SQL); the same rule as ``sees``.

        ``owner_field`` names the user a row belongs to: a run's
        ``requested_by`` (the default), a session's ``owner``.
        """
        if self.user_id is None:
            return rows.none()
        return rows.all() if self.sees_all else rows.filter(self.condition(owner_field))

    def condition(self, owner_field: str = "requested_by") -> Q:
        """The rule as a condition on a row, for a user who sees only their own: ``owner_field``
        (a field or a path through relations, e.g. ``run__requested_by``) is the user. Anyone else
        (no user, or ``sees_all``) is narrowed by ``filter``."""
        return Q(**{f"{owner_field}_id": self.user_id})


class RunQuerySet(models.QuerySet):
    """``Run.objects``: the rule of who may see and cancel a run."""

    def visible_to(self, user) -> "RunQuerySet":
        """The runs ``user`` may see (``RunAccess``): every run for staff and deciders, else the ones they requested."""
        return RunAccess.of(user).filter(self)

    def cancellable_by(self, user) -> "RunQuerySet":
        """The runs ``user`` may ask to cancel: those they may see (requester, staff, deciders)."""
        return self.visible_to(user)


class InterruptQuerySet(models.QuerySet):
    """``Interrupt.objects``: the rule of who may decide an inbox item, and who may look at one."""

    def _decidable(self, user) -> Q:
        own_run = Q(run__requested_by=user.pk)
        question = Q(kind=INPUT_KIND) if user.is_staff else Q(kind=INPUT_KIND) & own_run
        permitted = (~Q(kind=INPUT_KIND) & holds_permission(user, "required_permission")
                     & (Q(allow_requester=True) | ~own_run))
        return question | permitted

    def decidable_by(self, user) -> "InterruptQuerySet":
        """The items ``user`` may resolve. A question (``input`` item): its run's requester, or staff.
        Any other item: whoever holds its ``required_permission`` and, unless it has
        ``allow_requester``, did not request its run. Any status: filter ``pending`` yourself."""
        if not _active(user):
            return self.none()
        return self.filter(self._decidable(user))

    def visible_to(self, user) -> "InterruptQuerySet":
        """The items ``user`` may look at: those they may decide, and every item of a run they may see."""
        access = RunAccess.of(user)
        if access.user_id is None:
            return self.none()
        if access.sees_all:
            return self.all()
        # The run's requester on the joined run row, not ``run IN (the user's runs)``: a list in
        # created order then stops after a page instead of first hashing every run of the user.
        return self.filter(access.condition("run__requested_by") | self._decidable(user))

    def with_decidable_flag(self, user) -> "InterruptQuerySet":
        """Each item annotated ``user_may_decide`` (bool): whether it is in ``decidable_by(user)``, and
        ``decidable_flag_for`` (the user's id, or None), which says whose flag it is
        (``approvals.services.can_decide`` then needs no query)."""
        whose = Value(user.pk, output_field=IntegerField())
        if not _active(user):
            return self.annotate(user_may_decide=Value(False, output_field=BooleanField()), decidable_flag_for=whose)
        return self.annotate(user_may_decide=ExpressionWrapper(self._decidable(user), output_field=BooleanField()),
                             decidable_flag_for=whose)


def users_who_may_decide(interrupt):
    """The active users ``interrupt`` is for (a ``User`` queryset): the same rule as ``decidable_by``, per user.

    An ``input`` item is a question to its run's requester: only them (staff
    may answer too, but the question is not addressed to them). Any other
    item: superusers and the holders of its ``required_permission``
    (granted to them or to one of their groups), less the run's requester
    unless ``allow_requester``. ``interrupt`` needs ``run`` loaded or loadable.
    """
    app_label, _, codename = interrupt.required_permission.partition(".")
    return deciders(question=interrupt.kind == INPUT_KIND, app_label=app_label, codename=codename,
                    allow_requester=interrupt.allow_requester, requester=interrupt.run.requested_by_id)


def deciders(*, question: bool, app_label: str, codename: str, allow_requester: bool, requester: int):
    """``users_who_may_decide`` of an item given by its parts (a ``User`` queryset): a ``question`` (an
    ``input`` item) or one needing permission ``app_label.codename``, of a run requested by user id
    ``requester``. Each value is a parameter of the query, never part of its SQL
    (``runs.base.query_templates``)."""
    users = get_user_model().objects.filter(is_active=True)
    if question:
        return users.filter(pk=requester)
    permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename)
    holders = Q(is_superuser=True) | Q(user_permissions__in=permission) | Q(groups__permissions__in=permission)
    users = users.filter(pk__in=get_user_model().objects.filter(holders).values("pk"))
    return users if allow_requester else users.exclude(pk=requester)


def groups_that_may_decide(interrupt):
    """The Django groups whose members may decide ``interrupt`` (a ``Group`` queryset; none for an input item)."""
    if interrupt.kind == INPUT_KIND:
        return Group.objects.none()
    app_label, _, codename = interrupt.required_permission.partition(".")
    return Group.objects.filter(permissions__content_type__app_label=app_label,
                                permissions__codename=codename).order_by("name")


def may_deliver_event(user, run) -> bool:
    """Whether ``user`` may deliver an external event to ``run``: an active user who requested it, or who
    holds ``DELIVER_EVENT_PERMISSION`` (superusers hold every permission). A key can be guessed (the model
    may choose it), so it is no capability of its own."""
    return _active(user) and (run.requested_by_id == user.pk or user.has_perm(DELIVER_EVENT_PERMISSION))
