"""URL map: inbox and run pages, REST API, OpenAPI schema, admin, login, language switch."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # POST /i18n/setlang/ (Django's set_language): the header's language switcher.
    path("i18n/", include("django.conf.urls.i18n")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/", include(("config.api_urls", "api"))),
    path("", RedirectView.as_view(pattern_name="inbox", permanent=False), name="home"),
    path("", include("approvals.urls")),
    path("", include("runs.urls")),
]
