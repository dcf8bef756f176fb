"""URL map: inbox and run pages, REST API and its index, OpenAPI schema and its docs page, admin, login, language switch."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.templatetags.static import static
from django.urls import include, path
from django.utils.functional import lazy
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView

from approvals.web import views as approvals_views
from config.api import django_error_handler
from config.api_schema import ApiDocsView

urlpatterns = [
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico whatever the page says. Not permanent: the target's name carries its
    # content hash, which changes with the icon, and a browser keeps a permanent redirect for good.
    path("favicon.ico", RedirectView.as_view(url=lazy(static, str)("favicon.svg"), permanent=False)),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # POST /i18n/setlang/ (Django's set_language): the header's language switcher.
    path("i18n/", include("django.conf.urls.i18n")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # A page for people: logged out, it sends them to the login page like every other page.
    path("api/docs/", login_required(ApiDocsView.as_view(url_name="schema")), name="api-docs"),
    path("api/", include(("config.api_urls", "api"))),
    path("", approvals_views.home, name="home"),
    path("", include("approvals.web.urls")),
    path("", include("runs.web.urls")),
]

# Errors Django answers outside the API's views: JSON in the API's shape under /api/.
handler400 = django_error_handler(400)
handler403 = django_error_handler(403)
handler404 = django_error_handler(404)
handler500 = django_error_handler(500)
