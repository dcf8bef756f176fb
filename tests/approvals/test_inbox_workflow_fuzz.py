"""The workflow pages under the fuzz pass of tests/attack/test_fuzz.py: bulk form, history filters, preferences.

Every answer is below 500; a 4xx leaves the database as it was.
"""

import pytest
from django.urls import reverse
from hypothesis import example, given
from hypothesis import strategies as st

from tests.support.security import core_approval_item  # noqa: F401
from tests.attack.test_fuzz import FUZZ, _post_form, form_text, still  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_bulk_form_history_filters_and_preferences_never_500(client, people, core_approval_item, still):
    client.force_login(people["approver"])
    pk = str(core_approval_item.pk)

    @FUZZ
    @given(items=st.lists(form_text, max_size=3), decision=st.sampled_from(["approved", "rejected"]) | form_text,
           comment=form_text, shown=form_text)
    @example(["1" * 40], "approved", "", "")
    @example(["-1", "0"], "rejected", "\x00", "x")
    @example([], "rejected", "", "x")
    def attempt(items, decision, comment, shown):
        _post_form(client, reverse("inbox-bulk"), {"item": items + [pk], f"fingerprint-{pk}": shown,
                                                   "decision": decision, "comment": comment})
        assert client.get(reverse("inbox-bulk"), {"item": items}).status_code < 500
        assert client.get(reverse("inbox-decided"), {"decision": decision, "day_from": comment, "tool": shown,
                                                     "page": comment, "who": shown}).status_code < 500
        _post_form(client, reverse("notification-preferences"), {"new_item": comment, "language": shown})

    attempt()
