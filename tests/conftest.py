"""Shared fixtures: an environment without the user's rlvrlab variables, and a small experiments folder."""

from collections.abc import Callable
from pathlib import Path

import pytest

WriteTree = Callable[[Path, dict[str, str]], Path]

# A self-contained experiments folder, so composition tests do not depend on the shipped YAML files.
SMALL_EXPERIMENTS = {
    "default.yaml": "defaults: {algorithm: grpo, model: tiny, dataset: countdown}\n",
    "algorithms/grpo.yaml": "name: grpo\nestimator: grpo\nloss: clip\n",
    "algorithms/ucpo.yaml": "# UCPO, arXiv 2605.00365, eq. 7\nname: ucpo\nestimator: ucpo\ntau: 0.2\n",
    "models/tiny.yaml": "tier: tiny\n",
    "models/toy.yaml": "tier: toy\n",
    "datasets/countdown.yaml": "name: countdown\nformat: synthetic\n",
}


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLVRLAB_EXPERIMENTS_DIR", raising=False)
    monkeypatch.delenv("RLVRLAB_DEBUG", raising=False)


def _write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def write_tree() -> WriteTree:
    """write_tree(root, {"relative/path.yaml": "text"}) -> root"""
    return _write_tree


@pytest.fixture
def experiments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SMALL_EXPERIMENTS written to a temporary folder that RLVRLAB_EXPERIMENTS_DIR points at."""
    folder = _write_tree(tmp_path / "experiments", SMALL_EXPERIMENTS)
    monkeypatch.setenv("RLVRLAB_EXPERIMENTS_DIR", str(folder))
    return folder
