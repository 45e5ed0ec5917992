"""`confirm: {seeds: N, baseline: {...}}` in a sweep (issue 48, item 1; docs/sweeps.md, "Confirmation on fresh
seeds"): after the search, the best trial and the baseline cell run again on N seeds disjoint from the search
seeds (never as Optuna trials), the study lines show both estimates and the shrinkage, a re-run reuses the
confirmation runs; the sweep file's one-line errors; the fingerprint.
Run: .venv/bin/pytest -q -p no:cacheprovider tests/sweep/test_confirm_sweep.py"""

from __future__ import annotations

import collections
import dataclasses
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.report.command import ReportRequest, make_report
from rlvrlab.stats.confirm import confirm
from rlvrlab.sweep import fingerprint as F
from rlvrlab.sweep.confirmation import ARM, CONFIRMATION, LINE, SEED_ROLE, Confirm, confirm_sweep
from rlvrlab.sweep.spec import load_sweep
from rlvrlab.sweep.summary import summarize
from rlvrlab.sweep.view import study_lines
from rlvrlab.sweep.workers import run_sweep
from rlvrlab.tracking import tags as T

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "sweeps" / "toy_confirm.yaml"
BASE = {"experiment": "toy", "overrides": ["steps=12", "trainer.checkpoint_every=0"], "seeds": 3,
        "space": {"trainer.lr": [0.1, 0.2]}, "objective": {"metric": "policy/toy_correct_mass", "window": 2}}


def _load(folder: Path, **change):
    path = folder / "confirm.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    return load_sweep(str(path))


def _runs(sweep) -> list:
    return sweep.client().search_runs([sweep.experiment_id], max_results=1000)


def test_the_toy_sweep_confirms_the_winner_against_the_baseline_on_fresh_seeds(here: Path) -> None:
    spec = load_sweep(str(TOY), [f"output_dir={here}"])
    assert spec.confirm == Confirm(3, (("trainer.lr", 1e-9),))
    sweep = run_sweep(spec)
    record = sweep.study.user_attrs[CONFIRMATION]
    search, fresh = set(record["search_seeds"]), record["confirmation_seeds"]
    assert search <= set(spec.seeds) and not set(fresh) & set(spec.seeds) and len(fresh) == 3
    assert record["winner"] != record["baseline"] and len(sweep.study.get_trials()) == 3  # no trial was added
    runs = _runs(sweep)
    arms = collections.Counter((r.data.tags[ARM], r.data.tags[T.SEED]) for r in runs
                               if r.data.tags.get(T.ROLE) == SEED_ROLE and r.info.status == "FINISHED")
    assert arms == {(arm, str(s)): 1 for arm in ("winner", "baseline") for s in fresh}
    winner, baseline = (sweep.study.trials[record[a]].user_attrs[T.VALUES] for a in ("winner", "baseline"))
    seeds = record["search_seeds"]
    redone = confirm([winner[str(s)] for s in seeds], [baseline[str(s)] for s in seeds], record["winner_values"],
                     record["baseline_values"], search_seeds=seeds, confirmation_seeds=fresh)
    assert record["confirmation"]["delta"] == pytest.approx(redone.confirmation.delta)
    assert record["shrinkage"] == pytest.approx(redone.shrinkage)
    lines = study_lines(sweep, summarize(sweep))
    shown = [line for line in lines if line.startswith("confirmation (")]
    assert len(shown) == 1 and "search estimate Δ" in shown[0] and "confirmation Δ" in shown[0]
    assert "shrinkage" in shown[0] and f"3 fresh seeds {', '.join(map(str, fresh))}" in shown[0]
    assert any(line.startswith("sequential seeds (delta 0.05):") and "seed runs saved" in line for line in lines)
    study_run = sweep.client().get_run(sweep.study_run_id)
    assert study_run.data.tags[LINE] == shown[0]
    saved = next(line for line in lines if line.startswith("sequential seeds"))
    assert study_run.data.tags[T.SEQUENTIAL_LINE] == saved
    report = make_report(ReportRequest(study="toy_confirm", output_dir=str(here), plots=False,
                                       out=here / "report")).result  # the report says both
    assert f"study toy_confirm: {saved}" in report.notes and f"study toy_confirm: {shown[0]}" in report.notes
    again = run_sweep(load_sweep(str(TOY), [f"output_dir={here}"]))  # a re-run reuses the confirmation runs
    assert len([r for r in _runs(again) if r.data.tags.get(T.ROLE) == SEED_ROLE]) == 6
    assert again.study.user_attrs[CONFIRMATION] == record


