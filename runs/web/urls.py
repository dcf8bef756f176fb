"""Browser URLs of the runs app."""

from django.urls import path

from runs.web import views

urlpatterns = [
    path("runs/", views.run_list, name="run-list"),
    path("runs/new/", views.run_start, name="run-start"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/status/", views.run_status, name="run-status"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
]
