"""Docs that cannot drift from the code: docs/algorithms.md names every registry entry and every trait the
registries carry, and every repository file the package's docstrings and comments cite exists."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from rlvrlab import algorithms
from rlvrlab.algorithms import registry

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS_MD = (ROOT / "docs" / "algorithms.md").read_text()

# Every exported name-to-entry table of the algorithm library (ADVANTAGES, POLICY_LOSSES, AGGREGATIONS,
# KL_ESTIMATORS, REJECTION_OPTIONS, and any registry added later).
REGISTRIES = {name: getattr(algorithms, name) for name in algorithms.__all__
              if name.isupper() and isinstance(getattr(algorithms, name), dict)}
# The registry entry types (Estimator, PolicyLoss) and their traits: every field but the function itself.
ENTRY_TYPES = {name: obj for name, obj in vars(registry).items()
               if dataclasses.is_dataclass(obj) and isinstance(obj, type) and obj.__module__ == registry.__name__}


def _quoted(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


def _table_row(first_cell: str) -> list[str]:
    """The rows of docs/algorithms.md's tables whose first cell starts with `first_cell`."""
    return [line for line in ALGORITHMS_MD.splitlines() if re.match(rf"\|\s*`{re.escape(first_cell)}`", line)]


def test_the_registries_are_found():
    assert {"ADVANTAGES", "POLICY_LOSSES", "AGGREGATIONS", "KL_ESTIMATORS", "REJECTION_OPTIONS"} <= set(REGISTRIES)
    assert {"Estimator", "PolicyLoss"} <= set(ENTRY_TYPES)


@pytest.mark.parametrize("name", sorted(REGISTRIES))
def test_algorithms_md_names_every_registry_entry(name):
    missing = sorted(set(REGISTRIES[name]) - _quoted(ALGORITHMS_MD))
    assert not missing, f"docs/algorithms.md does not name {name} entries {missing} (write each as `name`)"


@pytest.mark.parametrize("name", ["ADVANTAGES", "POLICY_LOSSES", "AGGREGATIONS", "KL_ESTIMATORS"])
def test_registry_table_lists_exactly_the_registry(name):
    """The registry table's row for `name` holds its entries, no more (a removed entry leaves the row too)."""
    rows = _table_row(name)
    assert len(rows) == 1, f"docs/algorithms.md needs one registry table row for `{name}`"
    listed = {token for token in _quoted(rows[0]) if token != name and not token.endswith(".py")}
    assert listed == set(REGISTRIES[name]), (
        f"`{name}` row: missing {sorted(set(REGISTRIES[name]) - listed)}, stale {sorted(listed - set(REGISTRIES[name]))}")


@pytest.mark.parametrize("entry", sorted(ENTRY_TYPES))
def test_trait_table_lists_exactly_the_traits(entry):
    traits = {f.name for f in dataclasses.fields(ENTRY_TYPES[entry]) if f.name != "fn" and not f.name.startswith("_")}
    listed = {cell for row in _table_row(entry) for cell in re.findall(r"^\|\s*`[^`]+`\s*\|\s*`([^`]+)`", row)}
    assert listed == traits, f"trait table, `{entry}`: missing {sorted(traits - listed)}, stale {sorted(listed - traits)}"


# Repository files cited from rlvrlab/**/*.py: a top-level folder of the repository, then a path that ends in a
# file name with an extension. Placeholders (NAME, <name>, globs, {fields}) are not citations.
_TOP = "|".join(sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name in
                       {"bench", "docs", "experiments", "results", "rlvrlab", "sweeps", "tests"}))
_CITED = re.compile(rf"(?<![\w/.-])((?:{_TOP})/[\w./<>*{{}}-]*\.[A-Za-z]+)\b")
_PLACEHOLDER = re.compile(r"NAME|[<>*{}]")


def _cited_paths() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "rlvrlab").rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for cited in _CITED.findall(line):
                if not _PLACEHOLDER.search(cited):
                    found.append((f"{path.relative_to(ROOT)}:{lineno}", cited))
    return found


def test_the_cited_path_pattern_finds_citations():
    cited = {c for _, c in _cited_paths()}
    assert {"bench/README.md", "docs/report.md"} <= cited
    assert not _CITED.findall("see results/eval for the output") and not _CITED.findall("a/docs/x.md")


def test_every_cited_markdown_file_is_in_the_repository():
    """A document named without its folder (`X.md`) is one of the repository's own: notes kept elsewhere are cited
    by their public name and section, or through a docs/ page."""
    documents = set()
    for _, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]  # .git, .venv, .venv-vllm
        documents |= {name for name in files if name.endswith(".md")}
    missing = []
    for path in sorted((ROOT / "rlvrlab").rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            missing += [f"{path.relative_to(ROOT)}:{lineno}: {name}" for name in re.findall(r"\b([\w-]+\.md)\b", line)
                        if not _PLACEHOLDER.search(name) and name not in documents]
    assert not missing, "rlvrlab cites documents the repository does not have:\n" + "\n".join(missing)


def test_every_cited_repository_file_exists():
    missing = [f"{where}: {cited}" for where, cited in _cited_paths() if not (ROOT / cited.rstrip(".")).exists()]
    assert not missing, "rlvrlab cites files the repository does not have:\n" + "\n".join(missing)
