"""From MLflow to groups of seed runs: which runs a report rests on, how they group (config hash) and what each
group is called (the config keys that differ between groups), plus the numbers the statistics need."""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.columns import reduce_series
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.runs import client_for, experiment_runs, is_training_run, linked_evaluations, runs_by_id, seed_of

if TYPE_CHECKING:
    from mlflow.entities import Run

# flattened config keys that never name a group (the seed, where records go, the MLflow experiment)
NOT_LABELS = ("seed", "output_dir", "experiment")
NOT_LABEL_PREFIXES = ("tracking.",)
COMMAND = "rlvrlab.command"  # on a command study's seed runs (rlvrlab.sweep.command.COMMAND)
# what a run started from and where it ran (rlvrlab.tracking.tags): the SHA-256 of its initial weights, their source,
# "true" where a protocol's digest was overridden (the digest it expected), one tag per environment key
INITIAL_MODEL, INITIAL_MODEL_SOURCE = T.INITIAL_MODEL, T.INITIAL_MODEL_SOURCE
INITIAL_MODEL_OVERRIDE, INITIAL_MODEL_EXPECTED = T.INITIAL_MODEL_OVERRIDE, T.INITIAL_MODEL_EXPECTED
ENVIRONMENT = T.ENV_PREFIX  # + key: python, torch, transformers, numpy, device, cpu_capability, threads, ...


@dataclass
class SeedRun:
    run_id: str
    seed: int
    params: dict[str, str]
    git_sha: str
    status: str
    git_dirty: bool = False  # the run was trained from a tree with uncommitted changes (its git_dirty tag)
    dirty_known: bool = True  # a git_dirty tag says whether the tree was clean (MLflow's own git tag does not)
    initial_model: Optional[str] = None  # SHA-256 of the weights it started from (None: no digest tag)
    initial_model_source: Optional[str] = None  # where they came from, as tagged
    initial_model_expected: Optional[str] = None  # a protocol's digest this run overrode (its override tag)
    environment: dict[str, str] = field(default_factory=dict)  # its rlvrlab.env.* tags, key -> value
    duration_s: Optional[float] = None  # MLflow's end - start time of a finished run (rlvrlab plan's cost)


def identity(tags: dict[str, str]) -> dict:
    """A run's recorded identity from its tags, as SeedRun (and EvalRun) keyword arguments: its initial model's
    digest and source, the digest a protocol expected where the run overrode it, and its environment."""
    overridden = tags.get(INITIAL_MODEL_OVERRIDE) == "true"
    return {"initial_model": tags.get(INITIAL_MODEL) or None, "initial_model_source": tags.get(INITIAL_MODEL_SOURCE),
            "initial_model_expected": (tags.get(INITIAL_MODEL_EXPECTED) or "unknown") if overridden else None,
            "environment": {k[len(ENVIRONMENT):]: v for k, v in sorted(tags.items()) if k.startswith(ENVIRONMENT)}}


@dataclass
class Group:
    config_hash: str
    runs: list[SeedRun]
    label: str = ""
    values: dict[str, str] = field(default_factory=dict)  # the differing keys -> value
    failed: list[int] = field(default_factory=list)  # seeds whose run FAILED (diverged, crashed) with no FINISHED run
    failed_runs: list[SeedRun] = field(default_factory=list)  # those runs (events count them: rlvrlab.report.events)

    @property
    def seeds_text(self) -> str:
        """The seed count as tables show it: "10", or "8 (+2 failed)" so that a dropped failure is never hidden."""
        return f"{len(self.runs)}" + (f" (+{len(self.failed)} failed)" if self.failed else "")

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    @property
    def algorithm(self) -> str:
        return self.runs[0].params.get("algorithm.name", "?")


@dataclass
class Selection:
    """What a report rests on."""

    uri: str
    experiment: str  # the experiment (or study) the runs came from, or "runs"
    groups: list[Group]
    excluded: list[tuple[str, str]]  # (run id, why): unfinished or failed runs
    study: Optional[str] = None
    swept: list[str] = field(default_factory=list)  # a study's searched keys (for heatmaps)
    failed_only: list[str] = field(default_factory=list)  # configs none of whose seeds finished: "hash (alg, seeds)"
    all_groups: list[Group] = field(default_factory=list)  # groups with those configs too (labelled together)
    group_by: list[str] = field(default_factory=list)  # --group-by keys (rlvrlab.report.external); [] by config
    seed_key: str = "seed"  # the param or tag that holds a run's seed (--seed-key)


