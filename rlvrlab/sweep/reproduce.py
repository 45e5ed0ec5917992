"""`rlvrlab reproduce FOLDER --seeds N`: re-run N seeds of a committed study folder (results/<name>/ as `rlvrlab
report` wrote it) and say, per seed, per group and per comparison, whether the re-run lands inside the committed
intervals, and which recorded identity (commit, initial model, environment, configuration) differs.

Each group's configuration is the study's sweep file (found by the study name of sources.json, or --sweep) at the
group's trial params, turned into a run config by the sweep's own SweepSpec.overrides_for; each seed run is the
call a sweep's in-process seed run makes (rlvrlab.train.loop.train). Values are read as the report read them: the
recorded command's --metric/--last/--reduce (rlvrlab.report.columns.parse_metrics) over each run's logged steps
(rlvrlab.report.collect.final_values). docs/reproducibility.md says what "inside" can and cannot mean."""

from __future__ import annotations

import contextlib
import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from rlvrlab.config import compose
from rlvrlab.config.compose import yaml_and_tree
from rlvrlab.config.yamlfile import load as load_yaml
from rlvrlab.errors import RlvrlabError, StorageError
from rlvrlab.report import collect
from rlvrlab.report.columns import MetricSpec, parse_metrics
from rlvrlab.sweep import at_commit
from rlvrlab.sweep.space import VARIANT
from rlvrlab.sweep.spec import SweepSpec, load_sweep, sweeps_dir
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.provenance import flatten, git_state
from rlvrlab.tracking.store import store

TRAIN = "train"  # the per_seed.csv / table.csv section of training metrics (the only one a re-run recomputes)
ROLE = "reproduce"  # the rlvrlab.role tag of a re-run's seed runs
FEW_GROUPS = 2  # a folder without comparisons re-runs all its groups


class InputError(RlvrlabError):
    """A folder, group, seed count or sweep file `rlvrlab reproduce` cannot work from (exit code 2)."""


@dataclass(frozen=True)
class Request:
    folder: Path
    seeds: int
    groups: tuple[str, ...] = ()
    output_dir: Path = Path("runs") / "reproduce"
    sweep: Optional[Path] = None  # the study's sweep file; default: the one in sweeps/ named like the study
    at_recorded_commit: bool = False  # run the seeds with the recorded commit's code (rlvrlab.sweep.at_commit)


@dataclass
class Committed:
    """What a study folder holds: sources.json, per-seed values and intervals of its training metrics."""

    folder: Path
    sources: dict
    specs: list[MetricSpec]
    per_seed: dict[tuple[str, str], dict[int, float]]  # (group, metric label) -> seed -> value
    intervals: dict[tuple[str, str], tuple[float, float, float, int]]  # (group, metric) -> mean, low, high, seeds
    comparisons: list[dict[str, str]]  # comparisons.csv rows of the training section


@dataclass
class SeedRow:
    group: str
    metric: str
    seed: int
    committed: Optional[float]
    rerun: Optional[float]  # None: the re-run failed (reason in `failed`)
    low: float
    high: float
    failed: str = ""

    @property
    def difference(self) -> Optional[float]:
        return None if self.committed is None or self.rerun is None else abs(self.rerun - self.committed)

    @property
    def status(self) -> str:
        """inside | OUTSIDE (counts) | outside, as committed (the committed value of this seed was outside the
        interval of the mean too: not counted) | run failed (counts)."""
        if self.rerun is None or not math.isfinite(self.rerun):
            return "run failed" if self.rerun is None else "OUTSIDE (non-finite)"
        if self.low <= self.rerun <= self.high:
            return "inside"
        if self.committed is not None and not self.low <= self.committed <= self.high:
            return "outside, as committed"
        return "OUTSIDE"

    @property
    def counts_against(self) -> bool:
        return self.status not in ("inside", "outside, as committed")


@dataclass
class GroupRow:
    group: str
    metric: str
    mean: float
    low: float
    high: float
    n_committed: int
    committed_mean: Optional[float]  # the committed values of the re-run seeds
    rerun_mean: Optional[float]

    @property
    def inside(self) -> Optional[bool]:
        return None if self.rerun_mean is None else self.low <= self.rerun_mean <= self.high


@dataclass
class ComparisonRow:
    a: str
    b: str
    metric: str
    delta: float
    low: float
    high: float
    rerun_delta: Optional[float]  # mean over the re-run seeds of a - b (paired by seed)
    n: int

    @property
    def inside(self) -> Optional[bool]:
        return None if self.rerun_delta is None else self.low <= self.rerun_delta <= self.high


