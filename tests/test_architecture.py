"""The floors of the package hold: no import runs upward or sideways between packages of one floor, and no module
imports itself back through others (imports inside functions count: a lazy import is still a dependency).
docs/architecture.md draws the same floors.  Run: .venv/bin/pytest -q tests/test_architecture.py"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlvrlab"

# Lowest first. A unit (a subpackage or a top-level module of rlvrlab) may import only from units on lower floors.
FLOORS: list[tuple[str, set[str]]] = [
    ("foundation", {"errors", "procs"}),
    ("algorithms, verifiers, run-folder layout, output locations, statistics",
     {"algorithms", "rewards", "rundir", "outputs", "stats"}),
    ("problems", {"data"}),
    ("configuration", {"config"}),
    ("components", {"policy", "rollout", "update", "tracking", "integrations"}),
    ("composition", {"components"}),
    ("orchestration", {"train", "eval", "report"}),
    ("orchestration of many runs", {"sweep"}),
    ("commands", {"cli"}),
]
FLOOR_OF = {unit: level for level, (_, units) in enumerate(FLOORS) for unit in units}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("rlvrlab", *path.relative_to(PACKAGE).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The rlvrlab modules `name` imports anywhere in its file (submodules resolved: `from rlvrlab import x`
    names rlvrlab.x when that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("rlvrlab")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            if not base.startswith("rlvrlab"):
                continue
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "rlvrlab"


def test_every_unit_has_a_floor() -> None:
    units = {unit(m) for m in MODULES} - {"rlvrlab"}
    assert units <= set(FLOOR_OF), f"give these a floor in FLOORS and docs/architecture.md: {units - set(FLOOR_OF)}"


def _violations() -> list[str]:
    bad = []
    for module, targets in GRAPH.items():
        here = unit(module)
        if here == "rlvrlab":
            continue
        for target in targets:
            there = unit(target)
            if there in (here, "rlvrlab"):
                continue
            if FLOOR_OF[there] >= FLOOR_OF[here]:
                bad.append(f"{module} ({FLOORS[FLOOR_OF[here]][0]}) imports {target} ({FLOORS[FLOOR_OF[there]][0]})")
    return sorted(bad)


def test_no_import_runs_upward_or_sideways() -> None:
    assert _violations() == []


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in GRAPH:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_no_module_cycle() -> None:
    assert _cycles() == []


@pytest.mark.parametrize("doc", ["docs/architecture.md"])
def test_the_architecture_doc_names_every_module(doc: str) -> None:
    text = (PACKAGE.parent / doc).read_text()
    missing = [m for m in sorted(MODULES) if m != "rlvrlab" and f"`{m.removeprefix('rlvrlab.')}`" not in text]
    assert missing == [], f"{doc} has no line for {missing}"


# A module a newcomer reads in one sitting (issue 36): the training step's stages have their own modules.
MAX_MODULE_LINES = 520
MAX_LOOP_LINES = 320


def test_no_module_is_too_long_to_read_in_one_sitting() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}
    assert lengths["rlvrlab.train.loop"] <= MAX_LOOP_LINES


# A function a reviewer audits in one screenful (issue 47, item 8): where results are made and where seeds are run.
MAX_FUNCTION_LINES = 80
AUDITED = ("rlvrlab.report", "rlvrlab.sweep", "rlvrlab.stats", "rlvrlab.cli")
MAX_CLI_LINES = 800  # commands are one library call each (issue 47)


def test_no_function_of_the_audited_packages_is_longer_than_a_screenful() -> None:
    long = {f"{name}.{node.name}": node.end_lineno - node.lineno + 1
            for name, path in MODULES.items() if name.startswith(AUDITED)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    assert long == {}


def test_the_commands_are_thin() -> None:
    lines = sum(len(path.read_text().splitlines()) for name, path in MODULES.items() if name.startswith("rlvrlab.cli"))
    assert lines < MAX_CLI_LINES


# Names under a library's public interface that speed-ups once reached for (issue 36), found as text anywhere.
PRIVATE_NAMES = ("_init_group", "__wrapped__", "_profiler_enabled", "_optimizer_step_pre_hooks", "_foreach_",
                 "sql_metrics", "_run_exitfuncs", "._trial_id", "get_omega_conf_dumper")
# Underscored names that are a library's documented interface.
DOCUMENTED = {"os._exit", "sys._getframe"}


def _private_uses(path: Path) -> list[str]:
    """`lib._name` attribute reads on an imported library (rooted at an imported name) and imports from a private
    module or of a private name, in one rlvrlab module."""
    tree = ast.parse(path.read_text())
    external: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            external |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("rlvrlab")}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module not in (None, "__future__") \
                and not node.module.startswith("rlvrlab"):
            external |= {a.asname or a.name for a in node.names}
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") or any(part.startswith("_") for part in node.module.split("."))]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not (
                node.attr.startswith("__") and node.attr.endswith("__")):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in external and ast.unparse(node) not in DOCUMENTED:
                found.append(ast.unparse(node))
    return found


def test_libraries_are_used_through_their_public_interfaces() -> None:
    """No optimizer step through torch.optim's functional internals, no rows written into MLflow's tables, no
    Optuna or OmegaConf internals: what the libraries document, so that their upgrades do not silently break rlvrlab.
    os._exit (documented) ends sweep workers (rlvrlab.procs.end_without_teardown)."""
    texts = {name: path.read_text() for name, path in MODULES.items()}
    assert {name: [p for p in PRIVATE_NAMES if p in text] for name, text in texts.items()
            if any(p in text for p in PRIVATE_NAMES)} == {}
    assert {name: uses for name, path in MODULES.items() if (uses := _private_uses(path))} == {}
