"""Languages and time zones of the pages (README "Languages and time zones").

Through Django's test client: the page language follows Accept-Language and
the switcher's cookie, the API stays English, times follow the browser's
zone cookie. Without a browser or server: the translation catalogue is
complete and current (GNU gettext's own tools: ``xgettext`` through
``makemessages``, ``msgcmp``; tests/run.sh installs them). Real-browser
checks are in tests/browser/test_i18n.py; the checks that need no database
(every shown value has a label, the committed ``.mo`` matches its ``.po``,
no template text is left unmarked) are in tests/unit/test_page_labels.py,
tests/unit/test_compiled_catalogue.py and tests/unit/test_template_translations.py.
"""

import re
import shutil
import subprocess
import sys
from datetime import timezone as dt_timezone
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse

from runs.engine.lifecycle import start_run
from tests.support.core import asking_agent
from tests.support.i18n import PO, ROOT, gettext_tool

# What makemessages reads (README "Languages and time zones").
SOURCES = ["manage.py", "config", "runs", "approvals", "tools", "templates"]


# --- Language of pages and API ----------------------------------------------

@pytest.fixture
def approver_client(client, people):
    client.force_login(people["approver"])
    return client


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("accept, heading, html_lang", [
    ("zh-hans", "<h1>收件箱</h1>", "zh-hans"),
    ("zh-CN,zh;q=0.9,en;q=0.8", "<h1>收件箱</h1>", "zh-hans"),  # what a Chinese browser sends
    ("en-GB,en;q=0.9", "<h1>Inbox</h1>", "en"),
    ("fr-FR", "<h1>Inbox</h1>", "en"),  # not offered: LANGUAGE_CODE
])
def test_page_language_follows_accept_language(approver_client, accept, heading, html_lang):
    response = approver_client.get(reverse("inbox"), HTTP_ACCEPT_LANGUAGE=accept)
    body = response.content.decode()
    assert heading in body and f'<html lang="{html_lang}">' in body
    assert response["Content-Language"] == html_lang
    assert "Accept-Language" in response["Vary"]


@pytest.mark.django_db(transaction=True)
def test_error_pages_and_admin_actions_are_translated(client, people, waiting_run):
    client.force_login(people["admin"])
    missing = client.get("/runs/999999/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert missing.status_code == 404 and "未找到 (404)" in missing.content.decode()
    admin_list = client.get("/admin/runs/run/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "取消所选运行" in admin_list and "Django 站点管理员" in admin_list  # ours and Django's own


@pytest.mark.django_db(transaction=True)
def test_switcher_sets_the_language_over_accept_language(approver_client):
    page = approver_client.get(reverse("inbox"), HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert 'action="/i18n/setlang/"' in page and 'name="language" value="zh-hans"' in page
    response = approver_client.post("/i18n/setlang/", {"language": "zh-hans", "next": reverse("run-list")})
    assert response.status_code == 302 and response["Location"] == reverse("run-list")
    assert "<h1>运行记录</h1>" in approver_client.get(reverse("run-list"), HTTP_ACCEPT_LANGUAGE="en").content.decode()
    approver_client.post("/i18n/setlang/", {"language": "en", "next": reverse("run-list")})
    assert "<h1>Runs</h1>" in approver_client.get(reverse("run-list"), HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()


@pytest.mark.django_db(transaction=True)
def test_switcher_refuses_a_foreign_next_url(approver_client):
    response = approver_client.post("/i18n/setlang/", {"language": "zh-hans", "next": "https://evil.example/"})
    assert response.status_code == 302 and not response["Location"].startswith("https://evil")


@pytest.mark.django_db(transaction=True)
def test_api_answers_in_english_whatever_the_client_asks(client, people):
    response = client.get("/api/runs/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert response.status_code in (401, 403)
    assert response.json()["error"]["message"] == "Authentication credentials were not provided."
    assert response["Content-Language"] == "en"
    client.force_login(people["requester"])
    response = client.post("/api/runs/", {}, content_type="application/json", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert response.status_code == 400
    assert "This field is required." in str(response.json())


# --- Time zone --------------------------------------------------------------

@pytest.fixture
def waiting_run(people, idle_worker):
    """A queued run of the requester (no worker needed: only its timestamps are shown)."""
    return start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme")


def _created_shown(client, run, zone_cookie=None) -> tuple[str, str]:
    if zone_cookie is not None:
        client.cookies["tollgate_tz"] = zone_cookie
    body = client.get(reverse("run-detail", args=[run.pk])).content.decode()
    shown = re.search(r'<time id="run-created" datetime="[^"]*">([^<]*)</time>', body).group(1)
    zone = re.search(r'<span id="time-zone" data-time-zone="([^"]*)"', body).group(1)
    return shown, zone


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("cookie, zone", [
    ("Asia/Kolkata", "Asia/Kolkata"),
    ("America/St_Johns", "America/St_Johns"),
    (None, "UTC"),
    ("Mars/Olympus_Mons", "UTC"),
    ("../../../../etc/localtime", "UTC"),
    ("/usr/share/zoneinfo/Asia/Tokyo", "UTC"),
    ("x" * 5000, "UTC"),
])
def test_times_are_shown_in_the_browsers_zone_and_labelled(client, people, waiting_run, cookie, zone):
    client.force_login(people["requester"])
    shown, label = _created_shown(client, waiting_run, cookie)
    expected = waiting_run.created_at.astimezone(ZoneInfo(zone) if zone != "UTC" else dt_timezone.utc)
    assert (shown, label) == (expected.strftime("%Y-%m-%d %H:%M:%S"), zone)


# --- The catalogue ----------------------------------------------------------

def test_catalogue_is_complete_and_current(tmp_path):
    """``makemessages`` on a copy of the sources finds exactly the messages the .po holds, all translated."""
    gettext_tool("xgettext")
    msgcmp = gettext_tool("msgcmp")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tmp_path / name)
    subprocess.run([sys.executable, "manage.py", "makemessages", "-l", "zh_Hans", "--keep-pot", "--no-obsolete"],
                   cwd=tmp_path, check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "true"})
    pot = tmp_path / "config" / "locale" / "django.pot"
    # Every message the sources use is translated (not fuzzy, not empty) ...
    missing = subprocess.run([msgcmp, str(PO), str(pot)], capture_output=True, text=True)
    assert missing.returncode == 0, "run makemessages and translate:\n" + missing.stderr
    # ... and the .po holds no message the sources no longer use.
    stale = subprocess.run([msgcmp, "--use-untranslated", str(pot), str(PO)], capture_output=True, text=True)
    assert stale.returncode == 0, "run makemessages --no-obsolete:\n" + stale.stderr