@dataclass
class Identity:
    what: str  # commit | dirty | initial model | environment KEY | config hash GROUP
    committed: str
    rerun: str
    verdict: str  # same | differs | not recorded


@dataclass
class Outcome:
    folder: Path
    study: str
    sweep_file: Path
    seeds: tuple[int, ...]
    committed_seeds: int  # the fewest seeds a re-run group had in the committed study
    output_dir: Path
    checkout: tuple[str, bool]  # (commit, dirty) of the code that re-ran
    recorded_commits: list[str]
    rows: list[SeedRow] = field(default_factory=list)
    groups: list[GroupRow] = field(default_factory=list)
    comparisons: list[ComparisonRow] = field(default_factory=list)
    identities: list[Identity] = field(default_factory=list)
    run_ids: dict[tuple[str, int], str] = field(default_factory=dict)  # (group, seed) -> re-run MLflow run
    at_commit: Optional[str] = None  # the recorded commit whose code re-ran (--at-recorded-commit)
    tags_of: dict[tuple[str, int], dict[str, str]] = field(default_factory=dict)  # (group, seed) -> re-run tags

    @property
    def exit_code(self) -> int:
        """0: every re-run value inside its committed interval (or outside where its committed value was too);
        1: any other."""
        return 1 if any(row.counts_against for row in self.rows) else 0

    def footer(self) -> list[str]:
        n, s = len(self.seeds), self.committed_seeds
        return [
            f"What 'inside' means here: each committed interval is a 95% Student-t interval for a group's MEAN over "
            f"its {s} committed seeds, not a range for one seed. A single seed's value lies outside it often even when "
            "nothing changed; so a re-run seed counts against the exit code only where the committed value of the "
            "same seed was inside. The re-run mean and re-run delta over "
            f"{n} seed{'s' * (n != 1)}{' (fewer than the study had)' if n < s else ''} carry more noise than the "
            "committed ones: landing inside is consistent with the study, not a confirmation of it, and landing "
            "outside with few seeds is weak evidence against it.",
            "Bit-identical values (difference 0) are expected only on the same machine, environment and thread count "
            "from the same initial model; another machine moves per-seed values (docs/reproducibility.md). Only "
            "training metrics are re-run; evaluation columns (rlvrlab eval) are not.",
        ]


# ------------------------------------------------------------------------------------------------ the folder
def load_sources(folder: Path) -> dict:
    """sources.json of a report folder of a study; InputError when the folder is none."""
    import json

    folder = Path(folder)
    if not (folder / "sources.json").is_file():
        raise InputError(f"{folder} has no sources.json; pass a study folder written by `rlvrlab report` "
                         "(e.g. results/ucpo_pairs)")
    try:
        sources = json.loads((folder / "sources.json").read_text(encoding="utf-8"))
    except ValueError as error:
        raise InputError(f"{folder / 'sources.json'} is not JSON ({error}); restore it from git") from None
    for name in ("per_seed.csv", "table.csv"):
        if not (folder / name).is_file():
            raise InputError(f"{folder} has no {name}; re-write the folder with `rlvrlab report --format csv`")
    if not isinstance(sources, dict) or not sources.get("study") or not sources.get("groups"):
        raise InputError(f"{folder / 'sources.json'} names no study with groups (its runs were not a sweep's); "
                         "rlvrlab reproduce re-runs a study's seeds: pass the folder of an `rlvrlab report --study` "
                         "report")
    return sources


def load_committed(folder: Path, sources: dict, specs: list[MetricSpec]) -> Committed:
    """The folder's per-seed values, group intervals and comparisons of the training metrics `specs`."""
    folder = Path(folder)
    labels = {s.label for s in specs}
    per_seed: dict[tuple[str, str], dict[int, float]] = {}
    for row in _rows(folder / "per_seed.csv"):
        if row.get("section") == TRAIN and row.get("metric") in labels:
            per_seed.setdefault((row["group"], row["metric"]), {})[int(row["seed"])] = float(row["value"])
    intervals = {}
    for row in _rows(folder / "table.csv"):
        key = (row.get("group", ""), row.get("metric", ""))
        if row.get("section") == TRAIN and key[1] in labels and key not in intervals:
            intervals[key] = (float(row["mean"]), float(row["low"]), float(row["high"]), int(row["n_seeds"] or 0))
    comparisons = [r for r in _rows(folder / "comparisons.csv") if r.get("section") == TRAIN
                   and r.get("metric") in labels] if (folder / "comparisons.csv").is_file() else []
    return Committed(folder, sources, specs, per_seed, intervals, comparisons)