@pytest.mark.parametrize("block, message", [
    ({"seeds": 1, "baseline": {"trainer.lr": 0.1}}, "confirm.seeds"),
    ({"seeds": True, "baseline": {"trainer.lr": 0.1}}, "confirm.seeds"),
    ({"seeds": 3}, "confirm.baseline"),
    ({"seeds": 3, "baseline": {"trainer.lr": 0.3}}, "not a swept value"),
    ({"seeds": 3, "baseline": {"algorithm.tau": 0.3}}, "confirm.baseline key"),
    ({"seeds": 3, "baseline": {"trainer.lr": 0.1}, "level": 0.9}, "confirm key"),
    ([3], "must be a mapping"),
])
def test_a_bad_confirm_block_is_one_line(here: Path, block, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        _load(here, confirm=block)
    assert "\n" not in str(error.value)


def test_confirm_refuses_adaptive_seeds_and_needs_every_swept_key(here: Path) -> None:
    with pytest.raises(ConfigError, match="fixed seed list"):
        _load(here, seeds={"initial": 5, "max": 10, "halfwidth": 0.05},
              confirm={"seeds": 3, "baseline": {"trainer.lr": 0.1}})
    with pytest.raises(ConfigError, match="no value for algorithm.tau"):
        _load(here, space={"trainer.lr": [0.1, 0.2], "algorithm.tau": [0.0, 1.0]}, overrides=[
            "algorithm=ucpo", "steps=12", "trainer.checkpoint_every=0"],
              confirm={"seeds": 3, "baseline": {"trainer.lr": 0.1}})


def test_a_confirm_block_leaves_the_studys_fingerprint_as_it_is(here: Path) -> None:
    """Confirmation re-runs two cells after the search on fresh seeds: the search's runs are the same, so a study can
    gain (or change) its confirm: block and continue."""
    plain = _load(here)
    assert plain.confirm is None and "confirm" not in F.document(plain)
    confirmed = _load(here, confirm={"seeds": 3, "baseline": {"trainer.lr": 0.1}})
    assert "confirm" not in F.document(confirmed) and "confirm" in F.SPEC.ignored
    assert confirmed.fingerprint() == plain.fingerprint() == \
        _load(here, confirm={"seeds": 4, "baseline": {"trainer.lr": 0.1}}).fingerprint()


def test_confirm_seeds_from_the_command_line_override_the_file_and_need_its_baseline(here: Path) -> None:
    path = here / "confirm.yaml"
    path.write_text(yaml.safe_dump({**BASE, "confirm": {"seeds": 3, "baseline": {"trainer.lr": 0.1}}}))
    assert load_sweep(str(path), confirm_seeds=5).confirm == Confirm(5, (("trainer.lr", 0.1),))
    path.write_text(yaml.safe_dump(BASE))
    with pytest.raises(ConfigError, match="--confirm-seeds 5 needs a confirm: block"):
        load_sweep(str(path), confirm_seeds=5)


# logs score = len(x) * (1 + seed % 3) + step at steps 0..1 into the run of MLFLOW_RUN_ID: another trainer's command
SCRIPT = ("import sys, mlflow; x, seed = sys.argv[1], int(sys.argv[2]); mlflow.start_run(); "
          "[mlflow.log_metric('score', len(x) * (1 + seed % 3) + s, step=s) for s in range(2)]; mlflow.end_run()")


@pytest.mark.slow
def test_a_command_sweep_confirms_with_its_own_command(here: Path) -> None:
    """The confirmation seeds run through the sweep's seed runner: here another trainer's command, in its process."""
    command = f"{shlex.quote(sys.executable)} -c {shlex.quote(SCRIPT)} {{x}} {{seed}}"
    path = here / "cmd.yaml"
    path.write_text(yaml.safe_dump({"name": "cmd", "command": command, "seeds": 2, "space": {"x": ["a", "bbb"]},
                                    "objective": {"metric": "score", "window": 1},
                                    "confirm": {"seeds": 2, "baseline": {"x": "a"}}}))
    sweep = run_sweep(load_sweep(str(path), [f"output_dir={here}"]))
    record = sweep.study.user_attrs[CONFIRMATION]
    assert record["confirmation_seeds"] == [2, 3] and record["search_seeds"] == [0, 1]
    assert record["winner_values"] == [3 * 3 + 1, 3 * 1 + 1] and record["baseline_values"] == [3 + 1, 1 + 1]
    assert record["confirmation"]["delta"] == pytest.approx((6 + 2) / 2)
    assert len([r for r in _runs(sweep) if r.data.tags.get(T.ROLE) == SEED_ROLE]) == 4


def test_a_baseline_without_a_complete_trial_is_one_line_naming_the_fix(here: Path) -> None:
    spec = _load(here, confirm={"seeds": 3, "baseline": {"trainer.lr": 0.1}})
    study = optuna.create_study(direction="maximize")
    distribution = {"trainer.lr": optuna.distributions.CategoricalDistribution([0.1, 0.2])}
    study.add_trial(optuna.trial.create_trial(params={"trainer.lr": 0.2}, distributions=distribution, value=0.9))
    study.add_trial(optuna.trial.create_trial(params={"trainer.lr": 0.1}, distributions=distribution,
                                              state=optuna.trial.TrialState.PRUNED))
    with pytest.raises(RlvrlabError, match="trainer.lr=0.1 .* has no complete trial.*set confirm.baseline") as error:
        confirm_sweep(SimpleNamespace(spec=spec, study=study))
    assert "\n" not in str(error.value)
    study.add_trial(optuna.trial.create_trial(params={"trainer.lr": 0.1}, distributions=distribution, value=0.5))
    unfinished = SimpleNamespace(spec=dataclasses.replace(spec, sampler="tpe", trials=4), study=study)
    assert confirm_sweep(SimpleNamespace(spec=_load(here), study=study)) is None  # no confirm: block
    assert unfinished.spec.total_trials() == 4 and confirm_sweep(unfinished) is None  # trials left: not yet