def select(uri: str, *, experiment: Optional[str] = None, study: Optional[str] = None,
           run_ids: Sequence[str] = (), only_changed: bool = True) -> Selection:
    """Training runs of an experiment, a sweep's seed runs, or the given runs (exactly one); FINISHED runs only."""
    client = client_for(uri)
    runs, source, swept, trial_params = _found(client, uri, experiment, study, run_ids)
    excluded = [(r.info.run_id, f"status {r.info.status}") for r in runs if r.info.status != "FINISHED"]
    all_runs, runs = runs, [r for r in runs if r.info.status == "FINISHED" and is_training_run(r)]
    if not runs:
        raise RlvrlabError(f"no finished training runs in {source!r} at {uri}"
                           + (f" ({len(excluded)} unfinished or failed)" if excluded else ""))
    by_hash: dict[str, list[SeedRun]] = defaultdict(list)
    for r in runs:
        by_hash[r.data.tags["config_hash"]].append(_seed_run(r))
    failed: dict[str, dict[int, SeedRun]] = defaultdict(dict)  # config hash -> seed -> its FAILED run
    for r in all_runs:
        if r.info.status == "FAILED" and "config_hash" in r.data.tags and is_training_run(r):
            failed[r.data.tags["config_hash"]][seed_of(r)] = _seed_run(r)
    every = []
    for h in [*by_hash, *(h for h in failed if h not in by_hash)]:
        finished, lost = sorted(by_hash.get(h, []), key=lambda m: m.seed), failed.get(h, {})
        seeds = sorted(lost.keys() - {m.seed for m in finished})
        every.append(Group(h, finished, failed=seeds, failed_runs=[lost[s] for s in seeds]))
    groups = [g for g in every if g.runs]
    algorithms = {r.data.tags["config_hash"]: r.data.params.get("algorithm.name", "?") for r in all_runs
                  if "config_hash" in r.data.tags}
    failed_only = [f"config {h} ({algorithms[h]}): all {len(seeds)} seeds FAILED"
                   for h, seeds in sorted(failed.items()) if h not in by_hash]
    _label_all(every, all_runs, only_changed, swept, trial_params)
    _check_same_dataset(groups)
    groups.sort(key=lambda g: g.label)
    every.sort(key=lambda g: g.label)
    return Selection(uri, source, groups, excluded, study=study, swept=swept, failed_only=failed_only,
                     all_groups=every)


def _found(client, uri: str, experiment: Optional[str], study: Optional[str],
           run_ids: Sequence[str]) -> tuple[list[Run], str, list[str], dict[str, dict[str, str]]]:
    """The runs asked for (a study's seed runs, an experiment's training runs, or the given ids), the source's name,
    and for a study its swept keys and each trial run's params (its swept values; `variant` with `variants:`)."""
    if run_ids:
        return runs_by_id(client, run_ids, uri=uri), "runs", [], {}
    name = study or experiment
    assert name is not None  # exactly one of experiment, study and run_ids (from_mlflow checks)
    runs = experiment_runs(client, name, uri=uri, what="study" if study else "experiment")
    if not study:
        return [r for r in runs if is_training_run(r)], name, [], {}
    study_runs = [r for r in runs if r.data.tags.get("rlvrlab.role") == "study"]
    if not study_runs:
        raise RlvrlabError(f"experiment {name!r} in {uri} has no sweep study run; use --experiment {name}")
    trial_params = {r.info.run_id: dict(r.data.params) for r in runs if r.data.tags.get("rlvrlab.role") == "trial"}
    return ([r for r in runs if r.data.tags.get("rlvrlab.role") == "seed"], name,
            _swept_keys(client, study_runs[0].info.run_id), trial_params)


def _seed_run(r: Run) -> SeedRun:
    tags = r.data.tags
    return SeedRun(r.info.run_id, seed_of(r), dict(r.data.params), tags.get("git_sha", "unknown"), r.info.status,
                   tags.get("git_dirty", "false") == "true", **identity(tags), duration_s=duration_of(r))