def recorded_metrics(command: Sequence[str], default: str, window: int) -> list[MetricSpec]:
    """The report command's --metric/--last/--reduce as the report parsed them; else, as the report did, the
    study's objective metric (`default`) over its window."""
    metric, last, reduce = [], None, "mean"
    args = list(command)
    for index, arg in enumerate(args):
        name, equals, inline = arg.partition("=")
        value = inline if equals else (args[index + 1] if index + 1 < len(args) else "")
        if name == "--metric":
            metric.append(value)
        elif name == "--last":
            last = int(value)
        elif name == "--reduce":
            reduce = value
    return parse_metrics(metric or [default], reduce=reduce, last=last or window)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# ------------------------------------------------------------------------------------------------ the sweep
def find_sweep(study: str, given: Optional[Path]) -> SweepSpec:
    """The study's sweep file: `given`, else the file of sweeps/ whose `name:` (or file name) is the study."""
    if given is not None:
        if not Path(given).is_file():
            raise InputError(f"--sweep {given} does not exist; pass the sweep file of study {study!r}")
        spec = load_sweep(str(given))
        if spec.name != study:
            raise InputError(f"--sweep {given} is study {spec.name!r}, the folder's is {study!r}; pass the sweep "
                             f"file of study {study!r}")
        return spec
    folder = sweeps_dir()
    for path in sorted(folder.rglob("*.yaml")):
        try:
            body = load_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
        except (RlvrlabError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(body, dict) and (body.get("name") or path.stem) == study:
            return load_sweep(str(path))
    raise InputError(f"no sweep file in {folder} names study {study!r}; pass --sweep FILE (the sweep file the "
                     "study ran) or set RLVRLAB_SWEEPS_DIR to its folder")


def trial_params(spec: SweepSpec, group: dict) -> tuple[dict[str, Any], str]:
    """The trial params whose config is the group's: the grid point with the group's config hash, else the one
    whose composed config agrees with every recorded group value (the hash then differs: returned second)."""
    if spec.runner.no_reproduce:
        raise InputError(f"study {spec.name!r}: {spec.runner.no_reproduce}")
    values = {k: str(v) for k, v in (group.get("values") or {}).items()}
    if spec.sampler == "grid":
        candidates = spec.grid()
    elif all(p.key in values for p in spec.space):
        candidates = [{p.key: yaml.safe_load(values[p.key]) for p in spec.space}]
    else:
        candidates = []
    hashes = [spec.trial_hash(params) for params in candidates]
    for params, chash in zip(candidates, hashes):
        if chash == group.get("config_hash"):
            return params, chash
    agree = [(params, chash) for params, chash in zip(candidates, hashes) if _agrees(spec, params, values)]
    if len(agree) != 1:
        raise InputError(f"group {group.get('label')!r} (config {group.get('config_hash')}, values {values}) is "
                         f"{'none' if not agree else 'more than one'} of the trials of sweep {spec.file}; pass "
                         "--sweep FILE with the sweep file the study ran")
    return agree[0]


def _agrees(spec: SweepSpec, params: dict[str, Any], values: dict[str, str]) -> bool:
    flat = {k: str(v) for k, v in flatten(yaml_and_tree(compose(spec.experiment, spec.overrides_for(
        params, spec.seeds[0])))[1]).items()}
    return all((params.get(VARIANT) == value) if key == VARIANT else flat.get(key) == value
               for key, value in values.items())


# ------------------------------------------------------------------------------------------------ reproduce
def reproduce(request: Request, on_run: Optional[Callable[[str, int, int, int], None]] = None) -> Outcome:
    """Re-run `request.seeds` seeds of each chosen group and compare them with the folder; every input is checked
    (InputError) before the first run. on_run(group, seed, done, total) before each seed run."""
    sources = load_sources(request.folder)
    spec = find_sweep(sources["study"], request.sweep)
    specs = recorded_metrics(list(sources.get("command") or ()), spec.objective.metric, spec.objective.window)
    committed = load_committed(request.folder, sources, specs)
    groups = {g["label"]: g for g in sources["groups"]}
    chosen = chosen_groups(request.groups, groups, committed)
    seeds = chosen_seeds(request.seeds, {label: groups[label] for label in chosen})
    plans = {label: trial_params(spec, groups[label]) for label in chosen}
    sha, dirty, _ = git_state()
    runs = [r for label in chosen for r in groups[label]["runs"] if int(r["seed"]) in seeds]
    recorded = at_commit.commit_of([r.get("git_sha") or "unknown" for r in runs], InputError) \
        if request.at_recorded_commit else None
    outcome = Outcome(committed.folder, spec.name, spec.file, seeds,
                      min(len(groups[label]["runs"]) for label in chosen), Path(request.output_dir), (sha, dirty),
                      sorted({r.get("git_sha") or "unknown" for r in runs}), at_commit=recorded)
    client = collect.client_for(store(request.output_dir).uri)
    with contextlib.ExitStack() as stack:
        code = stack.enter_context(at_commit.checkout(recorded)) if recorded else None
        _run_all(outcome, committed, spec, chosen, plans, groups, code, client, on_run)
    outcome.identities = identities(sources, {label: groups[label] for label in chosen}, seeds, plans,
                                    outcome.tags_of)
    return outcome


def _run_all(outcome: Outcome, committed: Committed, spec: SweepSpec, chosen: list[str], plans: dict,
             groups: dict[str, dict], code: Optional[Path], client: Any,
             on_run: Optional[Callable[[str, int, int, int], None]] = None) -> None:
    seeds, specs = outcome.seeds, committed.specs
    values: dict[tuple[str, str], dict[int, float]] = {}
    failures: dict[tuple[str, int], str] = {}
    total = len(chosen) * len(seeds)
    for index, (label, seed) in enumerate((label, seed) for label in chosen for seed in seeds):
        if on_run is not None:
            on_run(label, seed, index, total)
        run_id, why = seed_run(spec, plans[label][0], seed, outcome.output_dir, code, client)
        if run_id is None:
            failures[(label, seed)] = why
            continue
        outcome.run_ids[(label, seed)] = run_id
        outcome.tags_of[(label, seed)] = dict(client.get_run(run_id).data.tags)
        one = collect.Group(config_hash=groups[label]["config_hash"], label=label, runs=[collect.SeedRun(
            run_id=run_id, seed=seed, params={}, git_sha="", status="FINISHED")])
        for m in specs:
            values.setdefault((label, m.label), {})[seed] = float(
                collect.final_values(client, one, m.name, m.last, m.reduce)[0])
    compare(outcome, committed, chosen, values, failures)


def chosen_groups(asked: Sequence[str], groups: dict[str, dict], committed: Committed) -> list[str]:
    """--groups, else the groups of the folder's comparisons (all groups when it has none), in the folder's order."""
    if asked:
        for label in asked:
            if label not in groups:
                raise InputError(f"--groups: no group {label!r} in {committed.folder}; its groups are "
                                 f"{', '.join(repr(g) for g in groups)}")
        return [label for label in groups if label in asked]
    compared = {row[side] for row in committed.comparisons for side in ("a", "b")}
    wanted = [label for label in groups if label in compared]
    return wanted if len(wanted) >= FEW_GROUPS else list(groups)


def chosen_seeds(count: int, groups: dict[str, dict]) -> tuple[int, ...]:
    """The first `count` seeds that every chosen group ran (paired seeds keep comparisons paired)."""
    if count < 1:
        raise InputError(f"--seeds {count}: give a number of seeds >= 1")
    common = sorted(set.intersection(*({int(r["seed"]) for r in g["runs"]} for g in groups.values())))
    if count > len(common):
        raise InputError(f"--seeds {count}: the groups {', '.join(repr(g) for g in groups)} share {len(common)} "
                         f"committed seeds ({' '.join(map(str, common))}); give --seeds {len(common)} or fewer")
    return tuple(common[:count])


def seed_run(spec: SweepSpec, params: dict[str, Any], seed: int, output_dir: Path, code: Optional[Path] = None,
             client: Any = None) -> tuple[Optional[str], str]:
    """One seed run with its trial's overrides (SweepSpec.overrides_for), recorded under output_dir in the MLflow
    experiment <study>-reproduce, as a sweep's in-process seed run makes it (rlvrlab.train.loop.train), or with the
    code at `code` as its child seed run (rlvrlab.sweep.at_commit): (run id, "") or (None, why it failed)."""
    from rlvrlab.train.loop import train  # torch: only where a run trains

    experiment = f"{spec.name}-reproduce"
    overrides = [*spec.overrides_for(params, seed), f"output_dir={Path(output_dir).resolve()}",
                 f"experiment={experiment}"]
    if code is not None:
        return at_commit.seed_run(code, spec, overrides, client, experiment, seed)
    cfg = compose(spec.experiment, overrides)
    try:
        return train(cfg, tags={T.ROLE: ROLE}), ""
    except StorageError:
        raise
    except RlvrlabError as error:  # a diverged or failed run: a row that did not land
        return None, str(error)


def compare(outcome: Outcome, committed: Committed, chosen: list[str],
            values: dict[tuple[str, str], dict[int, float]], failures: dict[tuple[str, int], str]) -> None:
    """Seed rows, group rows and comparison rows of the outcome."""
    for label in chosen:
        for m in committed.specs:
            key = (label, m.label)
            if key not in committed.intervals:
                raise InputError(f"{committed.folder / 'table.csv'} has no interval for group {label!r}, metric "
                                 f"{m.label!r}; re-write the folder with `rlvrlab report`")
            mean, low, high, n = committed.intervals[key]
            mine, theirs = values.get(key, {}), committed.per_seed.get(key, {})
            for seed in outcome.seeds:
                outcome.rows.append(SeedRow(label, m.label, seed, theirs.get(seed), mine.get(seed), low, high,
                                            failures.get((label, seed), "")))
            ran = [mine[s] for s in outcome.seeds if mine.get(s) is not None]
            kept = [theirs[s] for s in outcome.seeds if s in theirs]
            outcome.groups.append(GroupRow(label, m.label, mean, low, high, n,
                                           sum(kept) / len(kept) if kept else None,
                                           sum(ran) / len(ran) if len(ran) == len(outcome.seeds) else None))
    for row in committed.comparisons:
        a, b, metric = row["a"], row["b"], row["metric"]
        if a not in chosen or b not in chosen:
            continue
        one, two = values.get((a, metric), {}), values.get((b, metric), {})
        paired = [one[s] - two[s] for s in outcome.seeds if one.get(s) is not None and two.get(s) is not None]
        outcome.comparisons.append(ComparisonRow(
            a, b, metric, float(row["delta"]), float(row["low"]), float(row["high"]),
            sum(paired) / len(paired) if paired and len(paired) == len(outcome.seeds) else None, len(paired)))


def identities(sources: dict, groups: dict[str, dict], seeds: Sequence[int], plans: dict[str, tuple[dict, str]],
               tags_of: dict[tuple[str, int], dict[str, str]]) -> list[Identity]:
    """Which recorded identity differs between the committed runs of the re-run seeds and the re-runs: commit,
    dirty flag, initial-model digest (paired by group and seed), each environment key, each group's config hash."""
    runs = {(label, int(r["seed"])): r for label, g in groups.items() for r in g["runs"] if int(r["seed"]) in seeds}
    rerun = {key: collect.identity(tags) for key, tags in tags_of.items()}
    out = []

    def row(what: str, mine: set, theirs: set, recorded: bool = True) -> None:
        verdict = "not recorded" if not recorded else "same" if mine == theirs else "differs"
        out.append(Identity(what, _shown(theirs) if recorded else "not recorded", _shown(mine), verdict))

    row("commit", {tags.get(T.GIT_SHA, "unknown") for tags in tags_of.values()},
        {r.get("git_sha") or "unknown" for r in runs.values()})
    row("dirty tree", {tags.get(T.GIT_DIRTY, "unknown") for tags in tags_of.values()},
        {str(r.get("git_dirty")).lower() for r in runs.values()}, all("git_dirty" in r for r in runs.values()))
    committed_digests = {key: r.get("initial_model") for key, r in runs.items()}
    recorded = all(committed_digests.values())
    compared = [key for key in rerun if recorded and rerun[key]["initial_model"]]  # both sides have a digest
    differing = [key for key in compared if committed_digests.get(key) != rerun[key]["initial_model"]]
    out.append(Identity(
        "initial model sha256",
        ", ".join(sorted({d[:12] for d in committed_digests.values() if d})) if recorded else "not recorded",
        ", ".join(sorted({(i["initial_model"] or "not recorded")[:12] for i in rerun.values()})) or "-",
        f"differs ({len(differing)} of {len(compared)} runs)" if differing else "same" if compared and
        len(compared) == len(rerun) else "not recorded"))
    block = sources.get("environment") or {}
    environments = [e.get("environment", {}) for e in block.get("environments", [])] if isinstance(block, dict) else []
    mine_env = [i["environment"] for i in rerun.values()]
    recorded = bool(environments)  # the environments the committed runs recorded (a folder may hold some)
    for key in sorted({k for e in [*environments, *mine_env] for k in e}):
        row(f"environment {key}", {e.get(key, "-") for e in mine_env}, {e.get(key, "-") for e in environments},
            recorded)
    for label, (_, chash) in plans.items():
        row(f"config hash {label}", {tags_of[key].get(T.CONFIG_HASH, chash) for key in tags_of if key[0] == label},
            {groups[label].get("config_hash", "")})
    return out


def _shown(values: set) -> str:
    return ", ".join(sorted(values)) or "-"
