"""Browser URLs of the inbox."""

from django.urls import path

from approvals.web import bulk, views, workflow

urlpatterns = [
    path("inbox/", views.inbox, name="inbox"),
    path("inbox/rows/", views.inbox_rows, name="inbox-rows"),
    path("inbox/decided/", workflow.decided, name="inbox-decided"),
    path("inbox/bulk/", bulk.inbox_bulk, name="inbox-bulk"),
    path("inbox/bulk/outcomes/", bulk.inbox_bulk_outcomes, name="inbox-bulk-outcomes"),
    path("inbox/preferences/", workflow.notification_preferences, name="notification-preferences"),
    path("inbox/<int:interrupt_id>/", views.interrupt_detail, name="inbox-item"),
    path("inbox/<int:interrupt_id>/claim/", workflow.claim, name="inbox-item-claim"),
    path("inbox/<int:interrupt_id>/file/", views.answer_file_download, name="inbox-item-file"),
    path("inbox/<int:interrupt_id>/state/", views.interrupt_state, name="inbox-item-state"),
]
