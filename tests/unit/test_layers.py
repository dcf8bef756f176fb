"""One dependency direction: no module imports a layer above its own (docs/design.md#dependency-direction).

A module's layer is where it is put: the first of ``RULES`` its path
matches. Layers, top to bottom:

5. surfaces and plug-ins: the ``api/``, ``web/`` and ``admin/`` folders
   (``runs/api/``, ``runs/web/``, ``runs/admin/``, ``approvals/api/``,
   ``approvals/web/``), Django's fixed places (``admin.py``, ``apps.py``,
   ``management/``, ``templatetags/``), each app's ``selectors.py`` (the
   reads the API and the pages share), ``config/``, the operations app
   ``runs/ops/`` (probes, metrics, the heartbeat's admin), the demo shop
   (``tools/demo/``, an app of its own), the example plug-in of
   docs/integrating.md (``examples/bookings/``), the webhooks app
   (``runs/webhooks/``: it reads the event log; nothing below imports it),
   the HTTP tools (``tools/http.py``: tools registered like a plug-in's,
   calling out through the webhooks' signing and address guard), the MCP
   servers' tools (``tools/mcp/``: a source of tools registered like a
   plug-in's, connecting through the webhooks' address guard), and any
   module no rule names;
4. the engine: ``runs/engine/`` (loop, lifecycle, recovery, actors, ...) and
   ``runs/providers/``;
3. the approvals services: the modules at the top of ``approvals/``
   (models, services, bulk, claims, notifications, answer files, the
   ``input`` kind of wait);
2. the tools services: the modules at the top of ``tools/`` (registry,
   policy, builtin), ``tools/models/``, ``tools/services/``, ``tools/waits/``
   (waits and their kinds);
1. the runs kernel: the modules at the top of ``runs/`` (models, services,
   transitions, tx, lease, wakeups, live, access, serving, ...),
   and ``runs/ops/models.py`` (the heartbeat's row, which the engine's
   heartbeat writes);
0. the shared base: ``runs/base/`` (state machines, errors, labels,
   failpoints, model output checks, the model-call shapes, masking, the
   broker and channel layer, awaiting, log context, the OpenTelemetry spans
   and the process's Prometheus metrics, the hot path's row writes) and
   ``config/strict_json.py``.

Every ``import`` counts, including those inside functions: an import
placed in a function to dodge a cycle is still an upward import, and
no chain of imports, at any depth, comes back to where it started.

A plug-in (``PLUGINS``) is more than a surface: nothing outside it imports
it at all, so taking it out of ``INSTALLED_APPS`` leaves a working product
(the settings name it in ``INSTALLED_APPS``, a string, not an import). Run
``python -m pytest tests/unit/test_layers.py`` to check after moving code.
"""

import ast
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "runs", "approvals", "tools", "examples")
SURFACE, ENGINE, APPROVALS, TOOLS, KERNEL, BASE = 5, 4, 3, 2, 1, 0
NAMES = {5: "surfaces", 4: "engine", 3: "approvals services", 2: "tools services", 1: "runs kernel", 0: "base"}

