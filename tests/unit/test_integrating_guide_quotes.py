"""docs/integrating.md quotes its example app (``examples/bookings``) line for line, so the guide cannot go stale.

Every code block of the guide marked as coming from a file (```` ```python file=PATH ````)
is that file's code, and every module of the app is shown. Running the app
as the guide describes is tests/api/test_integrating_guide.py.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "integrating.md"
# A fenced block quoting a file: ```python file=examples/bookings/tools.py
FROM_FILE = re.compile(r"^```\w* file=(\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def quoted_blocks() -> list[tuple[str, str]]:
    """``(path, code)`` of every block of the guide marked as coming from a file."""
    return FROM_FILE.findall(GUIDE.read_text())


def test_every_code_block_of_the_guide_marked_with_a_file_is_that_files_code():
    blocks = quoted_blocks()
    assert len(blocks) >= 5, "the guide quotes the example app"
    for path, code in blocks:
        source = ROOT / path
        assert source.is_file(), f"the guide quotes {path}, which does not exist"
        assert ("\n" + source.read_text()).find("\n" + code) >= 0, (
            f"a block of docs/integrating.md marked file={path} is not in that file (copy it again):\n{code}")
    quoted = {path for path, _ in blocks}
    app = {str(path.relative_to(ROOT)) for path in (ROOT / "examples" / "bookings").glob("*.py")}
    assert app - {"examples/bookings/__init__.py"} <= quoted, "every module of the example app is shown"