def duration_of(run: Run) -> Optional[float]:
    """Seconds from a run's start to its end as MLflow recorded them (None while it runs or without times)."""
    start, end = run.info.start_time, run.info.end_time
    return (end - start) / 1000 if start is not None and end is not None and end >= start else None


def _label_all(every: list[Group], all_runs: list[Run], only_changed: bool, swept: list[str],
               trial_params: dict[str, dict[str, str]]) -> None:
    """Every group's label from a seed run's params (a failed-only group's failed runs: it has no finished one): the
    config keys that differ, or a study's variants; a command study's (rlvrlab.sweep.command) from its trials'
    params, the runs' own being the other trainer's."""
    for g in every:
        if not g.runs:
            g.runs = g.failed_runs
    _label(every, only_changed, swept)
    parent = {r.info.run_id: r.data.tags.get("mlflow.parentRunId", "") for r in all_runs}
    variant_of = {run_id: params["variant"] for run_id, params in trial_params.items() if "variant" in params}
    if any(COMMAND in r.data.tags for r in all_runs):
        _label_variants(every, {run: variant_of.get(trial, "") for run, trial in parent.items()}, swept,
                        {run: trial_params.get(trial, {}) for run, trial in parent.items()})
    elif variant_of:
        _label_variants(every, {r.info.run_id: variant_of.get(parent[r.info.run_id], "?") for r in all_runs
                                if is_training_run(r)}, swept)
    for g in every:
        if g.runs is g.failed_runs:
            g.runs = []


def _swept_keys(client, study_run_id: str) -> list[str]:
    """The space keys of a study, in the order of its sweep file (kept as an artifact of the study run)."""
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        try:
            text = Path(client.download_artifacts(study_run_id, "sweep.yaml", tmp)).read_text()
        except Exception:
            return []
    space = (yaml.safe_load(text) or {}).get("space") or {}
    return [str(key) for key in space]


def _labelled_keys(params: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in params.items() if k not in NOT_LABELS and not k.startswith(NOT_LABEL_PREFIXES)}


def _label(groups: list[Group], only_changed: bool, first: Sequence[str] = ()) -> None:
    """`ucpo tau=0.2`: the algorithm name, then the keys whose values differ between groups (last dotted part);
    `first` (a study's swept keys, in file order) come first."""
    keys = sorted({k for g in groups for k in _labelled_keys(g.runs[0].params)},
                  key=lambda k: (list(first).index(k) if k in first else len(first), k))
    differing = [k for k in keys if len({g.runs[0].params.get(k) for g in groups}) > 1 and not _implied(k, groups)]
    shown = differing if only_changed else keys
    for g in groups:
        params = g.runs[0].params
        g.values = {k: params.get(k, "") for k in differing}
        parts = [g.algorithm] + [f"{_short(k, shown)}={params.get(k, '')}" for k in shown if k != "algorithm.name"]
        g.label = " ".join(parts)
    _distinct_labels(groups)


def _distinct_labels(groups: list[Group]) -> None:
    """Two configs that differ only in unlabelled keys keep distinct names: the config hash is appended."""
    labels = [g.label for g in groups]
    for g in groups:
        if labels.count(g.label) > 1:
            g.label = f"{g.label} [{g.config_hash[:6]}]"


def _label_variants(groups: list[Group], variant_of_run: dict[str, str], swept: Sequence[str],
                    params_of_run: Optional[dict[str, dict[str, str]]] = None) -> None:
    """A study with `variants:`: each group is named by its variant, then the other swept keys that differ
    (`dapo eps_high=inf staleness=4`); the variant's own overrides are in the CSV and sources.json. params_of_run:
    each seed run's swept values (a command study's, from its trial run), else its own params."""
    def params(g: Group) -> dict[str, str]:
        return g.runs[0].params if params_of_run is None else params_of_run.get(g.runs[0].run_id, {})

    others = [k for k in swept if k != "variant" and len({params(g).get(k) for g in groups}) > 1]
    for g in groups:
        variant = variant_of_run.get(g.runs[0].run_id, "?")
        g.values = {**({"variant": variant} if variant else {}), **{k: params(g).get(k, "") for k in others}}
        g.label = " ".join([variant] * bool(variant) + [f"{_short(k, others)}={g.values[k]}" for k in others]) \
            or f"config {g.config_hash[:6]}"  # a command study of one trial
    _distinct_labels(groups)


