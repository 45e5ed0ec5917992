"""`pruner: sequential` in a sweep (issue 48, item 3; docs/sweeps.md, "Sequential seeds"): after each seed, a trial
is compared with the incumbent (the best complete trial) on their shared seeds by rlvrlab.stats.sequential and
pruned once it can no longer plausibly beat it by delta; the sweep file's one-line errors; the fingerprint; and
the seed runs saved in the study lines.
Run: .venv/bin/pytest -q -p no:cacheprovider tests/sweep/test_sequential_pruner.py"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from optuna.trial import TrialState

from rlvrlab.errors import ConfigError
from rlvrlab.stats.sequential import PRUNE, SequentialDesign, sequential_decision
from rlvrlab.sweep import fingerprint as F
from rlvrlab.sweep.runner import Pruned
from rlvrlab.sweep.spec import Pruner, load_sweep
from rlvrlab.sweep.study import open_sweep
from rlvrlab.sweep.summary import summarize
from rlvrlab.sweep.trials import SEQUENTIAL_ATTR, _look, _Seeds, incumbent, work
from rlvrlab.sweep.view import study_lines
from rlvrlab.tracking import tags as T

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "sweeps" / "toy_sequential.yaml"
BASE = {"experiment": "toy", "overrides": ["steps=12", "trainer.checkpoint_every=0"], "seeds": 5,
        "space": {"trainer.lr": [0.1, 0.2]}, "objective": {"metric": "policy/toy_correct_mass", "window": 2}}


def _load(folder: Path, **change):
    path = folder / "seq.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    return load_sweep(str(path))


def test_the_toy_sweep_prunes_trials_that_cannot_beat_the_incumbent_and_saves_seed_runs(here: Path) -> None:
    spec = load_sweep(str(TOY))
    assert spec.pruner == Pruner("sequential", delta=0.05, n_min=3) and len(spec.seeds) == 6
    sweep = open_sweep(spec)
    outcomes = work(sweep)
    trials = sweep.study.get_trials()
    best = incumbent(sweep)
    assert best is not None and best.number == 0 and outcomes[0].state == "COMPLETE"
    assert len(best.user_attrs[T.VALUES]) == 6  # the best trial ran every seed
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned and {o.state for o in outcomes[1:]} == {"PRUNED"}
    for trial in pruned:
        why = trial.user_attrs[SEQUENTIAL_ATTR]
        assert why == {"decision": PRUNE, "seeds": why["seeds"], "incumbent": 0, "delta": 0.05}
        assert 3 <= why["seeds"] < 6 and len(trial.user_attrs[T.VALUES]) == why["seeds"]
        assert trial.user_attrs[T.FAILURE] == "pruned" and trial.intermediate_values == {}  # no step reports
        # the recorded values give the rule's decision at that look, and not one look earlier
        mine = [trial.user_attrs[T.VALUES][str(s)] for s in spec.seeds[: why["seeds"]]]
        theirs = [best.user_attrs[T.VALUES][str(s)] for s in spec.seeds[: why["seeds"]]]
        design = SequentialDesign(3, 6, alpha=0.0)
        assert sequential_decision(mine, theirs, 0.05, design) == (PRUNE, why["seeds"])
        if why["seeds"] > 3:
            assert sequential_decision(mine[:-1], theirs[:-1], 0.05, design)[0] != PRUNE
    client = sweep.client()
    runs = {t.number: client.get_run(t.user_attrs[T.MLFLOW_RUN_ID]) for t in pruned}
    assert {r.info.status for r in runs.values()} == {"KILLED"}
    summary = summarize(sweep)
    saved = sum(6 - t.user_attrs[SEQUENTIAL_ATTR]["seeds"] for t in pruned)
    assert summary.seeds_saved == saved > 0 and summary.pruned_early == len(pruned)
    line = f"sequential seeds (delta 0.05): {len(pruned)} trials pruned early, {saved} seed runs saved"
    assert line in study_lines(sweep, summary)
    assert any("cannot beat trial 0 by delta 0.05" in r.reason for r in summary.rows if r.state == "PRUNED")


class _Study:
    def __init__(self, complete: list[SimpleNamespace]) -> None:
        self.complete = complete

    def get_trials(self, deepcopy: bool = False, states=()) -> list[SimpleNamespace]:
        assert states == (TrialState.COMPLETE,)
        return self.complete


class _Trial:
    def __init__(self) -> None:
        self.user_attrs: dict = {}

    def set_user_attr(self, key: str, value) -> None:
        self.user_attrs[key] = value


def _done(values: list[float]) -> _Seeds:
    return _Seeds(list(range(5)), values=dict(enumerate(values)))


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_the_incumbent_is_the_best_by_the_direction_and_both_are_negated_for_minimize(here: Path,
                                                                                     direction: str) -> None:
    sign = 1.0 if direction == "maximize" else -1.0
    spec = _load(here, objective={**BASE["objective"], "direction": direction},
                 pruner={"type": "sequential", "delta": 0.1})
    seeds = [0.01, -0.02, 0.015, 0.0, 0.02]  # a seed effect shared by the trials
    good = SimpleNamespace(number=4, value=sign * 0.9, user_attrs={T.VALUES: {str(i): sign * (0.9 + e)
                                                                              for i, e in enumerate(seeds)}})
    poor = SimpleNamespace(number=2, value=sign * 0.5, user_attrs={T.VALUES: {str(i): sign * (0.5 + e)
                                                                              for i, e in enumerate(seeds)}})
    sweep = SimpleNamespace(spec=spec, study=_Study([poor, good]))
    assert incumbent(sweep) is good
    worse, trial = [sign * (0.6 + e + 0.002 * i) for i, e in enumerate(seeds[:3])], _Trial()
    with pytest.raises(Pruned):
        _look(sweep, trial, _done(worse))
    assert trial.user_attrs[SEQUENTIAL_ATTR] == {"decision": PRUNE, "seeds": 3, "incumbent": 4, "delta": 0.1}
    better = [sign * (1.2 + e + 0.001 * i) for i, e in enumerate(seeds[:3])]
    _look(sweep, _Trial(), _done(better))  # as good as the incumbent: it goes on
    _look(sweep, _Trial(), _done(worse[:2]))  # before n_min seeds: no look
    _look(SimpleNamespace(spec=spec, study=_Study([])), _Trial(), _done(worse))  # no incumbent yet: all seeds run


BAD = [
    ({"pruner": {"type": "sequential"}}, "pruner sequential in .* needs delta > 0"),
    ({"pruner": {"type": "sequential", "delta": 0}}, "needs delta > 0"),
    ({"pruner": {"type": "sequential", "delta": -0.1}}, "needs delta > 0"),
    ({"pruner": {"type": "sequential", "delta": "big"}}, "needs delta > 0"),
    ({"pruner": {"type": "sequential", "delta": True}}, "needs delta > 0"),
    ({"pruner": {"type": "sequential", "delta": 0.1, "n_min": 2}}, "pruner.n_min 2 in .* must be at least 3"),
    ({"pruner": {"type": "sequential", "delta": 0.1, "n_min": 6}}, "looks first after n_min=6 seeds, and the sweep"
                                                                   " has 5"),
    ({"pruner": {"type": "sequential", "delta": 0.1}, "seeds": 2}, "looks first after n_min=3 seeds"),
    ({"pruner": {"type": "sequential", "delta": 0.1}, "seeds": {"initial": 5, "max": 9, "halfwidth": 0.1}},
     "needs a fixed seed list"),
    ({"pruner": {"type": "median", "delta": 0.1}}, "pruner.delta and pruner.n_min in .* are for pruner type "
                                                   "sequential"),
    ({"pruner": {"type": "none", "n_min": 3}}, "are for pruner type sequential"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_sequential_pruners_are_one_line_errors(here: Path, change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        _load(here, **change)
    assert "\n" not in str(error.value)


def test_a_sequential_pruner_runs_with_child_launchers_and_commands(here: Path) -> None:
    """It reads each seed's value, which every launcher and a command give back; a step pruner is still refused."""
    sequential = {"type": "sequential", "delta": 0.1}
    assert _load(here, pruner=sequential, launcher="process").launcher.child
    with pytest.raises(ConfigError, match="pruner median in .* needs launcher inprocess"):
        _load(here, pruner={"type": "median"}, launcher="process")
    command = {"command": "train --lr {lr} --seed {seed}", "space": {"lr": [1, 2]}, "objective": {"metric": "m"}}
    body = {"name": "cmd", "seeds": 4, **command}
    path = here / "cmd.yaml"
    path.write_text(yaml.safe_dump({**body, "pruner": sequential}))
    assert load_sweep(str(path)).pruner.type == "sequential"
    path.write_text(yaml.safe_dump({**body, "pruner": {"type": "median"}}))
    with pytest.raises(ConfigError, match="use pruner sequential"):
        load_sweep(str(path))


