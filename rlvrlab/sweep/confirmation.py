"""`confirm: {seeds: N, baseline: {KEY: VALUE, ...}}` of a sweep file: once the search is over, its best complete
trial and the baseline cell run again on N seeds disjoint from every search seed (rlvrlab.stats.confirm), and the
paired interval over those seeds is the one to quote, beside the search's own (selection-biased) estimate. When it
runs, how its runs are recorded and reused: docs/sweeps.md, "Confirmation on fresh seeds". Parsed with the sweep
file (`parse_confirm`, one ConfigError line per mistake; also the sequential pruner's seed check,
`check_sequential`); run by `confirm_sweep`."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from mlflow.entities import Param as RunParam, RunTag
from optuna.trial import TrialState

from rlvrlab.config.rules import unknown
from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.stats.confirm import confirm, fresh_seeds
from rlvrlab.stats.intervals import MIN_SEEDS
from rlvrlab.sweep.objective import objective_of
from rlvrlab.sweep.runner import SEQUENTIAL, SeedFailed
from rlvrlab.sweep.space import format_value
from rlvrlab.tracking import tags as T

CONFIRMATION = "confirmation"  # the study's user attribute, and the role of an arm's MLflow run
SEED_ROLE = "confirmation_seed"  # the role of a confirmation seed run (never "seed": no trial counts it)
ARM = T.attr("confirmation_arm")  # winner | baseline, on a confirmation's runs
LINE = T.CONFIRMATION_LINE  # the confirmation line, on the study's MLflow run
MAX_CONFIRM = 1000  # fresh seeds per arm, each a training run
KEYS = ("seeds", "baseline")
EXAMPLE = "confirm: {seeds: 3, baseline: {trainer.lr: 0.1}}"


@dataclasses.dataclass(frozen=True)
class Confirm:
    """`confirm:` of a sweep file: N fresh seeds for the winner and the baseline cell (every swept key's value)."""

    seeds: int
    baseline: tuple[tuple[str, Any], ...]


def parse_confirm(body: Any, space: Any, adaptive: Any, where: str, seeds: Optional[int] = None) -> Optional[Confirm]:
    """The `confirm:` block (None when absent), checked against the sweep's space (rlvrlab.sweep.space.Param's);
    seeds: --confirm-seeds, over its seeds:."""
    if seeds is not None and not isinstance(body, dict):
        raise ConfigError(f"--confirm-seeds {seeds} needs a confirm: block in {where} naming the baseline, e.g. "
                          f"{EXAMPLE}")
    if body is None:
        return None
    body = body if seeds is None else {**body, "seeds": seeds}
    if not isinstance(body, dict):
        raise ConfigError(f"confirm in {where} must be a mapping with keys seeds and baseline, e.g. {EXAMPLE}")
    for key in body:
        if key not in KEYS:
            raise unknown("confirm key", key, KEYS, where=where)
    n = body.get("seeds")
    if isinstance(n, bool) or not isinstance(n, int) or not MIN_SEEDS <= n <= MAX_CONFIRM:
        raise ConfigError(f"confirm.seeds in {where} must be an integer from {MIN_SEEDS} to {MAX_CONFIRM} (the fresh "
                          f"seeds the best cell and the baseline each run again; 3-10 is typical), e.g. {EXAMPLE}")
    if adaptive is not None:
        raise ConfigError(f"confirm in {where} needs a fixed seed list (adaptive seeds give each trial its own "
                          "seeds, and the search comparison pairs shared ones); use e.g. seeds: 5")
    params, baseline = {p.key: p for p in space}, body.get("baseline")
    if not isinstance(baseline, dict) or not baseline:
        raise ConfigError(f"confirm.baseline in {where} must give the baseline cell's value of every swept key "
                          f"({', '.join(params)}), e.g. {EXAMPLE}")
    for key, value in baseline.items():
        if key not in params:
            raise unknown("confirm.baseline key (a swept key)", key, tuple(params), where=where)
        listed = params[key].values
        if listed is not None and format_value(value) not in {format_value(v) for v in listed}:
            raise ConfigError(f"confirm.baseline {key}={format_value(value)} in {where} is not a swept value of {key} "
                              f"({', '.join(format_value(v) for v in listed)}); give one of them")
    missing = [key for key in params if key not in baseline]
    if missing:
        raise ConfigError(f"confirm.baseline in {where} has no value for {', '.join(missing)}: give every swept key's "
                          "value, so that it names one cell")
    return Confirm(n, tuple((key, baseline[key]) for key in params))


def check_sequential(pruner: Any, adaptive: Any, seeds: tuple[int, ...], where: str) -> None:
    """A sequential pruner compares trials on shared seeds up to one n_max: a fixed list of at least n_min."""
    if pruner.type != SEQUENTIAL:
        return
    if adaptive is not None:
        raise ConfigError(f"pruner {SEQUENTIAL} in {where} needs a fixed seed list (adaptive seeds give each trial "
                          "its own number of seeds); use e.g. seeds: 10")
    if len(seeds) < pruner.n_min:
        raise ConfigError(f"pruner {SEQUENTIAL} in {where} looks first after n_min={pruner.n_min} seeds, and the "
                          f"sweep has {len(seeds)}; give at least {pruner.n_min} seeds or lower pruner.n_min")


@dataclasses.dataclass(frozen=True)
class _Arm:
    """What a seed runner needs of a trial for a confirmation seed: its number; it reports to no pruner."""

    number: int

    def report(self, value: float, step: int) -> None:
        return None

    def should_prune(self) -> bool:
        return False


def confirm_sweep(sweep: Any) -> Optional[dict]:
    """Confirm an opened sweep (rlvrlab.sweep.study.Sweep) whose `confirm:` is set and whose trials are all done:
    the record (also saved on the study), or None when there is nothing to confirm yet."""
    spec, plan = sweep.spec, sweep.spec.confirm
    trials = sweep.study.get_trials(deepcopy=False)
    settled = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)]
    total = spec.total_trials()
    if plan is None or total is None or len(settled) < total or len(settled) < len(trials):
        return None
    sign = 1.0 if spec.objective.direction == "maximize" else -1.0
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    wanted = {key: format_value(value) for key, value in plan.baseline}
    shown = " ".join(f"{k}={v}" for k, v in wanted.items())
    base = [t for t in complete if {k: format_value(t.params.get(k)) for k in wanted} == wanted]
    if not complete or not base:
        raise RlvrlabError(f"confirm: the baseline {shown} of study {spec.name} has no complete trial (it failed or "
                           "was pruned); set confirm.baseline to a cell that completed (list it first in space: so a "
                           "sequential pruner has no incumbent yet), or re-run it with --retry-failed")
    winner, baseline = max(complete, key=lambda t: (sign * t.value, -t.number)), base[0]
    record: dict[str, Any] = {"winner": winner.number, "baseline": baseline.number, "baseline_params": shown}
    if winner.number != baseline.number:
        record.update(_compared(sweep, winner, baseline))
    sweep.study.set_user_attr(CONFIRMATION, record)
    client = sweep.client()
    client.log_batch(sweep.study_run_id, tags=[RunTag(LINE, confirmation_line(record)[:5000])])
    client.log_dict(sweep.study_run_id, record, "confirmation.json")
    return record


