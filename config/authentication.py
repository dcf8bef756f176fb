"""Token authentication for the API: DRF's ``TokenAuthentication``, its token and user read in one statement built once.

Every API request made with a token reads the token with its user.
DRF builds and compiles that query anew each time
(``Token.objects.select_related("user").get(key=key)``), which costs more
CPU than the statement itself. Here the same read goes through
``runs.base.selects``. The answers are DRF's, through the method DRF's
"Custom authentication" names for this (``authenticate_credentials``): an
unknown key is "Invalid token.", and a user who is not active is "User
inactive or deleted."; both are 401 responses.
"""

from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from runs.base import selects


class TokenAuthentication(authentication.TokenAuthentication):
    """``rest_framework.authentication.TokenAuthentication`` whose lookup is ``selects.select_one``.

    ``authenticate_credentials(key)`` returns ``(user, token)``. It raises ``AuthenticationFailed`` as
    DRF's does.
    """

    def authenticate_credentials(self, key):
        model = self.get_model()
        try:
            token = selects.select_one(model, {"key": key}, related=("user",))
        except model.DoesNotExist:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return token.user, token
