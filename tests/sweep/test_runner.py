"""Seed runners (rlvrlab/sweep/runner.py): the kind of a sweep's seed runs is chosen once from the sweep file, and
each kind answers what the sweep asks of a seed run (overrides, trial hash, checks, recorded params, watched code).
The runs themselves: tests/sweep/test_command.py (commands) and test_sweep.py (rlvrlab training).
Run: .venv/bin/pytest -q tests/sweep/test_runner.py"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlvrlab.config import compose, config_hash
from rlvrlab.errors import ConfigError
from rlvrlab.sweep.guard import watched
from rlvrlab.sweep.runner import TRAINING, Command, SeedRunner, seed_runner
from rlvrlab.sweep.spec import SweepSpec, load_sweep
from rlvrlab.sweep.template import command_hash

FILES = Path(__file__).resolve().parent / "fingerprint_sweeps"


@pytest.fixture(scope="module")
def specs() -> dict[str, SweepSpec]:
    return {kind: load_sweep(str(FILES / f"{kind}.yaml")) for kind in ("grid", "command")}


def test_the_kind_is_chosen_once_from_the_sweep_file(specs: dict[str, SweepSpec]) -> None:
    assert seed_runner(None) is TRAINING and specs["grid"].runner is TRAINING
    assert seed_runner("t {seed}") == Command("t {seed}")
    assert specs["command"].runner == Command(specs["command"].command or "")
    members = [name for name in vars(SeedRunner) if not name.startswith("_")]
    assert len(members) == 13  # the traits and operations of a kind
    for spec in specs.values():
        assert all(hasattr(spec.runner, name) for name in members)


def test_each_kind_answers_for_its_seed_runs(specs: dict[str, SweepSpec], tmp_path: Path) -> None:
    grid, command = specs["grid"], specs["command"]
    point = {"algorithm.tau": 1.0, "trainer.staleness": 1}
    assert grid.trial_hash(point) == config_hash(compose(grid.experiment, grid.overrides_for(point, 0)))
    assert "algorithm.tau=1.0" in grid.overrides_for(point, 0)
    assert command.trial_hash({"x": "a"}) == command_hash(command.command or "", {"x": "a"})
    assert command.overrides_for({"x": "a"}, 3) == ["tracking.log_last=1", "output_dir=elsewhere", "seed=3",
                                                    "experiment=cmd"]  # its values go to the command
    assert grid.runner.recorded() == {} and command.runner.recorded() == {"command": command.command}
    assert (grid.launcher.type, command.launcher.type) == ("inprocess", "process")  # own_process: process
    (tmp_path / "train.py").write_text("print(1)\n")
    assert list(watched(command, tmp_path)) == ["train.py"]
    assert "rlvrlab/sweep/runner.py" in watched(grid, tmp_path)


def test_a_kinds_traits_are_what_the_sweep_file_is_checked_against(tmp_path: Path) -> None:
    text = (FILES / "command.yaml").read_text()
    with pytest.raises(ConfigError, match=f"pruner median in .*: {Command('').no_pruner}; remove pruner:"):
        load_sweep(str(_file(tmp_path, text + "pruner: {type: median}\n")))
    with pytest.raises(ConfigError, match="placeholder"):  # Command.check: its template's placeholders
        load_sweep(str(_file(tmp_path, text.replace("{x}", "{y}"))))
    assert load_sweep(str(_file(tmp_path, text.replace("metric: score", "metric: any/name")))).objective.metric \
        == "any/name"  # any_metric: a command's runs log their own names
    assert TRAINING.checks_testbed and not Command("").checks_testbed and not TRAINING.no_pruner


def test_reproduce_asks_the_kind_whether_it_can_rerun_a_study(specs: dict[str, SweepSpec]) -> None:
    from rlvrlab.sweep.reproduce import InputError, trial_params

    with pytest.raises(InputError, match=re.escape(f"study 'cmd': {Command('').no_reproduce}")):
        trial_params(specs["command"], {"config_hash": "0" * 12, "values": {"x": "a"}})
    grid = specs["grid"]
    point = {"algorithm.tau": 1.0, "trainer.staleness": 1}
    assert not TRAINING.no_reproduce and trial_params(grid, {"config_hash": grid.trial_hash(point)}) == (
        point, grid.trial_hash(point))


def _file(folder: Path, text: str) -> Path:
    path = folder / "cmd.yaml"
    path.write_text(text)
    return path
