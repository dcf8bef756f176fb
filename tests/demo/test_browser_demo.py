"""Real-browser check of a repeatable demo (issue 27): ``manage.py demo`` run twice from a new shell (no
``SECRET_KEY``) while a person is logged in; their browser session is kept (passwords are reset only when asked)."""

import pytest

from tests.support.browser import browser, log_in, served  # noqa: F401 (fixtures)
from tests.demo.test_reset import manage_demo_in_a_new_shell

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_logged_in_browser_stays_logged_in_while_the_demo_is_reset_twice(served, browser, payment_gateway):
    page = log_in(browser, served, "approver", "approver-demo")

    for _ in range(2):
        output = manage_demo_in_a_new_shell(gateway_url=payment_gateway.url)
        assert "(unchanged)" in output
        page.goto(served + "/inbox/")
        assert page.url == served + "/inbox/", "sent to the login page: the reset logged the approver out"
        assert page.locator("#logout, form[action$='/accounts/logout/']").count() >= 1
