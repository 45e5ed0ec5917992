"""Side by side in one run, toy tier on this machine: what the sweep machinery costs on top of training.

    .venv/bin/python bench/sweep_throughput.py [SEEDS] [STEPS] [--no-cli]      (SEEDS = 3, STEPS = the file's 200)
    .venv/bin/python bench/sweep_throughput.py --grid [SEEDS] [STEPS]           (the full grid: 5 seeds, 200 steps)
    .venv/bin/python bench/sweep_throughput.py --grid --workers=2 [SEEDS] [STEPS]   (the same grid through the CLI)
    ... --grid [--workers=N] [SEEDS] [STEPS] KEY=VALUE ...    (with config overrides, e.g. tracking.log_every=10)

--grid: the wall time of sweeps/tau_eps_staleness_grid.yaml (27 cells x SEEDS seeds x STEPS steps), one worker in
this process through the library, and where it goes: per seed run, setup (`build`: config, MLflow run,
provenance), the steps themselves (`train_step`), MLflow writes waited for (tracker flush/finish), checkpoints,
and outside `train` the sweep's own Optuna, MLflow and compose calls. Run it against another checkout for a
before/after pair: `PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/sweep_throughput.py --grid ...`.
--grid --workers=N: the same grid as `rlvrlab sweep ... --workers N` in a subprocess (N worker processes sharing
the journal storage), timed as a whole (wall and CPU of the command and its workers), with the phases the study's
own timestamps show (start-up until the first trial starts, all workers busy, the tail with fewer trials left than
workers, the command's end); the subprocess imports rlvrlab as this process does (PYTHONPATH is passed on).

sweeps/ucpo_tau.yaml (5 grid points) with SEEDS seeds per trial, in a fresh temp dir each time (~2.3 min on 2 cores):
1. In process, 1 worker, through the library (load_sweep / open_sweep / work / finish_study_run): trial-seeds per
   minute, and where the wall time goes: inside `rlvrlab.train.loop.train` (timed by wrapping the function that
   `rlvrlab.sweep.trials._seed_run` imports at call time) versus the rest, split into Optuna storage calls, MLflow
   client calls, compose/config_hash and everything else (only calls made outside `train` on the main thread
   count; the heartbeat thread does not add wall time).
2. The same seed runs as plain `train(cfg)` calls (the config the sweep passes, output_dir moved to a store of
   their own), no sweep: each made right next to its sweep seed run, alternately before and after, so that
   other load on the machine falls on both sides; the plain runs are taken out of the sweep's time. Ratios
   sweep / plain of the totals, and per pair of the train() calls.
3. Unless --no-cli: `rlvrlab sweep ... --workers 1` and `--workers 2` as subprocesses (process start-up included
   in both): the speed-up of 2 workers on this machine.
One untimed train call of the same length first warms up imports, so neither side pays them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "sweeps" / "ucpo_tau.yaml"
RLVRLAB = Path(sys.executable).with_name("rlvrlab")


class Clock:
    """Inclusive time of the outermost timed call on the main thread, by category."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)  # process CPU time (all threads) during those calls
        self.calls: dict[str, int] = defaultdict(int)
        self._depth = 0
        self.active = False  # on only while the sweep runs
        self.excluded = self.excluded_cpu = 0.0  # the plain runs made in between, taken out of the sweep's time
        self._main = threading.main_thread()

    def wrap(self, category: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not self.active or self._depth or threading.current_thread() is not self._main:
                return fn(*args, **kwargs)
            self._depth += 1
            tic, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[category] += time.perf_counter() - tic
                self.cpu[category] += time.process_time() - cpu
                self.calls[category] += 1
                self._depth -= 1

        return timed

    def wrap_class(self, category: str, cls) -> None:
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                setattr(cls, name, self.wrap(category, member))


def in_process(seeds: int, overrides: list[str]) -> dict:
    import dataclasses

    import optuna
    from mlflow.tracking import MlflowClient

    import rlvrlab.config
    import rlvrlab.train.loop
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.study import finish_study_run, open_sweep
    from rlvrlab.sweep.trials import work

    root = Path(tempfile.mkdtemp(prefix="sweep_throughput_"))
    home = Path.cwd()
    os.chdir(root)  # the default output_dir is runs/ under the working directory, as for the CLI
    spec = load_sweep(str(SWEEP), overrides, seeds=seeds)
    real_train = rlvrlab.train.loop.train

    # warm-up, one full-length run: imports and first-call costs (checkpoint saving included), paid by neither side
    first = rlvrlab.config.compose(spec.experiment, spec.overrides_for(spec.grid()[0], spec.seeds[0]))
    real_train(dataclasses.replace(first, output_dir=str(root / "warm")))

    clock = Clock()
    pairs: list[tuple[float, float, float, float]] = []  # wall and main-thread CPU s: (in sweep, plain) each
    plain_cpu = 0.0

    def paired(cfg, **kwargs):
        """The sweep's train call, and next to it (alternately before and after) the same config as a plain
        train(cfg) in a store of its own; the plain run is taken out of the sweep's figures."""
        nonlocal plain_cpu

        def plain() -> tuple[float, float]:
            nonlocal plain_cpu
            clock.active = False  # its MLflow calls are not the sweep's
            tic, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
            real_train(dataclasses.replace(cfg, output_dir=str(root / "plain")))
            own, cpu, seconds = time.thread_time() - own, time.process_time() - cpu, time.perf_counter() - tic
            clock.active = True
            plain_cpu += cpu
            clock.excluded += seconds
            clock.excluded_cpu += cpu
            return seconds, own

        before = plain() if len(pairs) % 2 else None
        tic, own = time.perf_counter(), time.thread_time()
        try:
            return timed_train(cfg, **kwargs)
        finally:
            inside, own = time.perf_counter() - tic, time.thread_time() - own
            after = before if before is not None else plain()
            pairs.append((inside, after[0], own, after[1]))

    timed_train = clock.wrap("train", real_train)
    rlvrlab.train.loop.train = paired  # _seed_run imports it from the module at each call
    rlvrlab.config.compose = clock.wrap("compose/config_hash", rlvrlab.config.compose)
    rlvrlab.config.config_hash = clock.wrap("compose/config_hash", rlvrlab.config.config_hash)
    clock.wrap_class("Optuna storage", optuna.storages.JournalStorage)
    clock.wrap_class("MLflow client", MlflowClient)

    clock.active = True
    tic, cpu = time.perf_counter(), time.process_time()
    sweep = open_sweep(spec)
    opened = time.perf_counter() - tic
    seed_runs = []
    report = work(sweep, on_seed=lambda number, position, count: seed_runs.append((number, position)))
    finish_study_run(sweep)
    wall = time.perf_counter() - tic - clock.excluded
    wall_cpu = time.process_time() - cpu - clock.excluded_cpu
    clock.active = False
    rlvrlab.train.loop.train = real_train
    os.chdir(home)
    shutil.rmtree(root, ignore_errors=True)
    states = sorted({o.state for o in report.outcomes})
    return {"trials": len(report.outcomes), "states": states, "seed_runs": len(seed_runs), "wall": wall,
            "wall_cpu": wall_cpu, "opened": opened, "clock": clock, "pairs": pairs, "plain_cpu": plain_cpu}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed_sweep(command: list[str], prefix: str, after=None) -> tuple[float, float, str]:
    """(wall s, CPU s of the command and its workers, its "N/M trials done" line) of one CLI sweep in a fresh
    directory; exits with the command's stderr when it fails. after(folder, start time, wall s): called before the
    folder is removed."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    cpu, tic, started = _children_cpu(), time.perf_counter(), time.time()
    done = subprocess.run(command, check=False, cwd=root, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - tic, _children_cpu() - cpu
    if after is not None and not done.returncode:
        after(root, started, seconds)
    shutil.rmtree(root, ignore_errors=True)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, cpu, next((line for line in done.stdout.splitlines() if "trials done" in line), "?")


def cli(workers: int, seeds: int, overrides: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s of the command and its workers, trials done) of one CLI sweep in a fresh directory."""
    command = [str(RLVRLAB), "sweep", str(SWEEP), *overrides, "--seeds", str(seeds), "--workers", str(workers)]
    seconds, cpu, finished = _timed_sweep(command, f"sweep_cli{workers}_")
    return seconds, cpu, int(finished.split("/")[0]) if finished[0].isdigit() else -1


def grid(seeds: int, overrides: list[str]) -> None:
    """The full three-way grid, one worker in this process, with the time split described at the top."""
    import optuna
    from mlflow.tracking import MlflowClient

    import rlvrlab
    import rlvrlab.config
    import rlvrlab.train.loop as loop
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.study import finish_study_run, open_sweep
    from rlvrlab.sweep.trials import work
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker
    from rlvrlab.train import checkpoint

    path = REPO / "sweeps" / "tau_eps_staleness_grid.yaml"
    root = Path(tempfile.mkdtemp(prefix="sweep_grid_"))
    home = Path.cwd()
    os.chdir(root)
    load = os.getloadavg()[0]
    spec = load_sweep(str(path), overrides, seeds=seeds)
    warm = rlvrlab.config.compose(spec.experiment, spec.overrides_for(spec.grid()[0], 0))
    loop.train(dataclasses.replace(warm, output_dir=str(root / "warm")))  # imports and first calls, not timed

    outer, inner = Clock(), Clock()
    loop.train = outer.wrap("train", loop.train)
    import rlvrlab.sweep.trials as trials

    trials.compose = outer.wrap("compose/config_hash", trials.compose)  # imported by name there
    trials.config_hash = outer.wrap("compose/config_hash", trials.config_hash)
    clock_class = outer.wrap_class
    clock_class("Optuna storage", optuna.storages.JournalStorage)
    clock_class("MLflow client", MlflowClient)
    loop.build = inner.wrap("setup (build)", loop.build)
    loop.train_step = inner.wrap("steps (train_step)", loop.train_step)
    MlflowTracker.flush = inner.wrap("MLflow writes waited for", MlflowTracker.flush)
    MlflowTracker.finish = inner.wrap("MLflow writes waited for", MlflowTracker.finish)
    checkpoint.save = inner.wrap("checkpoints", checkpoint.save)
    outer.active = inner.active = True
    tic, cpu = time.perf_counter(), time.process_time()
    sweep = open_sweep(spec)
    report = work(sweep)
    finish_study_run(sweep)
    wall, cpu = time.perf_counter() - tic, time.process_time() - cpu
    os.chdir(home)
    shutil.rmtree(root, ignore_errors=True)
    runs = len(report.outcomes) * seeds
    print(f"{path.name} {' '.join(overrides)}: {len(report.outcomes)} cells x {seeds} seeds = {runs} seed runs "
          f"({', '.join(sorted({o.state for o in report.outcomes}))}), one worker in process; rlvrlab from "
          f"{Path(rlvrlab.__file__).parent.parent}; {os.cpu_count()} cores, load average {load:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end")
    print(f"wall {wall:.1f} s ({cpu:.1f} s CPU) = {runs / wall * 60:.1f} seed runs/min, {wall / runs * 1000:.0f} ms "
          "per seed run")
    train_s = outer.seconds["train"]
    print(f"  {'where the time goes':28s} {'wall s':>8s} {'share':>6s} {'per seed run':>13s}")
    rows = [(name, inner.seconds[name]) for name in ("setup (build)", "steps (train_step)", "MLflow writes waited for",
                                                       "checkpoints")]
    rows.append(("rest of train()", train_s - sum(v for _, v in rows)))
    rows += [(f"sweep: {name}", outer.seconds[name]) for name in ("Optuna storage", "MLflow client",
                                                                    "compose/config_hash")]
    rows.append(("sweep: other", wall - sum(outer.seconds.values())))
    for name, seconds in rows:
        print(f"  {name:28s} {seconds:8.2f} {seconds / wall:6.1%} {seconds / runs * 1000:10.0f} ms")
    steps_cpu, cores = inner.cpu["steps (train_step)"], os.cpu_count() or 1
    print(f"  the steps alone took {steps_cpu:.1f} s of CPU: {cores} workers on {cores} cores doing nothing else would "
          f"need at least {steps_cpu / cores:.1f} s for this grid (more where they slow each other down)")


def grid_cli(seeds: int, overrides: list[str], workers: int) -> None:
    """The same grid through `rlvrlab sweep --workers N` (N processes, the journal storage): wall and CPU only."""
    import rlvrlab

    path = REPO / "sweeps" / "tau_eps_staleness_grid.yaml"
    command = [sys.executable, "-m", "rlvrlab.cli.main", "sweep", str(path), *overrides, "--seeds", str(seeds),
               "--workers", str(workers)]
    load = os.getloadavg()[0]
    phases: list[str] = []

    def timeline(root: Path, started: float, seconds: float) -> None:
        """From the study's own timestamps: start-up until the first trial starts, all workers busy until the
        workers-th last trial ends, fewer busy until the last one ends (the tail), the command's end after it."""
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(root / "runs" / "optuna.journal")))
        trials = optuna.load_study(study_name=path.stem, storage=storage).get_trials(deepcopy=False)
        first = min(t.datetime_start.timestamp() for t in trials) - started
        ends = sorted(t.datetime_complete.timestamp() - started for t in trials)
        busy = ends[-workers] if len(ends) >= workers else ends[-1]
        phases.append(f"start-up {first:.1f} s (until the first trial starts), {busy - first:.1f} s with all "
                      f"{workers} workers busy, tail {ends[-1] - busy:.1f} s (fewer trials left than workers), "
                      f"end {seconds - ends[-1]:.1f} s (after the last trial)")
        # the study's results, to compare checkouts: equal digests, the same values to the bit
        values = sorted((sorted(t.params.items()), t.values) for t in trials)
        phases.append(f"\ntrial values sha256 {hashlib.sha256(repr(values).encode()).hexdigest()[:16]}")

    seconds, cpu, finished = _timed_sweep(command, f"sweep_grid{workers}_", after=timeline)
    runs = 27 * seeds
    print(f"{path.name} {' '.join(overrides)}: 27 cells x {seeds} seeds = {runs} seed runs ({finished}), "
          f"`rlvrlab sweep --workers {workers}` (process start-up included); rlvrlab from "
          f"{Path(rlvrlab.__file__).parent.parent}; {os.cpu_count()} cores, load average {load:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end")
    print(f"wall {seconds:.1f} s ({cpu:.1f} s CPU of the command and its workers) = {runs / seconds * 60:.1f} seed "
          f"runs/min, {seconds / runs * 1000:.0f} ms per seed run")
    print(*phases)


