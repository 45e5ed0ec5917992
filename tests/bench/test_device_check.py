"""bench/device_check.sh in its CPU mode, end to end, as a stock GPU image runs it.

The check is run with rlvrlab's own environment (WHEELS=none: `make device-wheels` needs the package index) and
every installed package hidden (tests/bench/stock_site) except torch, transformers, their own requirements and
the wheels of bench/device_wheels*.txt: what a stock image plus the uploaded wheels holds. A training path that starts
importing anything else (MLflow through the tracker, SciPy, math-verify, Optuna) fails here first, as it would on
the node; typer and rich stay visible here, transformers 5 requiring them. The phase tables are read, not the
timings.
"""

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
STOCK_SITE = Path(__file__).resolve().parent / "stock_site"
PHASES = {"rollout": "rollout", "logp": "update/step", "update": "update/step", "sync": "rollout"}
ROW = re.compile(r"^  (rollout|logp|update|sync)\s+(-?\d+\.\d{3})\s+(\d+\.\d{3})  estimate: (rollout|update/step) phase$",
                 re.M)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_set() -> set[str]:
    """The distributions `make device-wheels` puts in device-wheels/ (downloaded, and built from sdists)."""
    lines = [line.split("#")[0].strip() for name in ("device_wheels.txt", "device_wheels_built.txt")
             for line in (ROOT / "bench" / name).read_text().splitlines()]
    return {_norm(Requirement(line).name) for line in lines if line}


def _closure(roots: set[str]) -> set[str]:
    """roots and every distribution they require here, recursively (extras left out, markers evaluated)."""
    found, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                try:
                    metadata.distribution(requirement.name)
                except metadata.PackageNotFoundError:
                    continue
                todo.append(_norm(requirement.name))
    return found


def hidden_modules() -> set[str]:
    """Top-level modules of this environment that belong to no distribution a stock image + the wheels holds."""
    allowed = _closure({"torch", "transformers"}) | _wheel_set() | {"rlvrlab"}
    return {module for module, dists in metadata.packages_distributions().items()
            if not any(_norm(d) in allowed for d in dists)} - _vendored_by_setuptools(allowed)


def _vendored_by_setuptools(allowed: set[str]) -> set[str]:
    """The top-level modules setuptools carries in its _vendor folder (jaraco, more_itertools, ...), which it puts on
    sys.path itself: a stock image with setuptools has them. DeepSpeed's CPU build of its shared-memory op imports
    torch.utils.cpp_extension, which imports setuptools, which imports them."""
    if "setuptools" not in allowed:
        return set()
    import importlib.util

    spec = importlib.util.find_spec("setuptools")
    vendor = Path(spec.origin).parent / "_vendor" if spec and spec.origin else None
    if vendor is None or not vendor.is_dir():
        return set()
    return {p.name.removesuffix(".py") for p in vendor.iterdir()
            if not p.name.endswith(".dist-info") and (p.is_dir() or p.suffix == ".py")}


def test_the_stock_image_hides_what_rlvrlab_needs_elsewhere() -> None:
    """The hiding is not empty-handed: the packages the check must do without are hidden, the wheels' are not."""
    hidden = hidden_modules()
    assert {"mlflow", "optuna", "math_verify", "scipy", "submitit", "matplotlib"} <= hidden
    assert not {"torch", "transformers", "deepspeed", "omegaconf", "pydantic", "hjson", "rlvrlab"} & hidden


@pytest.mark.slow
def test_cpu_mode_prints_each_phase_beside_the_estimate_without_mlflow(tmp_path: Path) -> None:
    env = {**os.environ, "DEVICE": "cpu", "WHEELS": "none", "PYTHON": sys.executable, "OUT": str(tmp_path),
           "PYTHONPATH": str(STOCK_SITE), "STOCK_IMAGE_HIDE": ",".join(sorted(hidden_modules())),
           "NEW": "8", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", str(ROOT / "bench/device_check.sh")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]

    tables = out.split("peak memory per phase (MiB), float32, deepspeed ZeRO-2, hf engine, ")
    assert [t.split(";")[0] for t in tables[1:]] == ["trainer.gradient_checkpointing=false",
                                                     "trainer.gradient_checkpointing=true"]
    estimates = []
    for table in tables[1:]:
        rows = {phase: (float(rss), float(estimate), held_by) for phase, rss, estimate, held_by in ROW.findall(table)}
        assert {phase: held_by for phase, (_, _, held_by) in rows.items()} == PHASES
        assert rows["rollout"][1] == rows["sync"][1] > 0 and rows["logp"][1] == rows["update"][1] > 0
        assert all(rss > 0 for rss, _, _ in rows.values())  # the engines' and the trainer's tensors are resident
        estimates.append(rows["update"][1])
        assert "torch not imported" not in table and "deepspeed 0." in table and "omegaconf 2." in table
    assert estimates[1] < estimates[0]  # checkpointing keeps one hidden state per layer instead of a layer's tensors
    assert out.count("rank 0 step ") == 4
    assert re.search(r"^  update  .* \| .*$", out, re.M)  # the two runs side by side
    assert not list(tmp_path.rglob("mlflow.db"))  # tracking.backend=none: nothing recorded
