"""Sweep files: what a study searches over, with how many seeds, for which objective. Parsed and validated once,
before any storage is opened or run started; every mistake is one ConfigError line. The keys, with an annotated
example: docs/sweeps.md, "Sweep files" (confirm: "Confirmation on fresh seeds"; pruner sequential: "Sequential
seeds"; launcher and slurm: "Launchers: where a seed run runs"; command: "Sweeping another trainer's command").
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import yaml

from rlvrlab.config.compose import folder_given
from rlvrlab.config.ranges import RANGES
from rlvrlab.config.rules import unknown
from rlvrlab.config.shipped import shipped_dir
from rlvrlab.config.yamlfile import load as load_yaml
from rlvrlab.errors import ConfigError
from rlvrlab.stats.sequential import MIN_LOOK
from rlvrlab.sweep import limits as seed_limits
from rlvrlab.sweep.confirmation import Confirm, check_sequential, parse_confirm
from rlvrlab.sweep.engines import launcher_for
from rlvrlab.sweep.fingerprint import fingerprint as fingerprint_of
from rlvrlab.sweep.objective import AGGREGATES, DIRECTIONS, MEAN, Objective
from rlvrlab.sweep.runner import NO_STEPS, SEQUENTIAL, SeedRunner, seed_runner
from rlvrlab.sweep.seeds import MIN_INITIAL, AdaptiveSeeds
from rlvrlab.sweep.space import FIXED_KEYS, VARIANT, Param, format_value, parse_space, parse_variants
from rlvrlab.sweep.template import SEED, STUDY, parse_command, variant_values
from rlvrlab.tracking.testbed import Testbed

SAMPLERS = ("grid", "tpe", "random")
PRUNERS = ("none", "median", "hyperband", SEQUENTIAL)
TOP_KEYS = ("name", "experiment", "command", "overrides", "variants", "sampler", "sampler_seed", "seeds", "space",
            "objective", "budget", "pruner", "confirm", "launcher", "slurm", *seed_limits.KEYS,
            "watch")  # watch: sweep/guard.py
LAUNCHERS = ("inprocess", "process", "slurm")
SLURM_KEYS = ("partition", "nodes", "gpus_per_node", "cpus_per_task", "time", "account", "cluster")
SLURM_CLUSTERS = ("slurm", "local")  # local: submitit's local executor, the same job path on this machine
LOG_LAST = "tracking.log_last"  # set by the sweep to the objective's window (SweepSpec.overrides_for)
MAX_SEEDS = 10_000  # seeds of one trial, each a training run; a count is expanded to a list (5e9 was a MemoryError)
MAX_SEED = int(RANGES["seed"].high)  # what the config accepts as a run's seed


@dataclasses.dataclass(frozen=True)
class Pruner:
    type: str = "none"
    warmup_steps: int = 0  # per seed run: steps before a trial may be pruned
    startup_trials: int = 5  # trials that finish before pruning starts (median)
    delta: Optional[float] = None  # sequential: the least gain over the incumbent worth finding (objective units)
    n_min: int = MIN_LOOK  # sequential: seeds before the first look (rlvrlab.stats.sequential)


@dataclasses.dataclass(frozen=True)
class Slurm:
    """`slurm:` of a sweep file (or `--slurm KEY=VALUE`): the job each sweep worker runs in (submitit)."""

    partition: Optional[str] = None
    nodes: int = 1  # nodes per worker job (one, until a seed run spans a job's nodes)
    gpus_per_node: int = 0
    cpus_per_task: Optional[int] = None
    time: int = 60  # minutes per worker job; a job that runs out is a dead worker (its trial is retried)
    account: Optional[str] = None
    cluster: str = "slurm"  # slurm | local (submitit's local executor: the same pickled job path, no sbatch)


@dataclasses.dataclass(frozen=True)
class Launcher:
    """How each seed run runs: in the worker's process (the toy default), as a child `rlvrlab train` process
    (`torchrun` with `nproc` ranks when nproc > 1), or (slurm) as such a child inside worker jobs on a cluster.
    gpus_per_run: each worker of one machine owns that many GPUs (rlvrlab.sweep.placement); 0: no placement."""

    type: str = "inprocess"
    nproc: int = 1
    gpus_per_run: int = 0
    slurm: Slurm = dataclasses.field(default_factory=Slurm)
    limits: seed_limits.Limits = dataclasses.field(default_factory=seed_limits.Limits)  # seed_timeout, ...

    @property
    def child(self) -> bool:
        """Seed runs are child processes (process, and slurm's workers)."""
        return self.type != "inprocess"


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    name: str
    file: Path
    experiment: Optional[str]
    overrides: tuple[str, ...]  # the file's overrides, then the command line's
    space: tuple[Param, ...]
    sampler: str
    sampler_seed: int
    seeds: tuple[int, ...]
    objective: Objective
    trials: Optional[int]
    timeout: Optional[float]
    pruner: Pruner
    variants: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # name -> overrides
    adaptive: Optional[AdaptiveSeeds] = None  # seeds: {initial, max, halfwidth}; then seeds = 0..initial-1
    launcher: Launcher = dataclasses.field(default_factory=Launcher)  # not in the fingerprint: how, not what
    command: Optional[str] = None  # a command sweep's template (rlvrlab.sweep.template); then experiment is None
    testbed: Optional[Testbed] = None  # --protocol: each seed run's initial model is checked; not in the fingerprint
    confirm: Optional[Confirm] = None  # confirm: fresh seeds for the winner and the baseline (sweep/confirmation.py)

    @property
    def runner(self) -> SeedRunner:
        """What runs its seed runs: rlvrlab's training, or (`command:`) another trainer's command."""
        return seed_runner(self.command)

    @property
    def max_seeds(self) -> int:
        return self.adaptive.max if self.adaptive else len(self.seeds)

    def seed_list(self, count: int) -> tuple[int, ...]:
        """The first `count` seeds of a trial: the fixed list, or (adaptive) 0..count-1, the same in every trial."""
        return tuple(range(count)) if self.adaptive else self.seeds[:count]

    def grid(self) -> list[dict[str, Any]]:
        """Every grid point, in file order (the last key varies fastest)."""
        keys = [p.key for p in self.space]
        return [dict(zip(keys, combo)) for combo in itertools.product(*(p.listed for p in self.space))]

    def total_trials(self) -> Optional[int]:
        return len(self.grid()) if self.sampler == "grid" else self.trials

    def overrides_for(self, params: dict[str, Any], seed: int) -> list[str]:
        """A seed run's overrides. Each of the objective window's steps is logged (tracking.log_last, first so that
        the file may ask for more), so the objective reads the same steps at every tracking.log_every. A command
        sweep's are where its records go (output_dir, tracking.*): its values go to the command (command_values)."""
        params = self.runner.searched(params)
        chosen = [o for key, value in params.items() if key == VARIANT for o in self.variants[value]]
        return [f"{LOG_LAST}={self.objective.window}", *self.overrides, *chosen,
                *(f"{key}={format_value(value)}" for key, value in params.items() if key != VARIANT),
                f"seed={seed}", f"experiment={self.name}"]

    def base(self) -> Any:
        """The config of its seed runs at no trial's values (a command sweep's: where their records go)."""
        from rlvrlab.config import compose

        return compose(self.experiment, self.overrides_for({}, self.seeds[0]))

    def command_values(self, params: dict[str, Any], seed: int) -> dict[str, str]:
        """A command sweep's placeholder values at a trial's params: its variant's name=value entries (and its name
        as {variant}), the space's values as overrides write them, the seed and the study's name."""
        values: dict[str, str] = {}
        for key, value in params.items():
            values[key] = value if key == VARIANT else format_value(value)
            if key == VARIANT:
                values.update(variant_values(self.variants[value]))
        return {**values, SEED: str(seed), STUDY: self.name}

    def trial_hash(self, params: dict[str, Any]) -> str:
        """The config hash that a trial's seed runs share: config_hash of its config, or for a command sweep a hash
        of the template and the trial's values (rlvrlab.sweep.template.command_hash)."""
        return self.runner.trial_hash(self, params)

    def fingerprint(self) -> str:
        """What makes two invocations the same study: the runs they would make and how they are scored, as
        rlvrlab.sweep.fingerprint describes them (budget, timeout, the name and the launcher are not in it)."""
        return fingerprint_of(self)


def sweeps_dir() -> Path:
    """`$RLVRLAB_SWEEPS_DIR`, else the shipped sweeps/ folder (the checkout's, or the installed one)."""
    return shipped_dir("sweeps", "RLVRLAB_SWEEPS_DIR")


def sweep_file(name: str) -> Path:
    """A path to a YAML file, or a name in sweeps/."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        if Path(name).is_dir():
            raise ConfigError(folder_given("sweep file", Path(name)))
        if not Path(name).is_file():
            raise ConfigError(f"sweep file {name} does not exist; give an existing .yaml file or a name in sweeps/")
        return Path(name)
    folder = sweeps_dir()
    path = folder / f"{name}.yaml"
    if not path.is_file():
        if Path(name).is_dir():  # a folder of that name here, and no sweep of that name
            raise ConfigError(folder_given("sweep file", Path(name)))
        names = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
        raise unknown("sweep", name, names, where=str(folder))
    return path


def load_sweep(name: str, overrides: Sequence[str] = (), *, seeds: Optional[int] = None,
               study: Optional[str] = None, launcher: Optional[str] = None, nproc: Optional[int] = None,
               gpus_per_run: Optional[int] = None, slurm: Sequence[str] = (),
               seed_timeout: Optional[float | str] = None, confirm_seeds: Optional[int] = None) -> SweepSpec:
    """Parse and validate a sweep file (+ base-config overrides from the command line) and compose every grid
    point (or both ends of every range) so that a bad key or value fails here, not in trial 17.
    launcher, nproc, gpus_per_run, slurm (KEY=VALUE), confirm_seeds: the command line's, over the file's."""
    path = sweep_file(name)
    where = str(path)
    body = _body(path, where)
    all_overrides = _overrides(body, overrides, where)
    command = parse_command(body, all_overrides, where)
    runner = seed_runner(command)
    sampler = _choice(body.get("sampler", "grid"), SAMPLERS, "sampler", where)
    variants = parse_variants(body.get("variants"), where)
    space = _space(body.get("space"), variants, sampler, where)
    objective = _objective(body.get("objective"), where, any_metric=runner.any_metric)
    adaptive = _adaptive(body.get("seeds"), where) if seeds is None else None
    seed_list = tuple(range(adaptive.initial)) if adaptive else \
        _seeds(body.get("seeds", 5) if seeds is None else seeds, where)
    needs = AGGREGATES[objective.aggregate].min_seeds
    if len(seed_list) < needs:
        raise ConfigError(f"objective.aggregate {objective.aggregate} in {where} needs at least {needs} seeds")
    trials, timeout = _budget(body.get("budget"), sampler, where)
    pruner = _pruner(body.get("pruner"), where)
    check_sequential(pruner, adaptive, seed_list, where)
    sweep_name = study or body.get("name") or path.stem
    if not isinstance(sweep_name, str) or not sweep_name.strip():
        raise ConfigError(f"name in {where} must be a non-empty string")
    experiment = _experiment(body.get("experiment"), path, where)
    sampler_seed = _integer(body.get("sampler_seed", 0), "sampler_seed", where)
    spec = SweepSpec(sweep_name, path, experiment, all_overrides, space, sampler, sampler_seed, seed_list,
                     objective, trials, timeout, pruner, variants, adaptive, Launcher(), command,
                     confirm=parse_confirm(body.get("confirm"), space, adaptive, where, confirm_seeds))
    chosen = body.get("launcher")
    given = launcher or (chosen.get("type") if isinstance(chosen, dict) else chosen)
    _check_composes(spec, where)  # then the launcher its runs' engine needs (rlvrlab.sweep.engines)
    kind = launcher_for(spec, None if given is None else _choice(given, LAUNCHERS, "launcher", where), where)
    launch = _launcher(chosen, body.get("slurm"), where, kind, nproc, gpus_per_run, slurm,
                       own_process=runner.own_process)
    spec = dataclasses.replace(spec, launcher=dataclasses.replace(launch, limits=seed_limits.parse_limits(
        body, where, seed_timeout=seed_timeout, launcher=launch.type)))  # not in the fingerprint, as launch
    _check_launcher(spec, where)
    return spec


def _body(path: Path, where: str) -> dict:
    """The sweep file's top-level mapping, every key one of TOP_KEYS."""
    try:
        body = load_yaml(path.read_text(encoding="utf-8"), where) or {}
    except UnicodeDecodeError as error:
        raise ConfigError(f"{where} is not a text file (byte {error.start} is not UTF-8); give a sweep YAML "
                          "file") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{where} is not valid YAML ({str(error).splitlines()[0]}); fix the file") from None
    if not isinstance(body, dict):
        raise ConfigError(f"{where} must be a mapping with keys {', '.join(TOP_KEYS)}")
    for key in body:
        if key not in TOP_KEYS:
            raise unknown("sweep key", key, TOP_KEYS, where=where)
    return body


def _overrides(body: dict, given: Sequence[str], where: str) -> tuple[str, ...]:
    """The file's overrides, then the command line's; none may set what the sweep sets (FIXED_KEYS)."""
    listed = body.get("overrides") or []
    if not isinstance(listed, list) or not all(isinstance(o, str) for o in listed):
        raise ConfigError(f"overrides in {where} must be a list of key=value strings, e.g. [algorithm=ucpo, steps=200]")
    for text in (*listed, *given):
        key = text.partition("=")[0].strip()
        if key in FIXED_KEYS:
            raise ConfigError(f"override {text!r} in {where}: {key} is set by the sweep "
                              f"({'use seeds:' if key == 'seed' else 'the MLflow experiment is the study name'})")
    return (*listed, *given)


def _space(body: Any, variants: dict[str, tuple[str, ...]], sampler: str, where: str) -> tuple[Param, ...]:
    """`space:`, after the grid key `variant` when the file has `variants:` (then space: may be left out)."""
    space = parse_space(body or ({} if variants else None), sampler, where)
    if VARIANT in (p.key for p in space):
        raise ConfigError(f"space key {VARIANT!r} in {where} is the name of `variants:`; list the variants there")
    return (Param(VARIANT, values=tuple(variants)), *space) if variants else space


def _budget(body: Any, sampler: str, where: str) -> tuple[Optional[int], Optional[float]]:
    """`budget:`'s trials and timeout; a sampler needs one of them (a grid has its size)."""
    budget = _mapping(body, ("trials", "timeout"), "budget", where)
    trials = _checked(budget.get("trials"), "budget.trials", where, integer=True, null=True)
    timeout = _checked(budget.get("timeout"), "budget.timeout", where, integer=False, null=True)
    if sampler != "grid" and trials is None and timeout is None:
        raise ConfigError(f"sampler {sampler} in {where} needs budget.trials or budget.timeout (a grid has its size)")
    return trials, timeout


def _pruner(body: Any, where: str) -> Pruner:
    fields = _mapping(body, ("type", "warmup_steps", "startup_trials", "delta", "n_min"), "pruner", where)
    kind = _choice(fields.get("type", "none"), PRUNERS, "pruner.type", where)
    delta, example = fields.get("delta"), "pruner: {type: sequential, delta: 0.05}"
    if kind != SEQUENTIAL and ("delta" in fields or "n_min" in fields):
        raise ConfigError(f"pruner.delta and pruner.n_min in {where} are for pruner type {SEQUENTIAL}; remove them "
                          f"or use {example}")
    if kind == SEQUENTIAL and (isinstance(delta, bool) or not isinstance(delta, (int, float))
                               or not 0 < delta <= MAX_NUMBER):
        raise ConfigError(f"pruner {SEQUENTIAL} in {where} needs delta > 0, the least gain over the best trial worth "
                          f"finding in objective units, e.g. {example}")
    n_min = _integer(fields.get("n_min", MIN_LOOK), "pruner.n_min", where)
    if n_min < MIN_LOOK:
        raise ConfigError(f"pruner.n_min {n_min} in {where} must be at least {MIN_LOOK} (a look at fewer seeds "
                          f"has too few degrees of freedom to prune); set n_min: {MIN_LOOK} or more")
    return Pruner(type=kind, warmup_steps=_integer(fields.get("warmup_steps", 0), "pruner.warmup_steps", where),
                  startup_trials=_integer(fields.get("startup_trials", 5), "pruner.startup_trials", where),
                  delta=None if delta is None else float(delta), n_min=n_min)


def _experiment(value: Any, path: Path, where: str) -> Optional[str]:
    """`experiment:`, a name or a YAML file; a relative path with a folder is relative to the sweep file."""
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"experiment in {where} must be an experiment name or a path to its YAML file")
    if value is not None and not value.endswith((".yaml", ".yml")) and os.sep in value:
        return str((path.parent / value).resolve())
    return value


