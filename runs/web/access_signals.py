"""Tell live sockets when a user's access may have changed (``runs.live.publish_access_changed``).

The WebSocket consumers (``runs.web.consumers``) check access when a socket
connects and again when told here, so forwarding an event costs no
query. Reported, each once the change is committed:

* a logout (``user_logged_out``): the ended session's sockets close;
* any save of a user (password, ``is_active``, ``is_staff`` ...);
* a change of a user's groups or own permissions, from either side
  (``user.groups.add(...)`` or ``group.user_set.remove(...)``);
* a change of a group's permissions: every member is told;
* a deleted API token (``rest_framework.authtoken``): its user's
  token-authenticated sockets (``config.ws_token``) close.

Changes made around the ORM (raw SQL, a deleted session row) are caught
by the consumers' periodic re-check (``TOLLGATE["LIVE_ACCESS_RECHECK_S"]``).
Connected by ``runs.apps.RunsConfig.ready``.
"""

from django.contrib.auth import get_user_model, user_logged_out
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from rest_framework.authentication import TokenAuthentication

from runs.live import publish_access_changed

# A clear is reported before it happens: afterwards nobody knows who was cleared.
CHANGES = {"post_add", "post_remove", "pre_clear"}


def _tell(user_ids, **kwargs) -> None:
    user_ids = sorted(set(user_ids))
    if user_ids:
        transaction.on_commit(lambda: publish_access_changed(user_ids, **kwargs))


def _logged_out(sender, request, user, **kwargs):
    if user is not None:
        session_key = getattr(getattr(request, "session", None), "session_key", None) or ""
        _tell([user.pk], ended_session=session_key)


def _user_saved(sender, instance, created, update_fields, **kwargs):
    if not created and set(update_fields or ()) != {"last_login"}:  # a login changes nobody's access
        _tell([instance.pk])


def _memberships_changed(sender, instance, action, reverse, pk_set, **kwargs):
    """``User.groups`` / ``User.user_permissions`` changed from either side."""
    if action not in CHANGES:
        return
    if not reverse:  # instance is the user
        _tell([instance.pk])
    else:  # instance is a group or a permission; pk_set holds users (None for a clear)
        _tell(pk_set if pk_set is not None else instance.user_set.values_list("pk", flat=True))


def _group_permissions_changed(sender, instance, action, reverse, pk_set, **kwargs):
    if action not in CHANGES:
        return
    groups = [instance] if not reverse else Group.objects.filter(pk__in=pk_set or ())
    _tell(get_user_model().objects.filter(groups__in=groups).values_list("pk", flat=True))


def _token_deleted(sender, instance, **kwargs):
    _tell([instance.user_id])


def connect() -> None:
    """Connect the receivers (idempotent: each has a ``dispatch_uid``)."""
    user_model = get_user_model()
    user_logged_out.connect(_logged_out, dispatch_uid="tollgate-live-logout")
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="tollgate-live-user-saved")
    m2m_changed.connect(_memberships_changed, sender=user_model.groups.through, dispatch_uid="tollgate-live-groups")
    m2m_changed.connect(_memberships_changed, sender=user_model.user_permissions.through,
                        dispatch_uid="tollgate-live-user-permissions")
    m2m_changed.connect(_group_permissions_changed, sender=Group.permissions.through,
                        dispatch_uid="tollgate-live-group-permissions")
    post_delete.connect(_token_deleted, sender=TokenAuthentication().get_model(),
                        dispatch_uid="tollgate-live-token-deleted")
