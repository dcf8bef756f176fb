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

The statement's SQL is built once per process and kind of user (``_sql``),
from the models' own table and column names: compiling the ``UNION`` with
the ORM cost 0.9 ms of CPU per request that checks a right, ten times the
statement itself.

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

from asgiref.sync import sync_to_async
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection

CACHE = "_tollgate_permissions"  # the attribute of the user object that keeps what was read
_OWN, _GROUPED = "user", "group"
_SQL: dict = {}  # (user model, superuser) -> the statement of ``_rows``


@dataclass(frozen=True)
class Held:
    """What one user holds, read once: ``own`` (granted to them), ``grouped`` (granted to a group they
    are in) and ``every`` (both), as ``"app_label.codename"`` strings."""

    own: set[str]
    grouped: set[str]
    every: set[str]


def _rows(user_obj) -> list[tuple[str, str, str]]:
    """Rows ``(app_label, codename, source)``, ``source`` ``"user"`` or ``"group"``: one statement.

    A superuser's rows are every permission (``ModelBackend`` gives them
    all, as their own and as their groups'), each once, as their own.
    Raises ``ValueError`` for a user not saved yet, as ``ModelBackend``'s
    related filters do.
    """
    superuser = bool(user_obj.is_superuser)
    if not superuser and user_obj.pk is None:  # Django's own refusal of an unsaved instance in a related filter
        Permission.objects.filter(user=user_obj)
    key = (type(user_obj), superuser)
    sql = _SQL.get(key) or _SQL.setdefault(key, _sql(type(user_obj), superuser))
    with connection.cursor() as cursor:
        cursor.execute(sql, [] if superuser else [user_obj.pk, user_obj.pk])
        return cursor.fetchall()


def _sql(user_model, superuser: bool) -> str:
    """The statement of ``_rows`` for users of ``user_model``: what ``ModelBackend`` reads
    (``user.user_permissions`` and ``Permission`` by ``group__user``), from the models' tables and columns;
    parameters: the user's id twice (none for a superuser)."""
    quote = connection.ops.quote_name
    perm, ctype = Permission._meta, ContentType._meta
    p, c = quote(perm.db_table), quote(ctype.db_table)
    select = (f"SELECT {c}.{quote(ctype.get_field('app_label').column)}, {p}.{quote(perm.get_field('codename').column)}"
              ", '{source}' FROM " f"{p} INNER JOIN {c} ON {c}.{quote(ctype.pk.column)} = "
              f"{p}.{quote(perm.get_field('content_type').column)}")
    if superuser:
        return select.format(source=_OWN)
    own = user_model._meta.get_field("user_permissions")
    own_table = quote(own.remote_field.through._meta.db_table)
    groups = user_model._meta.get_field("groups")
    member_table = quote(groups.remote_field.through._meta.db_table)
    granted = Group._meta.get_field("permissions")
    granted_table = quote(granted.remote_field.through._meta.db_table)
    pk = f"{p}.{quote(perm.pk.column)}"
    return (f"{select.format(source=_OWN)} INNER JOIN {own_table} ON {own_table}.{quote(own.m2m_reverse_name())} = {pk} "
            f"WHERE {own_table}.{quote(own.m2m_column_name())} = %s "
            f"UNION ALL {select.format(source=_GROUPED)} "
            f"INNER JOIN {granted_table} ON {granted_table}.{quote(granted.m2m_reverse_name())} = {pk} "
            f"INNER JOIN {member_table} ON {member_table}.{quote(groups.m2m_reverse_name())} = "
            f"{granted_table}.{quote(granted.m2m_column_name())} "
            f"WHERE {member_table}.{quote(groups.m2m_column_name())} = %s")


def _held(user_obj, rows) -> Held:
    """``rows`` of ``_rows(user_obj)`` as ``Held``, kept on ``user_obj``."""
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
        return held if held is not None else _held(user_obj, _rows(user_obj))

    async def _aheld(self, user_obj) -> Held:
        held = getattr(user_obj, CACHE, None)
        return held if held is not None else _held(user_obj, await sync_to_async(_rows)(user_obj))

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
