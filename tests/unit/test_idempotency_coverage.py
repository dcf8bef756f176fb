"""Every POST endpoint of the REST API takes ``Idempotency-Key`` (``config.idempotency.IdempotentPostMixin``).

Read from the URL configuration, so a new endpoint cannot forget it. What
the key does is tests/api/test_idempotency.py.
"""

from django.urls import URLPattern, URLResolver

from config import api_urls
from config.idempotency import IdempotentPostMixin


def test_every_post_endpoint_honours_idempotency_keys():
    """Every API view that answers POST has the mixin (a new endpoint cannot forget it)."""

    def views(patterns):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from views(pattern.url_patterns)
            elif isinstance(pattern, URLPattern):
                yield pattern.callback

    def posts(view) -> bool:
        if not hasattr(view, "cls"):  # a plain Django view: only the wait endpoint, GET only
            assert view is api_urls.run_wait, f"a plain view in the API must not take POST: {view}"
            return False
        actions = getattr(view, "actions", None)  # a viewset route: {method: action}
        return "post" in actions if actions is not None else hasattr(view.cls, "post")

    posting = [view for view in views(api_urls.urlpatterns) if posts(view)]
    assert {view.cls.__name__ for view in posting} == {"AgentViewSet", "RunViewSet", "InterruptViewSet",
                                                       "SessionViewSet", "EventView", "WebhookSubscriptionViewSet",
                                                       "WebhookDeliveryViewSet"}
    assert all(issubclass(view.cls, IdempotentPostMixin) for view in posting)