def _implied(key: str, groups: list[Group]) -> bool:
    """An algorithm.* key whose value the algorithm's name already fixes (grpo vs ucpo differ in estimator too)."""
    if not key.startswith("algorithm.") or key == "algorithm.name":
        return False
    by_name: dict[str, set] = defaultdict(set)
    for g in groups:
        by_name[g.algorithm].add(g.runs[0].params.get(key))
    return len(by_name) > 1 and all(len(values) == 1 for values in by_name.values())


def _short(key: str, keys: Sequence[str]) -> str:
    tail = key.rsplit(".", 1)[-1]
    return tail if sum(k.rsplit(".", 1)[-1] == tail for k in keys) == 1 else key


def _check_same_dataset(groups: list[Group]) -> None:
    datasets = {g.label: (g.runs[0].params.get("dataset.name"), g.runs[0].params.get("dataset.path")) for g in groups}
    if len(set(datasets.values())) > 1:
        shown = "; ".join(f"{label}: {name}{f' ({path})' if path not in (None, 'None') else ''}"
                          for label, (name, path) in datasets.items())
        raise RlvrlabError(f"the groups were trained on different datasets ({shown}); report them separately "
                           "(--runs or one experiment each)")


# ------------------------------------------------------------------------------------------------ training data
def metric_series(client, run_id: str, metric: str) -> dict[int, float]:
    """{step: value}, the last value logged at each step."""
    points = sorted(client.get_metric_history(run_id, metric), key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in points}


def available_metrics(client, selection: Selection) -> list[str]:
    names: set[str] = set()
    for g in selection.groups:
        names |= set(client.get_run(g.runs[0].run_id).data.metrics)
    return sorted(names)


def final_values(client, group: Group, metric: str, last: int, reduce: str) -> np.ndarray:
    """[S]: per seed run, its metric history reduced over its last `last` logged steps (rlvrlab.report.columns.
    reduce_series: mean, max, min, or auc, the trapezoid area over the steps' span)."""
    values = []
    for run in group.runs:
        series = metric_series(client, run.run_id, metric)
        if not series:
            raise RlvrlabError(f"run {run.run_id} ({group.label}, seed {run.seed}) has no metric {metric!r}")
        values.append(reduce_series(series, last, reduce))
    return np.asarray(values, dtype=np.float64)


def curves(client, group: Group, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps [T], values [S, T]) over the steps every seed logged."""
    series = [metric_series(client, run.run_id, metric) for run in group.runs]
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    return np.asarray(steps), np.asarray([[s[t] for t in steps] for s in series], dtype=np.float64)


# -------------------------------------------------------------------------------------------------- evaluations
@dataclass
class EvalRun:
    """An evaluation run a report used: its commit, whether its tree was dirty (None: no git_dirty tag), the
    digest of the weights it evaluated and its environment (their tags, as on training runs)."""

    run_id: str
    git_sha: str
    git_dirty: Optional[bool]
    initial_model: Optional[str] = None
    initial_model_source: Optional[str] = None
    initial_model_expected: Optional[str] = None
    environment: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, run: Run) -> EvalRun:
        tags = run.data.tags
        sha = tags.get("git_sha") or tags.get("mlflow.source.git.commit") or "unknown"
        dirty = tags["git_dirty"] == "true" if "git_dirty" in tags else None
        return cls(run.info.run_id, sha, dirty, **identity(tags))

    def as_dict(self) -> dict:
        """sources.json's entry for it."""
        return {"run_id": self.run_id, "git_sha": self.git_sha, "git_dirty": self.git_dirty,
                "initial_model": self.initial_model}


@dataclass
class EvalRecords:
    """Per group and dataset: problem ids and a [S, P] matrix per statistic (seeds in the group's order)."""

    datasets: dict[str, list[str]]  # dataset -> problem ids (common to every group)
    matrices: dict[tuple[str, str, str], np.ndarray]  # (group label, dataset, statistic) -> [S, P]
    eval_runs: dict[str, list[EvalRun]]  # group label -> the eval runs used (seeds in the group's order)
    statistics: list[str]  # avg@n, pass@k..., maj@k..., diversity, distinct@k..., rarefied@m (with form counts)
    # dataset -> group label -> [seed][problem]: the records themselves (rlvrlab.report.passk_curve's curves)
    records: dict[str, dict[str, list[list[dict]]]] = field(default_factory=dict)