# (path pattern, layer): the first rule a module's path (from the repository root, "/" between
# parts, a package as its __init__.py) matches gives its layer; none matches: a surface.
# "*" stands for one folder or file name, "**" for any number of folders (none included).
RULES = (
    # Single files whose folder says otherwise.
    ("runs/ops/models.py", KERNEL),  # the heartbeat's row: the engine's heartbeat writes it
    ("config/strict_json.py", BASE),  # the JSON rules; the DRF parser and form field are config's own
    ("tools/http.py", SURFACE),  # HTTP tools, registered like a plug-in's, call out through the webhooks' guard
    ("tools/mcp/**", SURFACE),  # MCP servers' tools, a source registered like a plug-in's, connect through it too
    # Surfaces: their folders, Django's fixed places, app wiring and the reads the surfaces share.
    ("**/api/**", SURFACE), ("**/web/**", SURFACE), ("**/admin/**", SURFACE),
    ("**/management/**", SURFACE), ("**/templatetags/**", SURFACE),
    ("**/api.py", SURFACE), ("**/admin.py", SURFACE), ("**/apps.py", SURFACE), ("*/selectors.py", SURFACE),
    # Below the surfaces, by folder.
    ("runs/base/**", BASE),
    ("runs/engine/**", ENGINE), ("runs/providers/**", ENGINE),
    ("approvals/*.py", APPROVALS),
    ("tools/*.py", TOOLS), ("tools/models/**", TOOLS), ("tools/services/**", TOOLS), ("tools/waits/**", TOOLS),
    ("runs/*.py", KERNEL),
)
# Installed apps the product must run without; only their own modules may import them.
PLUGINS = ("tools.demo", "examples.bookings")


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """Whether path ``parts`` match glob ``pattern`` parts ("*" one name, "**" any number of folders)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[start:], pattern[1:]) for start in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], pattern[0]) and _matches(parts[1:], pattern[1:])


def path_of(module: str) -> str:
    """The file of dotted ``module``, from the repository root: ``runs/base/fsm.py``, ``runs/api/__init__.py``."""
    path = Path(*module.split("."))
    return (path / "__init__.py" if (ROOT / path).is_dir() else path.with_suffix(".py")).as_posix()


def layer_of(module: str) -> int | None:
    """The layer of a project module (dotted name) by the first rule its path matches, or None outside the project."""
    if module.split(".")[0] not in PACKAGES or module in PACKAGES:  # the packages' own __init__ hold nothing
        return None
    parts = tuple(path_of(module).split("/"))
    return next((layer for pattern, layer in RULES if _matches(parts, tuple(pattern.split("/")))), SURFACE)


def _is_module(dotted: str) -> bool:
    path = ROOT / Path(*dotted.split("."))
    return path.with_suffix(".py").exists() or path.is_dir()


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """``(line, dotted module)`` for every import in ``source`` (of module ``module``), at any depth.

    ``from runs import lease`` counts as importing ``runs.lease``.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package (itself, for an __init__)
                package = module.split(".") if (ROOT / Path(*module.split("."))).is_dir() else module.split(".")[:-1]
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append((node.lineno, submodule if _is_module(submodule) else target))
    return found


def upward_imports(source: str, module: str) -> list[str]:
    """Violations of the dependency direction in ``source``: ``"module:line imports target (layer -> layer)"``."""
    own = layer_of(module)
    problems = []
    for line, target in imported_modules(source, module):
        theirs = layer_of(target)
        if theirs is not None and own is not None and theirs > own:
            problems.append(f"{module}:{line} imports {target} ({NAMES[own]} -> {NAMES[theirs]})")
    return problems


def plugin_imports(source: str, module: str) -> list[str]:
    """Imports of a plug-in in ``source`` (of ``module``, outside that plug-in): ``"module:line imports target"``."""
    def within(name: str, plugin: str) -> bool:
        return name == plugin or name.startswith(plugin + ".")

    return [f"{module}:{line} imports {target}"
            for line, target in imported_modules(source, module)
            for plugin in PLUGINS if within(target, plugin) and not within(module, plugin)]


def project_modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            yield dotted.removesuffix(".__init__"), path


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> modules it imports): each a sorted list of the modules
    that reach one another, two or more (Tarjan's strongly connected components, iterative)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    if len(component) > 1:
                        cycles.append(sorted(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(graph.get(target, ())))))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
    return sorted(cycles)