def _launcher(body: Any, slurm_body: Any, where: str, kind: Optional[str], nproc: Optional[int],
              gpus_per_run: Optional[int], slurm: Sequence[str], *, own_process: bool = False) -> Launcher:
    example = "launcher: process, or launcher: {type: process, nproc: 2}"
    fields: dict[str, Any] = {"type": body} if isinstance(body, str) else _mapping(
        body, ("type", "nproc", "gpus_per_run"), "launcher", where)
    kind = _choice(kind or fields.get("type", "process" if own_process else "inprocess"), LAUNCHERS, "launcher", where)
    ranks, gpus = nproc if nproc is not None else fields.get("nproc"), gpus_per_run if gpus_per_run is not None \
        else fields.get("gpus_per_run", 0)
    for name, value in (("nproc", ranks), ("gpus_per_run", gpus)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"launcher.{name} in {where} must be an integer >= {1 if name == 'nproc' else 0}, "
                              f"e.g. {example}")
    settings = dict(_mapping(slurm_body, SLURM_KEYS, "slurm", where))
    for text in slurm:
        key, equals, value = text.partition("=")
        if not equals or key.strip() not in SLURM_KEYS:
            raise ConfigError(f"--slurm {text}: give KEY=VALUE with KEY one of {', '.join(SLURM_KEYS)}")
        settings[key.strip()] = load_yaml(value, f"--slurm {text}") if value.strip() else None
    for key in ("nodes", "gpus_per_node", "cpus_per_task", "time"):
        value = settings.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"slurm.{key} in {where} must be an integer >= 0 (time: minutes per worker job)")
    if settings.get("cluster") is not None:
        _choice(settings["cluster"], SLURM_CLUSTERS, "slurm.cluster", where)
    for key in ("partition", "account"):
        if settings.get(key) is not None:
            settings[key] = str(settings[key])
    jobs = Slurm(**{k: v for k, v in settings.items() if v is not None})
    if jobs.nodes != 1:
        raise ConfigError(f"slurm.nodes {jobs.nodes} in {where}: a sweep worker job runs on one node (a seed run "
                          "across nodes: docs/scaling.md); set slurm.nodes: 1 and use more --workers")
    if jobs.time < 1:
        raise ConfigError(f"slurm.time in {where} must be at least 1 (minutes per worker job)")
    if own_process:  # the command is the run: its ranks are its own (torchrun in the command)
        if kind == "inprocess" or (ranks or 1) > 1:
            raise ConfigError(f"launcher {kind if kind == 'inprocess' else f'nproc {ranks}'} in {where}: a command "
                              "sweep runs each seed's command as its own process (launcher process or slurm); "
                              "put torchrun or several ranks in the command itself")
        return Launcher(kind, 1, gpus, jobs)  # nproc 1: the command starts its own ranks on the worker's GPUs
    if ranks is None:  # one rank per GPU of the run (or of the job's node)
        ranks = gpus or (jobs.gpus_per_node if kind == "slurm" else 0) or 1
    if ranks < 1:
        raise ConfigError(f"launcher.nproc in {where} must be at least 1")
    if kind == "inprocess" and gpus > 1:
        raise ConfigError(f"--gpus-per-run {gpus} in {where} needs --launcher process (a run inside the worker "
                          "uses one GPU)")
    if kind == "inprocess" and ranks > 1:
        raise ConfigError(f"launcher nproc {ranks} in {where} needs launcher process or slurm (a run of several "
                          "ranks is its own torchrun job); e.g. --launcher process")
    if gpus and ranks != gpus:
        raise ConfigError(f"launcher nproc {ranks} and gpus_per_run {gpus} in {where} differ; a run has one rank "
                          "per GPU (leave nproc out)")
    if kind == "slurm" and jobs.gpus_per_node and ranks > jobs.gpus_per_node:
        raise ConfigError(f"launcher nproc {ranks} in {where} is more than slurm.gpus_per_node "
                          f"{jobs.gpus_per_node}; a seed run has one rank per GPU of its worker's job")
    return Launcher(kind, ranks, gpus, jobs)


