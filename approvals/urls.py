"""Browser URLs of the inbox."""

from django.urls import path

from approvals import views

urlpatterns = [
    path("inbox/", views.inbox, name="inbox"),
    path("inbox/rows/", views.inbox_rows, name="inbox-rows"),
    path("inbox/<int:interrupt_id>/", views.interrupt_detail, name="inbox-item"),
    path("inbox/<int:interrupt_id>/file/", views.answer_file_download, name="inbox-item-file"),
    path("inbox/<int:interrupt_id>/state/", views.interrupt_state, name="inbox-item-state"),
]
