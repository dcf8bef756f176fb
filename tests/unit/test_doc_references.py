"""Every dotted name in a docstring and every ``docs/*.md#anchor`` still points at something.

**Dotted references.** A reference is a double-backtick span in a
docstring (of a module, class or function; comments and single backticks
do not count) under ``PACKAGES`` plus ``bench/``, whose text starts with one
of the project's top-level packages, a dot and a name: ``runs.engine.loop``,
``tools.registry.Tool.location``, ``runs.sweeping.register_sweep_job(name, fn)``.
The reference is that longest dotted name (what follows it, such as call
arguments, is not checked). It resolves when

1. a prefix of it imports as a module and each remaining name is an
   attribute of what came before (a dataclass field counts), or
2. it names an installed model as Django does, ``app_label.Model``, possibly
   followed by attributes (``runs.Run``, ``runs.Run.status``), or
3. it names a permission as Django does, ``app_label.codename``, and that
   app's models declare it (default ``add_``/``change_``/``delete_``/``view_``
   permissions included: ``runs.add_agent``, ``approvals.decide_interrupt``).

**Anchors.** A reference ``NAME.md#anchor`` (``docs/design.md#waits``, or
``design.md#waits`` relative to the file that says it) anywhere in code,
templates or docs (this module's own examples aside), and ``](#anchor)``
inside a Markdown file, must match a
heading of that Markdown file, slugged as GitHub does (``heading_slugs``).
"""

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "runs", "approvals", "tools", "examples", "tests")
SCANNED = (*PACKAGES, "bench")
DOCS = ROOT / "docs"

