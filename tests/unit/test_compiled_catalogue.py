"""The committed ``.mo`` says what its ``.po`` says (GNU gettext's ``msgfmt``; tests/run.sh installs it).

That the ``.po`` is complete and current (``makemessages`` on a copy of the
sources, seconds) is tests/web/test_i18n.py.
"""

import gettext
import subprocess

from tests.support.i18n import MO, PO, gettext_tool


def test_committed_mo_is_the_compiled_po(tmp_path):
    """The .mo in the repository (read on machines without gettext) says what the .po says."""
    fresh = tmp_path / "django.mo"
    subprocess.run([gettext_tool("msgfmt"), "--check", "-o", str(fresh), str(PO)], check=True)
    with open(MO, "rb") as committed, open(fresh, "rb") as compiled:
        committed_catalog = gettext.GNUTranslations(committed)._catalog
        compiled_catalog = gettext.GNUTranslations(compiled)._catalog
    assert committed_catalog == compiled_catalog, "run manage.py compilemessages and commit the .mo"
    assert len(compiled_catalog) > 150
