"""The package's shape (docs/architecture.md): what `lint-imports` cannot see.

`lint-imports` (pyproject.toml, run by .ci/run) checks that imports go down the layers. These tests read every
module's syntax tree and check the rest of the rules: no module uses a private name of another, a function
imports a project module only where the layering allows nothing else (never to dodge a cycle), and functions
stay short enough to hold in one's head, with each exception named here with its reason, and so do modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "traceanalyze"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 800

# Modules longer than MAX_MODULE_LINES, each with why it stays whole.
LONG_MODULES: dict[str, str] = {
    "ingest/parse.py": "the Kineto decoder, left whole by issue 39",
}

# Functions longer than MAX_FUNCTION_LINES, each with why it stays whole.
LONG_FUNCTIONS: dict[str, str] = {}

# Imports of project modules inside a function, each with what it defers: NumPy and Arrow (~0.5 s of imports)
# are paid only by the commands and paths that compute, never by a cached re-run or `--help`.
_NUMPY = "NumPy/Arrow: a cached re-run computes nothing"
_PARSERS = "the log parsers (yaml, ~100 patterns: ~17 ms) only for a run with a sidecar to read"
DEFERRED_IMPORTS: dict[tuple[str, str], str] = {
    ("traceanalyze", "traceanalyze"): "the Python API on first use: `import traceanalyze` stays light",
    ("traceanalyze.api", "traceanalyze.export"): _NUMPY + " and exports nothing",
    ("traceanalyze.cli", "traceanalyze.export"): _NUMPY + " and exports nothing",
    ("traceanalyze.cli", "traceanalyze.batch"): "a report runs no batch (4 ms of imports on every re-run)",
    ("traceanalyze.report", "traceanalyze.report.batch_index"): "a report renders no batch index",
    ("traceanalyze.ingest.load", "traceanalyze.ingest"): "the Kineto decoder (msgspec, " + _NUMPY + ")",
    ("traceanalyze.ingest.workers", "traceanalyze.ingest"): "the Kineto decoder (msgspec, " + _NUMPY + "): tasks",
    ("traceanalyze.ingest.spans", "traceanalyze.ingest"): "the Kineto decoder (msgspec, " + _NUMPY + ")",
    ("traceanalyze.pipeline", "traceanalyze"): "diagnose (" + _NUMPY + ")",
    ("traceanalyze.stages", "traceanalyze"): "diagnose (" + _NUMPY + ")",
    ("traceanalyze.stages", "traceanalyze.ingest"): "the Kineto decoder (msgspec, " + _NUMPY + "): a cold report "
                                                    "imports it while its new database opens",
    ("traceanalyze.stages", "traceanalyze.logs"): "the log parsers (yaml, ~100 patterns compiled on import)",
    ("traceanalyze.stages", "traceanalyze.metrics"): _NUMPY,
    ("traceanalyze.stages", "traceanalyze.metrics.collectives"): _NUMPY,
    ("traceanalyze.stages", "traceanalyze.metrics.host"): _NUMPY,
    ("traceanalyze.stages", "traceanalyze.metrics.precision"): _NUMPY,
    ("traceanalyze.stages", "traceanalyze.replay.whatif"): _NUMPY,
    ("traceanalyze.stages", "traceanalyze.replay.frombase"): _NUMPY + " (a --baseline's figures)",
    ("traceanalyze.logs.sidecars", "traceanalyze.logs.configs"): _PARSERS,
    ("traceanalyze.logs.sidecars", "traceanalyze.logs.text"): _PARSERS,
    ("traceanalyze.logs.sidecars", "traceanalyze.logs.topology"): _PARSERS,
    ("traceanalyze.logs.sidecars", "traceanalyze.logs.env"): "capture's env parser (~2 ms) only for an env file or a "
                                                             "CPU run's core sharing",
    ("traceanalyze.stages", "traceanalyze.replay.scenarios.ranks"): _NUMPY + " (a --baseline's link)",
}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out.append((name, ast.parse(p.read_text(encoding="utf-8"), str(p))))
    return out


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_pkg = (PACKAGE.parent / Path(*base) / "__init__.py").exists()
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _project_imports(module: str, tree: ast.AST):
    """Yield ``(node, imported module, names)`` for each import of a traceanalyze module in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            if target == "traceanalyze" or target.startswith("traceanalyze."):
                yield node, target, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("traceanalyze"):
                    yield node, a.name, []


def test_no_module_imports_a_private_name_of_another():
    bad = []
    for module, tree in _modules():
        aliases: dict[str, str] = {}  # local name -> project module
        for node, target, names in _project_imports(module, tree):
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{module}: from {target} import {n}")
                aliases[n] = f"{target}.{n}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    aliases[(a.asname or a.name).split(".")[0]] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{module}: {node.value.id}.{node.attr}")
    assert bad == []


def test_project_modules_are_imported_at_the_top_unless_the_deferral_is_named():
    found = {}
    for module, tree in _modules():
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for stmt in ast.walk(fn):
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    for _, target, _ in _project_imports(module, stmt):
                        found[(module, target)] = fn.name
    unnamed = sorted(f"{m} imports {t} in {f}()" for (m, t), f in found.items() if (m, t) not in DEFERRED_IMPORTS)
    stale = sorted(k for k in DEFERRED_IMPORTS if k not in found)
    assert unnamed == [] and stale == []


def test_functions_are_short_or_named_with_their_reason():
    long = {}
    for module, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{module}.{node.name}"] = n
    assert {k: v for k, v in long.items() if k not in LONG_FUNCTIONS} == {}
    assert sorted(k for k in LONG_FUNCTIONS if k not in long) == []


def test_modules_are_short_or_named_with_their_reason():
    long = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            long[p.relative_to(PACKAGE).as_posix()] = n
    assert {k: v for k, v in long.items() if k not in LONG_MODULES} == {}
    assert sorted(k for k in LONG_MODULES if k not in long) == []


MAX_ORCHESTRATOR_LINES = 400  # pipeline.py runs the stages and holds nothing else (issue 39)


def test_the_orchestrator_only_runs_the_stages():
    assert len((PACKAGE / "pipeline.py").read_text(encoding="utf-8").splitlines()) <= MAX_ORCHESTRATOR_LINES
