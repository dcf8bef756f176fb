"""Where the translation catalogue lives, and GNU gettext's tools, for the catalogue checks.

Used by tests/web/test_i18n.py (the catalogue is complete and current) and
tests/unit/test_compiled_catalogue.py (the committed ``.mo`` is the compiled ``.po``).
"""

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCALE = ROOT / "config" / "locale"
PO = LOCALE / "zh_Hans" / "LC_MESSAGES" / "django.po"
MO = PO.with_suffix(".mo")


def gettext_tool(name: str) -> str:
    """The path of GNU gettext's program ``name`` (``msgfmt``, ``msgcmp``, ...); fails the test when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"GNU gettext's {name} is missing: install Debian's gettext package (tests/run.sh does)")
    return path
