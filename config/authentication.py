"""Token authentication for the API: DRF's ``TokenAuthentication``, its token and user read in one statement built once.

Every API request made with a token reads the token with its user.
DRF builds and compiles that query anew each time
(``Token.objects.select_related("user").get(key=key)``), which costs more
CPU than the statement itself. Here the same read goes through
``runs.base.selects``. The answers are DRF's, through the method DRF's
"Custom authentication" names for this (``authenticate_credentials``): a
key that is unknown or whose user is not active is handed to DRF's own
method, which refuses it with its own message, in its own translations
(401).
"""

from rest_framework import authentication

from runs.base import selects


class TokenAuthentication(authentication.TokenAuthentication):
    """``rest_framework.authentication.TokenAuthentication`` whose lookup is ``selects.select_one``.

    ``authenticate_credentials(key)`` returns ``(user, token)``; it raises ``AuthenticationFailed`` through
    DRF's own method.
    """

    def authenticate_credentials(self, key):
        model = self.get_model()
        try:
            token = selects.select_one(model, {"key": key}, related=("user",))
        except model.DoesNotExist:
            token = None
        if token is None or not token.user.is_active:
            return super().authenticate_credentials(key)  # DRF's own refusal and message (read again: rare)
        return token.user, token
