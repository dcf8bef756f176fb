"""config.authentication.TokenAuthentication answers as DRF's TokenAuthentication, key by key."""

import pytest
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

from config.authentication import TokenAuthentication

pytestmark = pytest.mark.django_db(transaction=True)


def _answer(auth, key):
    try:
        user, token = auth.authenticate_credentials(key)
        return ("ok", user.pk, token.pk, user.is_active)
    except exceptions.AuthenticationFailed as exc:
        return ("401", str(exc.detail))


def test_token_lookup_answers_as_drfs(people):
    approver, stranger = people["approver"], people["requester"]
    live = Token.objects.create(user=approver).key
    dead = Token.objects.create(user=stranger).key
    stranger.is_active = False
    stranger.save(update_fields=["is_active"])
    ours, drfs = TokenAuthentication(), authentication.TokenAuthentication()
    for key in (live, dead, "0" * 40, live.upper(), live + " ", "x" * 400, "ü"):
        assert _answer(ours, key) == _answer(drfs, key), key
    user, token = ours.authenticate_credentials(live)
    assert user.auth_token is token and token.user is user  # as select_related caches a one-to-one