SPAN = re.compile(r"``([^`]+)``")
DOTTED = re.compile(r"(?:%s)(?:\.[A-Za-z_]\w*)+" % "|".join(PACKAGES))
FILE_ANCHOR = re.compile(r"((?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)")
OWN_ANCHOR = re.compile(r"\]\(#([\w-]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def docstring_references(source: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every dotted reference in the docstrings of ``source`` (see the module doc)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            for span in SPAN.findall(docstring or ""):
                match = DOTTED.match(span)
                if match:
                    found.append((node.body[0].lineno, match.group(0)))
    return found


def _attributes_resolve(target, names: list[str]) -> bool:
    for name in names:
        if hasattr(target, name):
            target = getattr(target, name)
        elif name in getattr(target, "__dataclass_fields__", {}):
            return names[-1] == name  # a field without a default: nothing to look into further
        else:
            return False
    return True


@functools.cache
def _permission_names() -> frozenset[str]:
    names = set()
    for model in apps.get_models():
        meta = model._meta
        names.update(f"{meta.app_label}.{action}_{meta.model_name}" for action in meta.default_permissions)
        names.update(f"{meta.app_label}.{codename}" for codename, _ in meta.permissions)
    return frozenset(names)


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module or attribute, a model (``app_label.Model``) or a permission."""
    parts = dotted.split(".")
    for length in range(len(parts), 0, -1):
        module_name = ".".join(parts[:length])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and not module_name.startswith(error.name):
                raise  # the module exists but imports something missing: a real error, not a bad reference
            continue
        if _attributes_resolve(module, parts[length:]):
            return True
        break
    if len(parts) >= 2:
        try:
            model = apps.get_model(parts[0], parts[1])
        except LookupError:
            model = None
        if model is not None and _attributes_resolve(model, parts[2:]):
            return True
    return len(parts) == 2 and dotted in _permission_names()


def broken_docstring_references(source: str, where: str) -> list[str]:
    """``"where:line: name"`` for each dotted reference of ``source``'s docstrings that does not resolve."""
    return [f"{where}:{line}: {name}" for line, name in docstring_references(source) if not resolves(name)]


def heading_slugs(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown`` (fenced code skipped).

    Lower case; every character but letters, digits, ``_``, ``-`` and
    spaces dropped; spaces become ``-``; a repeated slug gets ``-1``,
    ``-2``, ... ("## Not built yet / differs" -> ``not-built-yet--differs``).
    """
    slugs, counts, fenced = set(), {}, False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = None if fenced else HEADING.match(line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            slugs.add(slug if slug not in counts else f"{slug}-{counts[slug]}")
            counts[slug] = counts.get(slug, 0) + 1
    return slugs


def _markdown_file(reference: str, said_in: Path) -> Path:
    for candidate in (ROOT / reference, said_in.parent / reference, DOCS / reference):
        if candidate.is_file():
            return candidate
    return ROOT / reference


def broken_anchors(text: str, said_in: Path) -> list[str]:
    """``"file: target#anchor"`` for each anchor reference in ``text`` (of file ``said_in``) that matches no heading."""
    wanted = [(_markdown_file(target, said_in), anchor) for target, anchor in FILE_ANCHOR.findall(text)]
    if said_in.suffix == ".md":
        wanted += [(said_in, anchor) for anchor in OWN_ANCHOR.findall(text)]
    where = said_in.relative_to(ROOT) if said_in.is_relative_to(ROOT) else said_in
    problems = []
    for markdown, anchor in wanted:
        if not markdown.is_file() or anchor not in heading_slugs(markdown.read_text()):
            shown = markdown.relative_to(ROOT) if markdown.is_relative_to(ROOT) else markdown
            problems.append(f"{where}: {shown}#{anchor}")
    return problems


def _python_files():
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def _text_files():
    """Code, docs and templates; not this module, whose examples of broken anchors are on purpose."""
    yield from (path for path in _python_files() if path != Path(__file__).resolve())
    yield from sorted(ROOT.glob("*.md"))
    yield from sorted(DOCS.rglob("*.md"))
    yield from sorted((ROOT / "templates").rglob("*.html"))


def test_every_dotted_name_in_a_docstring_resolves():
    checked = 0
    problems = []
    for path in _python_files():
        source = path.read_text()
        checked += len(docstring_references(source))
        problems += broken_docstring_references(source, str(path.relative_to(ROOT)))
    assert problems == []
    assert checked > 400  # the scan did find the references (about 500 today)


def test_every_docs_anchor_matches_a_heading():
    problems = [problem for path in _text_files() for problem in broken_anchors(path.read_text(), path)]
    assert problems == []


def test_the_checker_catches_a_broken_dotted_name_and_passes_good_ones():
    source = '''"""Module: see ``runs.engine.loop.no_such_function`` and ``runs.nowhere``."""


def helper():
    """Calls ``runs.sweeping.register_sweep_job(name, fn)`` on ``runs.Run.status`` with ``runs.add_agent``.

    Not references: ``TOLLGATE["SWEEP_BATCH"]``, ``runs 0012``, ``Run.objects``. Broken: ``runs.Nope``.
    """


class Shape:
    """Field ``tools.registry.Tool.location`` is fine; ``tools.registry.Tool.locatoin`` is not."""
'''
    assert broken_docstring_references(source, "made_up.py") == [
        "made_up.py:1: runs.engine.loop.no_such_function",
        "made_up.py:1: runs.nowhere",
        "made_up.py:5: runs.Nope",
        "made_up.py:12: tools.registry.Tool.locatoin",
    ]


def test_the_checker_catches_an_anchor_that_matches_no_heading(tmp_path):
    doc = tmp_path / "guide.md"
    doc.write_text("# Guide\n\n## Not built yet / differs\n\n```\n# not a heading\n```\n\n## Steps\n\n## Steps\n\n"
                   "See [below](#steps-1), [there](#not-a-heading) and [gone](#no-such-part).\n")
    assert heading_slugs(doc.read_text()) == {"guide", "not-built-yet--differs", "steps", "steps-1"}
    assert broken_anchors(doc.read_text(), doc) == [f"{doc}: {doc}#not-a-heading", f"{doc}: {doc}#no-such-part"]
    code = "# see docs/design.md#waits and docs/design.md#how-a-run-ends\n"
    assert broken_anchors(code, ROOT / "runs" / "made_up.py") == ["runs/made_up.py: docs/design.md#how-a-run-ends"]


@pytest.mark.parametrize("heading, slug", [
    ("## 10. What goes wrong, and what you see", "10-what-goes-wrong-and-what-you-see"),
    ("### Inbox workflow: history, bulk, claims", "inbox-workflow-history-bulk-claims"),
    ("## 2. The app: register in `ready()`", "2-the-app-register-in-ready"),
])
def test_headings_are_slugged_as_github_does(heading, slug):
    assert heading_slugs(heading) == {slug}
