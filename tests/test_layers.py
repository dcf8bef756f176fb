"""One dependency direction: no module imports a layer above its own (docs/design.md#dependency-direction).

Layers, top to bottom:

5. surfaces and plug-ins: API, pages, admin, consumers, commands, config,
   the demo shop (``tools.demo``, an app of its own), the example plug-in
   of docs/integrating.md (``examples.bookings``), the webhooks app
   (``runs.webhooks``: it reads the event log; nothing below imports it),
   the HTTP tools (``tools.http``: tools registered like a plug-in's, calling
   out through the webhooks' signing and address guard);
4. the engine: ``runs.engine`` (loop, lifecycle, recovery, actors, ...) and
   ``runs.providers``;
3. the approvals services: ``approvals.models``, ``approvals.services``,
   ``approvals.waits`` (the ``input`` kind of wait);
2. the tools services: ``tools.models``, ``tools.registry``, ``tools.builtin``,
   ``tools.waits`` (waits and their kinds),
   ``tools.policy``, ``tools.services``, ``tools.mcp`` (but its admin and its
   start-up checks, which use the webhooks' URL rules: surfaces);
1. the runs kernel: ``runs.models``, ``runs.services``, ``runs.transitions``,
   ``runs.tx`` (one transaction on one run), ``runs.lease``, ``runs.wakeups``,
   ``runs.live``, ``runs.access`` (who sees and decides what);
0. the shared base: ``runs.fsm``, ``runs.failpoints``, ``runs.model_output``,
   ``runs.channel_layers``, ``runs.brokers``, ``runs.providers.base`` (the model-call
   shapes and errors), ``config.strict_json``, ``runs.labels`` (the words
   pages and choices show for machine values), ``runs.awaiting`` (what a
   step waits for outside the database, and how it is awaited),
   ``runs.log_context`` (the ids of the run a log line is about),
   ``runs.tracing`` (the OpenTelemetry spans of a run).

The operations app ``runs.ops`` (probes, metrics, the heartbeat's admin)
is a surface; its model ``runs.ops.models`` sits in the runs kernel, so
the engine's heartbeat (``runs.engine.heartbeat``) may write it.

Every ``import`` counts, including those inside functions: an import
placed in a function to dodge a cycle is still an upward import.

A plug-in (``PLUGINS``) is more than a surface: nothing outside it imports
it at all, so taking it out of ``INSTALLED_APPS`` leaves a working product
(the settings name it in ``INSTALLED_APPS``, a string, not an import). Run
``python -m pytest tests/test_layers.py`` to check after moving code.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "runs", "approvals", "tools", "examples")

# Longest matching prefix wins; anything in PACKAGES not listed is a surface (5).
LAYERS = {
    "tools.demo": 5,
    "runs.webhooks": 5,
    "tools.http": 5,
    "runs.engine": 4,
    "runs.providers": 4,
    "approvals.models": 3,
    "approvals.services": 3,
    "approvals.waits": 3,
    "approvals.notifications": 3,
    "approvals.claims": 3,
    "approvals.bulk": 3,
    "approvals.answer_files": 3,
    "approvals.answer_file_cleanup": 3,
    "tools.mcp.admin": 5,
    "tools.mcp.startup": 5,
    "tools.mcp": 2,
    "tools.models": 2,
    "tools.registry": 2,
    "tools.policy": 2,
    "tools.services": 2,
    "tools.builtin": 2,
    "tools.waits": 2,
    "runs.models": 1,
    "runs.services": 1,
    "runs.transitions": 1,
    "runs.tx": 1,
    "runs.lease": 1,
    "runs.wakeups": 1,
    "runs.live": 1,
    "runs.access": 1,
    "runs.ops.models": 1,
    "runs.fsm": 0,
    "runs.failpoints": 0,
    "runs.model_output": 0,
    "runs.channel_layers": 0,
    "runs.brokers": 0,
    "runs.providers.base": 0,
    "config.strict_json": 0,
    "runs.masking": 0,
    "runs.errors": 0,
    "runs.labels": 0,
    "runs.awaiting": 0,
    "runs.log_context": 0,
    "runs.tracing": 0,
}
SURFACE = 5
# Installed apps the product must run without; only their own modules may import them.
PLUGINS = ("tools.demo", "examples.bookings")
NAMES = {5: "surfaces", 4: "engine", 3: "approvals services", 2: "tools services", 1: "runs kernel", 0: "base"}


def layer_of(module: str) -> int | None:
    """The layer of a project module (dotted name), or None for anything outside the project."""
    if module.split(".")[0] not in PACKAGES or module in PACKAGES:  # the packages' own __init__ hold nothing
        return None
    matches = [prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")]
    return LAYERS[max(matches, key=len)] if matches else SURFACE


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
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")[: -node.level]
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


def test_no_module_imports_a_layer_above_its_own():
    problems = [problem for module, path in project_modules()
                for problem in upward_imports(path.read_text(), module)]
    assert problems == []


def test_nothing_outside_a_plug_in_imports_it():
    problems = [problem for module, path in project_modules()
                for problem in plugin_imports(path.read_text(), module)]
    assert problems == []


def test_the_plug_in_check_catches_any_import_of_it_and_allows_its_own():
    hidden = "def ready():\n    from tools.demo.models import Order\n    return Order\n"
    assert plugin_imports(hidden, "runs.views") == ["runs.views:2 imports tools.demo.models"]
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
    assert upward_imports("from runs import views\n", "approvals.services") == [
        "approvals.services:1 imports runs.views (approvals services -> surfaces)"]


def test_downward_and_outside_imports_are_fine():
    source = "import json\nfrom django.db import models\nfrom runs.models import Run\nfrom runs.fsm import FSMModel\n"
    assert upward_imports(source, "tools.services") == []


def test_every_layer_names_modules_that_exist():
    for prefix in LAYERS:
        path = ROOT / Path(*prefix.split("."))
        assert path.with_suffix(".py").exists() or path.is_dir(), prefix


def test_services_raise_only_the_error_family_on_purpose():
    """A module that means "bad input" or "not allowed" says so with ``runs.errors``; a bare ValueError is a bug.

    Every module of runs/, tools/ and approvals/ is read. Django's or DRF's
    ``ValidationError`` belongs in forms, serializers and the API's query
    parameters; a refusal is ``runs.errors.Forbidden``, never a bare
    ``PermissionDenied``.
    """
    validation_modules = ("forms.py", "serializers.py", "api.py")
    offenders = []
    for package in ("runs", "tools", "approvals"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            relative = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
                    if name in ("ValueError", "PermissionDenied") or (name == "ValidationError"
                                                                      and path.name not in validation_modules):
                        offenders.append(f"{relative}:{node.lineno} raises {name}")
    assert offenders == []
