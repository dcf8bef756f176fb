"""What the real-browser tests share: the served app, headless Chromium, logging in.

``served`` runs ``manage.py serve`` (Daphne: HTTP, WebSockets, static
files) against the test database and the test payment gateway; ``browser``
is Debian's Chromium driven by Playwright; ``log_in`` opens a new browser
context (its own cookies: another person) logged in as one user.
"""

import contextlib
import os
import re
from pathlib import Path

import pytest

from tests.support.processes import database_url_for_subprocess, serving_process

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 30_000
# Where screenshots go (test artifacts); each test names its own file beside this one.
SCREENSHOT = Path(os.environ.get("TOLLGATE_SCREENSHOT", "/tmp/tollgate-run.png"))


def _use_server_password_hashes(usernames) -> None:
    """Store the demo passwords with PBKDF2: the tests' MD5-only hasher setting is not the server's."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    for user in get_user_model().objects.filter(username__in=usernames):
        user.password = hasher.encode(f"{user.username}-demo", hasher.salt(), iterations=1000)
        user.save(update_fields=["password"])


@contextlib.contextmanager
def serving_tests(demo, payment_gateway, tmp_path, **env):
    """``(base URL, its subprocess.Popen)`` of ``manage.py serve`` running against the test database and
    the test gateway, storing files under ``tmp_path``, with ``env`` added to its environment."""
    _use_server_password_hashes(demo)
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess(), "GATEWAY_URL": payment_gateway.url,
           "MEDIA_ROOT": str(tmp_path / "media"), "PYTHONUNBUFFERED": "1", **env}
    log_path = tmp_path / "serve.log"
    try:
        with serving_process(env, log_path) as served:
            yield served
    finally:
        if os.environ.get("TOLLGATE_SHOW_SERVE_LOG"):
            print(log_path.read_text())


@pytest.fixture
def served(demo, payment_gateway, tmp_path):
    """Base URL of ``manage.py serve`` running against the test database and the test gateway."""
    with serving_tests(demo, payment_gateway, tmp_path) as (base, _):
        yield base


@pytest.fixture
def served_process(demo, payment_gateway, tmp_path):
    """``(base URL, its subprocess.Popen)``: ``served`` with its process, e.g. to read its memory."""
    with serving_tests(demo, payment_gateway, tmp_path) as served:
        yield served


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("TOLLGATE_CHROMIUM", "/usr/bin/chromium"),
                                    args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def log_in(browser, base: str, username: str, password: str, *, width: int = 1280, height: int = 900):
    """A new browser context (its own cookies) logged in as ``username``: its page, where a login lands
    (the inbox for deciders, the run list for requesters)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.goto(base + "/")
    assert "/accounts/login/" in page.url  # every page needs a login
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login")
    page.wait_for_url(re.compile(re.escape(base) + r"/(inbox|runs)/$"))  # deciders: inbox; requesters: runs
    return page


def boxes(page, *selectors: str) -> list[dict]:
    """``{x, y, width, height}`` (CSS pixels) of the first element of each of ``selectors``, None for one that
    is missing, all read in one script: a live re-render of the page between two separate reads could leave
    an element detached (Playwright's ``bounding_box`` then gives None)."""
    return page.evaluate("""selectors => selectors.map(selector => {
        const element = document.querySelector(selector);
        if (!element) return null;
        const box = element.getBoundingClientRect();
        return {x: box.x, y: box.y, width: box.width, height: box.height};
    })""", list(selectors))


def page_fits(page) -> bool:
    """Whether the page's document is no wider than its viewport (it does not scroll sideways)."""
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.fixture
def served_core(people, tmp_path):
    """Base URL of ``manage.py serve`` without the demo app (``tests.support.core.serving_core``), against the test
    database; ``people`` log in with the password ``<username>-demo`` (``log_in``)."""
    from tests.support.core import serving_core

    with serving_core(people, tmp_path) as (base, _):
        yield base
