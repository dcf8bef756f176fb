"""Languages and time zones of the pages (README "Languages and time zones").

Through Django's test client: the page language follows Accept-Language and
the switcher's cookie, the API stays English, times follow the browser's
zone cookie. Without a browser or server: the translation catalogue is
complete and current (GNU gettext's own tools: ``xgettext`` through
``makemessages``, ``msgcmp``, ``msgfmt``; tests/run.sh installs them), the
committed ``.mo`` matches its ``.po``, and no template text is left
unmarked. Real-browser checks are in tests/browser/test_i18n.py.
"""

import gettext
import html
import re
import shutil
import subprocess
import sys
from datetime import timezone as dt_timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.template.base import Lexer, TokenType
from django.urls import reverse

from approvals.models import Decision, InterruptKind, InterruptStatus
from runs.base.labels import LABELS
from runs.models import Agent, DeathBlame, FailureType, Outcome, Phase, RunStatus, WaitingReason
from runs.engine.lifecycle import start_run
from tools.models import ToolCallStatus

ROOT = Path(__file__).resolve().parents[2]
LOCALE = ROOT / "config" / "locale"
PO = LOCALE / "zh_Hans" / "LC_MESSAGES" / "django.po"
MO = PO.with_suffix(".mo")
# What makemessages reads (README "Languages and time zones").
SOURCES = ["manage.py", "config", "runs", "approvals", "tools", "templates"]


# --- Page words for machine values ------------------------------------------

def test_every_value_shown_on_pages_has_a_label():
    enumerations = [RunStatus, Phase, WaitingReason, FailureType, Outcome, DeathBlame, InterruptKind, InterruptStatus,
                    Decision, ToolCallStatus]
    values = {value for enumeration in enumerations for value in enumeration.values}
    values |= {"user", "assistant", "tool", "system"}  # Message.role
    assert sorted(values - set(LABELS)) == []


# --- Language of pages and API ----------------------------------------------

@pytest.fixture
def approver_client(client, demo):
    client.force_login(demo["approver"])
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
def test_error_pages_and_admin_actions_are_translated(client, demo, waiting_run):
    client.force_login(demo["admin"])
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
def test_api_answers_in_english_whatever_the_client_asks(client, demo):
    response = client.get("/api/runs/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert response.status_code in (401, 403)
    assert response.json()["error"]["message"] == "Authentication credentials were not provided."
    assert response["Content-Language"] == "en"
    client.force_login(demo["requester"])
    response = client.post("/api/runs/", {}, content_type="application/json", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert response.status_code == 400
    assert "This field is required." in str(response.json())


# --- Time zone --------------------------------------------------------------

@pytest.fixture
def waiting_run(demo, idle_worker):
    """A queued run of the requester (no worker needed: only its timestamps are shown)."""
    return start_run(agent=Agent.objects.get(slug="refund-order"), user=demo["requester"], input="Refund 80 on 123")


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
def test_times_are_shown_in_the_browsers_zone_and_labelled(client, demo, waiting_run, cookie, zone):
    client.force_login(demo["requester"])
    shown, label = _created_shown(client, waiting_run, cookie)
    expected = waiting_run.created_at.astimezone(ZoneInfo(zone) if zone != "UTC" else dt_timezone.utc)
    assert (shown, label) == (expected.strftime("%Y-%m-%d %H:%M:%S"), zone)


# --- The catalogue ----------------------------------------------------------

def _gettext_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"GNU gettext's {name} is missing: install Debian's gettext package (tests/run.sh does)")
    return path


def test_catalogue_is_complete_and_current(tmp_path):
    """``makemessages`` on a copy of the sources finds exactly the messages the .po holds, all translated."""
    _gettext_tool("xgettext")
    msgcmp = _gettext_tool("msgcmp")
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


def test_committed_mo_is_the_compiled_po(tmp_path):
    """The .mo in the repository (read on machines without gettext) says what the .po says."""
    fresh = tmp_path / "django.mo"
    subprocess.run([_gettext_tool("msgfmt"), "--check", "-o", str(fresh), str(PO)], check=True)
    with open(MO, "rb") as committed, open(fresh, "rb") as compiled:
        committed_catalog = gettext.GNUTranslations(committed)._catalog
        compiled_catalog = gettext.GNUTranslations(compiled)._catalog
    assert committed_catalog == compiled_catalog, "run manage.py compilemessages and commit the .mo"
    assert len(compiled_catalog) > 150


# --- Templates --------------------------------------------------------------

# Words that stay as they are in every language.
UNTRANSLATED = {"Tollgate"}
# Blocks whose content is no text (base.html puts body_class in an attribute).
NOT_TEXT_BLOCKS = {"body_class"}
HIDDEN = "\x00"  # stands for a template tag or variable, or text inside {% blocktranslate %}
TAG = re.compile(r"<(script|style)\b.*?</\1>|<!--.*?-->|<[^>]*>", re.S)
VISIBLE_ATTRIBUTE = re.compile(r'\s(?:title|placeholder|alt|aria-label|data-confirm|data-title-[\w-]+)="([^"]*)"')
LETTER = re.compile(r"[^\W\d_]")


def unmarked_text(source: str) -> list[str]:
    """Words of a template a user would read that are not inside ``{% translate %}``/``{% blocktranslate %}``.

    Tags and variables count as marked (they render values, or translate);
    visible text is what is left outside HTML tags, plus the values of
    attributes browsers show (``title``, ``placeholder``, ...).
    """
    parts, hidden_depth, blocks = [], 0, []
    for token in Lexer(source).tokenize():
        if token.token_type == TokenType.BLOCK:
            name, *args = token.contents.split()
            hidden_depth += name in ("blocktranslate", "blocktrans")
            hidden_depth -= name in ("endblocktranslate", "endblocktrans")
            if name == "block":
                blocks.append(args[0] in NOT_TEXT_BLOCKS)
                hidden_depth += blocks[-1]
            elif name == "endblock":
                hidden_depth -= blocks.pop()
        parts.append(token.contents if token.token_type == TokenType.TEXT and not hidden_depth else HIDDEN)
    text = "".join(parts)
    words = [value for value in VISIBLE_ATTRIBUTE.findall(text) if LETTER.search(value.replace(HIDDEN, ""))]
    visible = html.unescape(TAG.sub(" ", text)).replace(HIDDEN, " ")
    return words + [word for word in visible.split() if LETTER.search(word) and word not in UNTRANSLATED]


def test_unmarked_text_finder_finds_text_and_attributes():
    assert unmarked_text('<p title="Hello">{% translate "Marked" %} Plain</p>') == ["Hello", "Plain"]
    assert unmarked_text('{% blocktranslate %}Marked {{ x }}{% endblocktranslate %}<a title="{% translate "y" %}">'
                         "{{ value }}</a> → # {% block body_class %}narrow{% endblock %}") == []
    assert unmarked_text("{% block title %}Inbox{% endblock %}<!-- a note --><script>var a;</script>") == ["Inbox"]


@pytest.mark.parametrize("template", sorted((ROOT / "templates").rglob("*.html")), ids=lambda p: p.name)
def test_every_template_text_is_marked_for_translation(template):
    assert unmarked_text(template.read_text()) == []
