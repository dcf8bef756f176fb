"""Template context for every page: the inbox counts shown in the navigation."""

from django.utils.functional import SimpleLazyObject

from approvals.selectors import inbox_counts as count_pending


def inbox_counts(request) -> dict:
    """``{"inbox_counts": ...}``: ``approvals.selectors.inbox_counts`` of the logged-in user, read (one
    query) only when a template uses it; nothing for anonymous users."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"inbox_counts": SimpleLazyObject(lambda: count_pending(user=user))}
