"""No template text is left unmarked for translation (README "Languages and time zones").

Every word of a template a user would read is inside ``{% translate %}`` or
``{% blocktranslate %}``, attributes browsers show included. The catalogue
itself is checked by tests/unit/test_compiled_catalogue.py and
tests/web/test_i18n.py.
"""

import html
import re

import pytest
from django.template.base import Lexer, TokenType

from tests.support.i18n import ROOT

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
