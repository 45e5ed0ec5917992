"""Shared fixtures: an environment without the user's rlvrlab variables, and a small experiments folder."""

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

WriteTree = Callable[[Path, dict[str, str]], Path]

# A self-contained experiments folder, so composition tests do not depend on the shipped YAML files.
SMALL_EXPERIMENTS = {
    "default.yaml": "defaults: {algorithm: grpo, model: tiny, dataset: countdown}\n",
    "toy.yaml": "defaults: {algorithm: grpo, model: toy, dataset: toy}\n",
    "algorithms/grpo.yaml": "name: grpo\nestimator: grpo\nloss: clip\n",
    "algorithms/ucpo.yaml": "# UCPO, arXiv 2605.00365, eq. 7\nname: ucpo\nestimator: ucpo\ntau: 0.2\n",
    "models/tiny.yaml": "tier: tiny\n",
    "models/toy.yaml": "tier: toy\n",
    "datasets/countdown.yaml": "name: countdown\nformat: synthetic\n",
    "datasets/toy.yaml": "name: toy\nformat: synthetic\nverifier: exact\n",
}


LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RLVRLAB_EXPERIMENTS_DIR", raising=False)
    monkeypatch.delenv("RLVRLAB_DEBUG", raising=False)
    # an in-process DeepSpeed run sets the launcher variables for its one-process group, whose port this process
    # keeps; subprocesses of later tests must not inherit them (they would try to bind that port: EADDRINUSE)
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield
    # monkeypatch restores only what it found: what the test set is removed here, before the next module's
    # fixtures (set up ahead of this function fixture) start their subprocesses
    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)


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


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One model cache per test session (the warm-started tiny model is built once, then reused)."""
    import os

    os.environ["RLVRLAB_CACHE"] = str(tmp_path_factory.mktemp("rlvrlab-cache"))


def _mlflow_history(output_dir: Path, run_id: str) -> dict[str, dict[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{output_dir.resolve() / 'mlflow.db'}")
    run = client.get_run(run_id)
    return {
        name: {m.step: m.value for m in sorted(client.get_metric_history(run_id, name), key=lambda m: m.timestamp)}
        for name in run.data.metrics
    }


@pytest.fixture
def mlflow_history() -> Callable[[Path, str], dict[str, dict[int, float]]]:
    """mlflow_history(output_dir, run_id) -> {metric: {step: value}} from the default sqlite store
    (the last value logged per step: a resumed run re-logs the steps after its checkpoint)."""
    return _mlflow_history


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A test's own temporary folder as the working directory (a sweep's relative runs/ and files land there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