def _compared(sweep: Any, winner: Any, baseline: Any) -> dict[str, Any]:
    """Both arms run on the fresh seeds; the search and confirmation comparisons (winner - baseline) as numbers."""
    spec = sweep.spec
    theirs = [{int(s): v for s, v in (t.user_attrs.get(T.VALUES) or {}).items()} for t in (winner, baseline)]
    shared = [s for s in spec.seeds if all(s in values for values in theirs)]
    fresh = fresh_seeds(spec.seeds, spec.confirm.seeds)
    client = sweep.client()
    ran = {arm: _run_arm(sweep, client, trial, arm, fresh) for arm, trial in (("winner", winner),
                                                                                ("baseline", baseline))}
    result = confirm([theirs[0][s] for s in shared], [theirs[1][s] for s in shared], ran["winner"], ran["baseline"],
                     search_seeds=shared, confirmation_seeds=fresh)
    return {"search_seeds": list(shared), "confirmation_seeds": list(fresh),
            "winner_values": ran["winner"], "baseline_values": ran["baseline"],
            "search": _numbers(result.search), "confirmation": _numbers(result.confirmation),
            "shrinkage": result.shrinkage}


def _numbers(comparison: Any) -> dict[str, float]:
    return {"delta": float(comparison.delta), "low": float(comparison.low), "high": float(comparison.high),
            "p": float(comparison.p)}