def main(argv: list[str]) -> None:
    flags = [a for a in argv if a.startswith("--")]
    if "--grid" in flags:
        workers = next((int(a.split("=", 1)[1]) for a in flags if a.startswith("--workers=")), 1)
        numbers = [int(a) for a in argv if not a.startswith("--") and "=" not in a]
        seeds, overrides = numbers[0] if numbers else 5, [f"steps={numbers[1]}"] if len(numbers) > 1 else []
        overrides += [a for a in argv if not a.startswith("--") and "=" in a]  # config overrides, KEY=VALUE
        if workers > 1:
            grid_cli(seeds, overrides, workers)
        else:
            grid(seeds, overrides)
        return
    numbers = [int(a) for a in argv if not a.startswith("--")]
    seeds = numbers[0] if numbers else 3
    overrides = [f"steps={numbers[1]}"] if len(numbers) > 1 else []
    with_cli = "--no-cli" not in flags
    load = os.getloadavg()[0]

    r = in_process(seeds, overrides)
    clock, wall, cpu = r["clock"], r["wall"], r["wall_cpu"]
    n = r["seed_runs"]
    print(f"{SWEEP.name} {' '.join(overrides)}: {r['trials']} trials x {seeds} seeds = {n} seed runs "
          f"(states {', '.join(r['states'])}); {os.cpu_count()} cores, load average {load:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} after the in-process part")
    print(f"in process, 1 worker: {wall:.1f} s wall ({cpu:.1f} s CPU) = {n / wall * 60:.1f} trial-seeds/min; "
          f"open_sweep {r['opened']:.2f} s of it")
    print(f"  {'where the time goes':22s} {'wall s':>7s} {'share':>6s} {'CPU s':>6s} {'share':>6s} {'calls':>6s} "
          f"{'wall per seed run':>18s}")
    rest, rest_cpu = wall, cpu
    for name in ("train", "Optuna storage", "MLflow client", "compose/config_hash"):
        seconds, used = clock.seconds.get(name, 0.0), clock.cpu.get(name, 0.0)
        rest, rest_cpu = rest - seconds, rest_cpu - used
        print(f"  {name:22s} {seconds:7.2f} {seconds / wall:6.1%} {used:6.2f} {used / cpu:6.1%} "
              f"{clock.calls.get(name, 0):6d} {seconds / n * 1000:15.0f} ms")
    print(f"  {'other (sampler, ...)':22s} {rest:7.2f} {rest / wall:6.1%} {rest_cpu:6.2f} {rest_cpu / cpu:6.1%} "
          f"{'':6s} {rest / n * 1000:15.0f} ms")
    outside = wall - clock.seconds["train"]
    print(f"  outside train: {outside:.2f} s wall = {outside / n * 1000:.0f} ms per seed run, "
          f"{outside / r['trials'] * 1000:.0f} ms per trial")
    pairs = r["pairs"]
    plain = sum(p[1] for p in pairs)
    walls = sorted(p[0] / p[1] for p in pairs)
    owns = sorted(p[2] / p[3] for p in pairs)
    print(f"plain train(cfg), the same {len(pairs)} configs, each next to its sweep seed run (order alternating), "
          f"own store: {plain:.1f} s wall ({r['plain_cpu']:.1f} s CPU) = {len(pairs) / plain * 60:.1f} runs/min, "
          f"{min(p[1] for p in pairs):.2f}-{max(p[1] for p in pairs):.2f} s per run")
    print(f"  ratio sweep / plain, totals: wall {wall / plain:.3f}, CPU {cpu / r['plain_cpu']:.3f}")
    print(f"  train() in the sweep / plain, per pair: wall median {statistics.median(walls):.3f} "
          f"(range {walls[0]:.2f}-{walls[-1]:.2f}), main-thread CPU median {statistics.median(owns):.3f} "
          f"(range {owns[0]:.2f}-{owns[-1]:.2f})")
    if with_cli:
        one, cpu1, done1 = cli(1, seeds, overrides)
        two, cpu2, done2 = cli(2, seeds, overrides)
        print(f"CLI subprocess `rlvrlab sweep` (process start-up included), {n} seed runs each, "
              f"load average {os.getloadavg()[0]:.2f} at end:")
        print(f"  --workers 1: {one:6.1f} s wall ({cpu1:5.1f} s CPU) = {n / one * 60:5.1f} trial-seeds/min, "
              f"{done1} trials done")
        print(f"  --workers 2: {two:6.1f} s wall ({cpu2:5.1f} s CPU) = {n / two * 60:5.1f} trial-seeds/min, "
              f"{done2} trials done")
        print(f"  speed-up of 2 workers: {one / two:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
