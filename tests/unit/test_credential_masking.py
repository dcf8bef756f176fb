"""``mask_credentials``: what JSON shown to people keeps and what it masks (``runs.base.masking``).

A tool's lookup key (``{"key": "order-7"}``) is shown to the approver who
decides on the call; names of credentials (``api_key``, ``secret``,
``token``, ``password``, ``Authorization``...) are masked at any depth.
"""

import pytest

from runs.base.masking import MASK, mask_credentials


@pytest.mark.parametrize("name", ["key", "Key", "KEY"])
def test_a_bare_key_is_a_lookup_key_shown_as_it_is(name):
    arguments = {name: "order-7", "amount": 80, "nested": [{name: "acme"}]}
    assert mask_credentials(arguments) == arguments


@pytest.mark.parametrize("name", [
    "api_key", "apiKey", "api-key", "X-Api-Key", "secret_key", "private_key", "client_secret", "secret",
    "token", "access_token", "password", "passwd", "Authorization", "auth", "credentials", "cookie", "apikey",
])
def test_a_credentials_name_is_masked_at_any_depth(name):
    assert mask_credentials({name: "v4lue", "deep": [{"inner": {name: "v4lue"}}]}) == {
        name: MASK, "deep": [{"inner": {name: MASK}}]}


def test_a_bare_keys_value_is_still_masked_where_it_shows_a_credential():
    """A bare ``key``'s value goes through ``mask_string`` as every string does: a bare API key, a URL's
    password or credential query parameter (a URL's ``?key=`` among them) is masked in it."""
    shown = mask_credentials({"key": "sk-abcdefghijklmnopqrstuvwx",
                              "lookup": {"key": "https://user:pa55word@maps.example/geo?key=AIza-k3y&q=berlin"}})
    assert shown["key"] == MASK
    assert shown["lookup"]["key"] == "https://***@maps.example/geo?key=***&q=berlin"


def test_an_empty_or_null_credential_and_names_without_a_credentials_word_are_kept():
    kept = {"api_key": "", "token": None, "keys": ["a", "b"], "monkey": "m", "max_tokens": 512}
    assert mask_credentials(kept) == kept