def _run_arm(sweep: Any, client: Any, trial: Any, arm: str, seeds: tuple[int, ...]) -> list[float]:
    """The trial's config on each fresh seed, by the sweep's seed runner (a finished confirmation run reused)."""
    spec = sweep.spec
    parent = _arm_run(sweep, client, trial, arm)
    values: list[float] = []
    for position, seed in enumerate(seeds):
        found = client.search_runs([sweep.experiment_id], filter_string=(
            f"tags.`{T.STUDY}` = '{spec.name}' and tags.`{T.ROLE}` = '{SEED_ROLE}' and tags.`{ARM}` = '{arm}' and "
            f"tags.`{T.TRIAL}` = '{trial.number}' and tags.seed = '{seed}' and attributes.status = 'FINISHED'"),
            max_results=1)
        if found:
            values.append(objective_of(client, found[0].info.run_id, spec.objective.metric, spec.objective.window))
            continue
        outcome = spec.runner.run_seed(sweep, client, _Arm(trial.number), dict(trial.params), seed, position, parent,
                                       {T.ROLE: SEED_ROLE, ARM: arm})
        if isinstance(outcome, SeedFailed):
            raise RlvrlabError(f"confirmation of the {arm} (trial {trial.number}), seed {seed}, failed: "
                               f"{outcome.reason}; fix it and run the same sweep command again (finished "
                               "confirmation runs are reused)")
        values.append(float(outcome.value))
    client.set_terminated(parent, status="FINISHED")
    return values


def _arm_run(sweep: Any, client: Any, trial: Any, arm: str) -> str:
    """The MLflow run of one arm of the confirmation (under the study's run), found again on a re-run."""
    spec = sweep.spec
    found = client.search_runs([sweep.experiment_id], filter_string=(
        f"tags.`{T.STUDY}` = '{spec.name}' and tags.`{T.ROLE}` = '{CONFIRMATION}' and tags.`{ARM}` = '{arm}' and "
        f"tags.`{T.TRIAL}` = '{trial.number}'"), max_results=1)
    if found:
        return found[0].info.run_id
    run = client.create_run(sweep.experiment_id, run_name=f"confirmation {arm} (trial {trial.number})",
                            tags={T.PARENT: sweep.study_run_id, T.ROLE: CONFIRMATION, T.STUDY: spec.name,
                                  T.TRIAL: str(trial.number), ARM: arm})
    client.log_batch(run.info.run_id, params=[RunParam(k, format_value(v)) for k, v in trial.params.items()])
    return run.info.run_id


def confirmation_line(record: dict) -> str:
    """The study line of a confirmation record (confirm_sweep)."""
    if "confirmation" not in record:
        return (f"confirmation: the best trial {record['winner']} is the baseline ({record['baseline_params']}); "
                "nothing to confirm")
    s, c, seeds = record["search"], record["confirmation"], record["confirmation_seeds"]
    return (f"confirmation (trial {record['winner']} - baseline trial {record['baseline']}, {len(seeds)} fresh seeds "
            f"{', '.join(map(str, seeds))}): search estimate Δ {s['delta']:.4g} [{s['low']:.4g}, {s['high']:.4g}] → "
            f"confirmation Δ {c['delta']:.4g} [{c['low']:.4g}, {c['high']:.4g}], shrinkage {record['shrinkage']:.4g}")