def test_delta_and_n_min_enter_the_fingerprint_only_for_a_sequential_pruner(here: Path) -> None:
    """New fields at their defaults leave the stored fingerprints as they were (test_fingerprint.py checks every
    sweep file); a sequential pruner's delta and n_min change results, so they change it."""
    assert F.PRUNER.document(Pruner("median", 50, 5)) == {"type": "median", "warmup_steps": 50, "startup_trials": 5}
    spec = _load(here, pruner={"type": "sequential", "delta": 0.1})
    assert F.PRUNER.document(spec.pruner) == {"type": "sequential", "warmup_steps": 0, "startup_trials": 5,
                                              "delta": 0.1}  # n_min at its default is left out
    changed = [dataclasses.replace(spec, pruner=dataclasses.replace(spec.pruner, delta=0.2)),
               dataclasses.replace(spec, pruner=dataclasses.replace(spec.pruner, n_min=4)),
               dataclasses.replace(spec, pruner=Pruner())]
    assert len({spec.fingerprint(), *(c.fingerprint() for c in changed)}) == 4


# a command whose score is its value x plus a seed effect the trials share and a little noise of its own
SCRIPT = ("import sys; x, seed = float(sys.argv[1]), int(sys.argv[2]); "
          "import mlflow; mlflow.start_run(); "
          "mlflow.log_metric('score', x + 0.1 * (seed % 3) + 0.01 * ((seed * 7 + int(x * 10)) % 5), step=0); "
          "mlflow.end_run()")


@pytest.mark.slow
def test_a_command_sweep_prunes_sequentially_too(here: Path) -> None:
    from rlvrlab.sweep.workers import run_sweep

    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(SCRIPT)} {{x}} {{seed}}"
    path = here / "cmd.yaml"
    path.write_text(yaml.safe_dump({"name": "cmd", "command": command, "seeds": 5, "space": {"x": [1.0, 0.2]},
                                    "objective": {"metric": "score", "window": 1},
                                    "pruner": {"type": "sequential", "delta": 0.1}}))
    sweep = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
    first, second = sweep.study.get_trials()
    assert first.state == TrialState.COMPLETE and len(first.user_attrs[T.VALUES]) == 5
    assert second.state == TrialState.PRUNED and second.user_attrs[SEQUENTIAL_ATTR]["seeds"] == 3
    assert summarize(sweep).seeds_saved == 2