def eval_records(client, selection: Selection, *, rarefy: int = 4) -> Optional[EvalRecords]:
    """The finished `rlvrlab eval pass-at-k` run of each seed run (linked by the training run's rlvrlab.eval.* tags;
    the newest checkpoint's, then the newest); None when no seed run has one. Every seed of every group must have
    one, on the same problems. Records with per-form counts of the correct responses (`correct_forms`) also give
    distinct@k (expected distinct correct forms in k samples) and rarefied@<rarefy> (expected distinct correct
    forms in `rarefy` correct responses; NaN for problems with fewer correct ones)."""
    found: dict[str, Run] = {}
    for g in selection.groups:
        for r in g.runs:
            candidates = linked_evaluations(client, r.run_id)
            if candidates:  # the newest checkpoint, then the newest evaluation of it
                found[r.run_id] = max(candidates, key=lambda c: (int(c.data.tags.get("rlvrlab.checkpoint_step") or 0),
                                                                 c.info.start_time))
    members = [(g, r) for g in selection.groups for r in g.runs]
    if not any(r.run_id in found for _, r in members):
        return None
    missing = [f"{g.label} seed {r.seed}" for g, r in members if r.run_id not in found]
    if missing:
        raise RlvrlabError(f"{len(missing)} seed runs have no finished evaluation ({', '.join(missing[:4])}"
                           f"{', ...' if len(missing) > 4 else ''}); evaluate them with rlvrlab eval pass-at-k --study "
                           "NAME or --runs-of EXPERIMENT (or --run RUN_ID), or report training metrics only "
                           "with --no-eval")
    per_run: dict[str, dict[tuple[str, str], dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _, r in members:
            path = client.download_artifacts(found[r.run_id].info.run_id, "eval/records.jsonl", tmp)
            rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
            per_run[r.run_id] = {(row["dataset"], str(row["id"])): row for row in rows}
    keys = [set(rows) for rows in per_run.values()]
    common = set.intersection(*keys)
    if any(k != common for k in keys):
        raise RlvrlabError("the evaluations were made on different problems (datasets, splits or sizes differ); "
                           "evaluate every run on the same dataset and split")
    datasets: dict[str, list[str]] = defaultdict(list)
    for dataset, pid in sorted(common):
        datasets[dataset].append(pid)
    sample = next(iter(per_run.values()))[next(iter(common))]
    statistics = [k for k in sample if k == "avg@n" or k.startswith(("pass@", "maj@"))] + ["diversity"]
    ks = [int(k.split("@")[1]) for k in statistics if k.startswith("pass@")]
    with_forms = all("correct_forms" in row for rows in per_run.values() for row in rows.values())
    derived = ([f"distinct@{k}" for k in ks] + [f"rarefied@{rarefy}"]) if with_forms else []
    matrices = {}
    for g in selection.groups:
        for dataset, ids in datasets.items():
            for stat in statistics + derived:
                matrices[(g.label, dataset, stat)] = np.asarray(
                    [[_statistic(per_run[r.run_id][(dataset, pid)], stat) for pid in ids] for r in g.runs])
    statistics += derived
    records = {dataset: {g.label: [[per_run[r.run_id][(dataset, pid)] for pid in ids] for r in g.runs]
                         for g in selection.groups} for dataset, ids in datasets.items()}
    return EvalRecords(dict(datasets), matrices, {g.label: [EvalRun.of(found[r.run_id]) for r in g.runs]
                                                  for g in selection.groups}, statistics, records)


def _statistic(row: dict, stat: str) -> float:
    from rlvrlab.stats import expected_distinct, rarefied_distinct

    if stat.startswith("distinct@"):
        return expected_distinct(row["correct_forms"], int(row["n"]), int(stat.split("@")[1]))
    if stat.startswith("rarefied@"):
        return _number(rarefied_distinct(row["correct_forms"], int(stat.split("@")[1])))
    return _number(row.get(stat))


def _number(value) -> float:
    return float("nan") if value is None else float(value)
