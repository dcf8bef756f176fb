"""The authentication backend that answers ``user.has_perm``: Django's ``ModelBackend``, with a user's
permissions read in one statement instead of two.

``ModelBackend`` (``django.contrib.auth.backends``) reads the permissions
granted to a user and those of the groups they are in with a statement each,
the first time either is asked for, and keeps them on the user object.
Every request that checks a right pays for both (``runs.access``: who may
see and decide). ``PermissionsBackend`` reads both kinds in one ``UNION
ALL`` and keeps them on the user object under a name of its own
(``CACHE``), through the methods Django's "Customizing authentication in
Django" names as a backend's part in authorization (``get_user_permissions``,
``get_group_permissions``, ``get_all_permissions``, their ``a``-prefixed
forms); ``has_perm`` and ``has_module_perms`` are ``ModelBackend``'s own,
answering from them. Logging in (``authenticate``, ``get_user``) and
``with_perm`` are ``ModelBackend``'s, unchanged.

``config.settings.AUTHENTICATION_BACKENDS`` lists it in place of
``ModelBackend``, after axes' lockout backend. Its answers are
``ModelBackend``'s for every kind of user (``tests/kernel/test_access_rules.py``
compares them): nothing for an inactive or anonymous user or for an object
(``obj`` given), every permission for an active superuser, else what was
granted to the user and to their groups. Like ``ModelBackend``'s, what it
read stays on the user object: a right given or taken away counts for the
next object loaded (the next request), not for this one.
"""

from dataclasses import dataclass

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission
from django.db.models import Value

CACHE = "_tollgate_permissions"  # the attribute of the user object that keeps what was read
_NAMES = ("content_type__app_label", "codename")
_OWN, _GROUPED = "user", "group"


@dataclass(frozen=True)
class Held:
    """What one user holds, read once: ``own`` (granted to them), ``grouped`` (granted to a group they
    are in) and ``every`` (both), as ``"app_label.codename"`` strings."""

    own: set[str]
    grouped: set[str]
    every: set[str]


def _statement(user_obj):
    """Rows ``(app_label, codename, source)``, ``source`` ``"user"`` or ``"group"``: one statement.

    A superuser's rows are every permission (``ModelBackend`` gives them
    all, as their own and as their groups'), each once, as their own.
    """
    if user_obj.is_superuser:
        return Permission.objects.order_by().values_list(*_NAMES, Value(_OWN))
    own = Permission.objects.filter(user=user_obj).order_by().values_list(*_NAMES, Value(_OWN))
    grouped = Permission.objects.filter(group__user=user_obj).order_by().values_list(*_NAMES, Value(_GROUPED))
    return own.union(grouped, all=True)


def _held(user_obj, rows) -> Held:
    """``rows`` of ``_statement(user_obj)`` as ``Held``, kept on ``user_obj``."""
    own: set[str] = set()
    grouped: set[str] = set()
    for app_label, codename, source in rows:
        (own if source == _OWN else grouped).add(f"{app_label}.{codename}")
    if user_obj.is_superuser:
        grouped = set(own)
    held = Held(own=own, grouped=grouped, every=own | grouped)
    setattr(user_obj, CACHE, held)
    return held


def _none_for(user_obj, obj) -> bool:
    """Whether ``ModelBackend`` answers nothing without reading: an inactive or anonymous user, or an object."""
    return not user_obj.is_active or user_obj.is_anonymous or obj is not None


class PermissionsBackend(ModelBackend):
    """``ModelBackend`` whose permissions of a user are read in one statement and kept in ``CACHE``.

    Each method answers a ``set`` of ``"app_label.codename"`` strings, the
    same set as ``ModelBackend``'s; the first call for a user object reads
    (one statement), the next ones read nothing.
    """

    def _held(self, user_obj) -> Held:
        held = getattr(user_obj, CACHE, None)
        return held if held is not None else _held(user_obj, _statement(user_obj))

    async def _aheld(self, user_obj) -> Held:
        held = getattr(user_obj, CACHE, None)
        return held if held is not None else _held(user_obj, [row async for row in _statement(user_obj)])

    def get_user_permissions(self, user_obj, obj=None) -> set[str]:
        """The permissions granted to ``user_obj`` itself (every one for a superuser)."""
        return set() if _none_for(user_obj, obj) else self._held(user_obj).own

    async def aget_user_permissions(self, user_obj, obj=None) -> set[str]:
        """See ``get_user_permissions``."""
        return set() if _none_for(user_obj, obj) else (await self._aheld(user_obj)).own

    def get_group_permissions(self, user_obj, obj=None) -> set[str]:
        """The permissions of the groups ``user_obj`` is in (every one for a superuser)."""
        return set() if _none_for(user_obj, obj) else self._held(user_obj).grouped

    async def aget_group_permissions(self, user_obj, obj=None) -> set[str]:
        """See ``get_group_permissions``."""
        return set() if _none_for(user_obj, obj) else (await self._aheld(user_obj)).grouped

    def get_all_permissions(self, user_obj, obj=None) -> set[str]:
        """Both: what ``has_perm`` (``ModelBackend``'s) looks a permission up in."""
        return set() if _none_for(user_obj, obj) else self._held(user_obj).every

    async def aget_all_permissions(self, user_obj, obj=None) -> set[str]:
        """See ``get_all_permissions``."""
        return set() if _none_for(user_obj, obj) else (await self._aheld(user_obj)).every