def import_graph() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports, at any depth (function-level imports too)."""
    modules = dict(project_modules())
    return {module: {target for _, target in imported_modules(path.read_text(), module)
                     if target in modules and target != module}
            for module, path in modules.items()}


def test_no_module_imports_a_layer_above_its_own():
    problems = [problem for module, path in project_modules()
                for problem in upward_imports(path.read_text(), module)]
    assert problems == []


def test_no_import_cycles():
    assert import_cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle_at_any_length():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_nothing_outside_a_plug_in_imports_it():
    problems = [problem for module, path in project_modules()
                for problem in plugin_imports(path.read_text(), module)]
    assert problems == []


def test_the_plug_in_check_catches_any_import_of_it_and_allows_its_own():
    hidden = "def ready():\n    from tools.demo.models import Order\n    return Order\n"
    assert plugin_imports(hidden, "runs.web.views") == ["runs.web.views:2 imports tools.demo.models"]
    assert plugin_imports("from tools import demo\n", "config.urls") == ["config.urls:1 imports tools.demo"]
    assert plugin_imports("import tools.demo.gateway\n", "tools.services") == [
        "tools.services:1 imports tools.demo.gateway"]
    assert plugin_imports("from tools.demo import gateway\nfrom tools.registry import Tool\n", "tools.demo.tools") == []
    assert plugin_imports("from tools import registry\n", "runs.engine.loop") == []


def test_the_check_catches_an_upward_import_even_inside_a_function():
    hidden = "def helper():\n    from runs.engine.lifecycle import end_run\n    return end_run\n"
    assert upward_imports(hidden, "tools.services") == [
        "tools.services:2 imports runs.engine.lifecycle (tools services -> engine)"]
    assert upward_imports("from runs.engine import completion\n", "runs.models") == [
        "runs.models:1 imports runs.engine.completion (runs kernel -> engine)"]
    assert upward_imports("from runs.web import views\n", "approvals.services") == [
        "approvals.services:1 imports runs.web.views (approvals services -> surfaces)"]
    assert upward_imports("from runs import selectors\n", "runs.base.labels") == [
        "runs.base.labels:1 imports runs.selectors (base -> surfaces)"]
    assert upward_imports("from .. import models\n", "runs.base.errors") == [
        "runs.base.errors:1 imports runs.models (base -> runs kernel)"]
    assert upward_imports("from .forms import AgentForm\n", "runs.admin") == []  # runs/admin/__init__.py


def test_downward_and_outside_imports_are_fine():
    source = "import json\nfrom django.db import models\nfrom runs.models import Run\nfrom runs.base.fsm import FSMModel\n"
    assert upward_imports(source, "tools.services") == []


def test_a_new_module_gets_its_layer_from_where_it_is_put():
    assert {name: layer_of(name) for name in (
        "runs.api.new", "runs.web.new", "runs.admin.new", "approvals.api.new", "approvals.web.new",
        "tools.management.commands.new", "runs.webhooks.new", "config.new", "runs.new.deeper",
        "runs.engine.new", "runs.providers.new", "approvals.new", "tools.new", "tools.services.new",
        "runs.new", "runs.base.new", "json", "runs")} == {
        "runs.api.new": SURFACE, "runs.web.new": SURFACE, "runs.admin.new": SURFACE,
        "approvals.api.new": SURFACE, "approvals.web.new": SURFACE, "tools.management.commands.new": SURFACE,
        "runs.webhooks.new": SURFACE, "config.new": SURFACE, "runs.new.deeper": SURFACE,
        "runs.engine.new": ENGINE, "runs.providers.new": ENGINE, "approvals.new": APPROVALS,
        "tools.new": TOOLS, "tools.services.new": TOOLS, "runs.new": KERNEL, "runs.base.new": BASE,
        "json": None, "runs": None}


def test_every_rule_places_a_module_that_exists():
    """No rule is stale: each is the first match of at least one module today."""
    firsts = set()
    for module, _ in project_modules():
        parts = tuple(path_of(module).split("/"))
        firsts.add(next((pattern for pattern, _ in RULES if _matches(parts, tuple(pattern.split("/")))), None))
    assert [pattern for pattern, _ in RULES if pattern not in firsts] == []


def test_services_raise_only_the_error_family_on_purpose():
    """A module that means "bad input" or "not allowed" says so with ``runs.base.errors``; a bare ValueError is a bug.

    Every module of runs/, tools/ and approvals/ is read. Django's or DRF's
    ``ValidationError`` belongs in forms, serializers and the API (an
    ``api/`` folder or an ``api.py``: its query parameters); a refusal is
    ``runs.base.errors.Forbidden``, never a bare ``PermissionDenied``.
    """
    validation_modules = ("forms.py", "serializers.py", "api.py")
    offenders = []
    for package in ("runs", "tools", "approvals"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            relative = path.relative_to(ROOT)
            validates = path.name in validation_modules or "api" in relative.parts[:-1]
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
                    if name in ("ValueError", "PermissionDenied") or (name == "ValidationError" and not validates):
                        offenders.append(f"{relative}:{node.lineno} raises {name}")
    assert offenders == []