def _check_launcher(spec: SweepSpec, where: str) -> None:
    """What a launcher needs of the runs: a step pruner reads each step in the worker (sequential reads each seed's
    value, as any launcher gives it); several ranks need DeepSpeed."""
    launch = spec.launcher
    if spec.runner.no_pruner and spec.pruner.type not in NO_STEPS:
        raise ConfigError(f"pruner {spec.pruner.type} in {where}: {spec.runner.no_pruner}; remove pruner: from the "
                          "sweep file or use pruner sequential")
    if launch.child and spec.pruner.type not in NO_STEPS:
        raise ConfigError(f"pruner {spec.pruner.type} in {where} needs launcher inprocess (a seed run in its own "
                          "process reports no steps to the worker's pruner); drop the pruner or the launcher, or "
                          "use pruner sequential")
    if launch.nproc > 1 and spec.base().trainer.engine != "deepspeed":
        raise ConfigError(f"launcher nproc {launch.nproc} in {where}: several ranks train data parallel through "
                          "DeepSpeed; add trainer.engine=deepspeed to overrides")


def _check_composes(spec: SweepSpec, where: str) -> None:
    base = spec.base()
    if base.tracking.backend != "mlflow":
        raise ConfigError(f"tracking.backend={base.tracking.backend} in {where}: a sweep reads its objective from the "
                          "seed runs' MLflow records; drop the override (the default is mlflow)")
    if base.tracking.log_last < spec.objective.window:
        raise ConfigError(f"{LOG_LAST}={base.tracking.log_last} in {where} is below objective.window "
                          f"{spec.objective.window}: each step the objective reads must be logged; drop the override "
                          f"(the sweep sets it to the window) or raise it")
    spec.runner.check(spec, where)  # its points compose; a command's placeholders have values


