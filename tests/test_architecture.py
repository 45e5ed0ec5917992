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
    ("algorithms, verifiers, run-folder layout, output locations", {"algorithms", "rewards", "rundir", "outputs"}),
    ("problems", {"data"}),
    ("configuration", {"config"}),
    ("components", {"policy", "rollout", "update", "tracking"}),
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