def _objective(body: Any, where: str, *, any_metric: bool = False) -> Objective:
    fields = _mapping(body, ("metric", "direction", "window", "aggregate"), "objective", where)
    metric = fields.get("metric")
    if not isinstance(metric, str) or not metric:
        raise ConfigError(f"objective.metric in {where} must name a per-step metric, e.g. train/reward")
    from rlvrlab.train.metrics import metric_names

    if not any_metric and metric not in metric_names():  # a command's runs log their own names
        raise unknown("objective.metric", metric, metric_names(), where=where)
    direction = _choice(fields.get("direction", "maximize"), DIRECTIONS, "objective.direction", where)
    aggregate = _choice(fields.get("aggregate", MEAN.name), tuple(AGGREGATES), "objective.aggregate", where)
    if AGGREGATES[aggregate].direction not in (None, direction):
        bounds = [a.name for a in AGGREGATES.values() if a.direction == direction]
        hint = f"{' or '.join(bounds)} (the pessimistic bound) or {MEAN.name}" if bounds else MEAN.name
        raise ConfigError(f"objective.aggregate {aggregate} with direction {direction} in {where} favours noisy "
                          f"trials; use {hint}")
    window = _checked(fields.get("window", 1), "objective.window", where, integer=True, null=True)
    if window is None or window < 1:
        raise ConfigError(f"objective.window in {where} must be an integer >= 1")
    return Objective(metric, direction, window, aggregate)


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_SEEDS:
        return tuple(range(value))
    if isinstance(value, list) and 0 < len(value) <= MAX_SEEDS and all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_SEED for s in value) \
            and len(set(value)) == len(value):
        return tuple(value)
    raise ConfigError(f"seeds in {where} must be a count from 1 to {MAX_SEEDS} (each seed is a training run of every "
                      f"trial), a list of at most {MAX_SEEDS} distinct seeds from 0 to {MAX_SEED}, or "
                      "{initial: 5, max: 20, halfwidth: 0.02}, e.g. seeds: 5")


def _adaptive(value: Any, where: str) -> Optional[AdaptiveSeeds]:
    if not isinstance(value, dict):
        return None
    example = "seeds: {initial: 5, max: 20, halfwidth: 0.02}"
    fields = _mapping(value, ("initial", "max", "halfwidth"), "seeds", where)
    initial, most, width = fields.get("initial"), fields.get("max"), fields.get("halfwidth")
    if not (isinstance(initial, int) and not isinstance(initial, bool) and initial >= MIN_INITIAL):
        raise ConfigError(f"seeds.initial in {where} must be an integer >= {MIN_INITIAL} (Stein's two-stage rule "
                          f"sizes a trial from the spread of its first seeds; fewer make it ask far more seeds), "
                          f"e.g. {example}")
    if not (isinstance(most, int) and not isinstance(most, bool) and initial <= most <= MAX_SEEDS):
        raise ConfigError(f"seeds.max in {where} must be an integer from seeds.initial ({initial}) to {MAX_SEEDS}, "
                          f"e.g. {example}")
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not width > 0:
        raise ConfigError(f"seeds.halfwidth in {where} must be a number > 0 (the 95% half-width of the objective), "
                          f"e.g. {example}")
    return AdaptiveSeeds(initial, most, float(width))


def _mapping(body: Any, keys: Sequence[str], name: str, where: str) -> dict:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ConfigError(f"{name} in {where} must be a mapping with keys {', '.join(keys)}")
    for key in body:
        if key not in keys:
            raise unknown(f"{name} key", key, keys, where=where)
    return body


def _choice(value: Any, options: Sequence[str], name: str, where: str) -> str:
    if value not in options:
        raise unknown(name, value, options, where=where)
    return value


def _checked(value: Any, name: str, where: str, *, integer: bool, null: bool) -> Any:
    """`value` itself, if it is a number from 0 to MAX_NUMBER (an integer where `integer`; or null where `null`)."""
    if value is None and null:
        return None
    kinds = (int,) if integer else (int, float)
    if value is None or isinstance(value, bool) or not isinstance(value, kinds) or not 0 <= value <= MAX_NUMBER:
        raise ConfigError(f"{name} in {where} must be a{'n integer' if integer else ' number'} from 0 to "
                          f"{MAX_NUMBER:.0e}{' or null' if null else ''}")
    return value


def _integer(value: Any, name: str, where: str) -> int:
    return _checked(value, name, where, integer=True, null=False)


MAX_NUMBER = 1e15  # budget, pruner and sampler numbers: beyond any real use, and a float (nan and inf are refused)
