"""Side by side in one run, no training: Optuna storages under N sweep-worker processes on this machine.

    .venv/bin/python bench/sweep_storage.py [TRIALS_PER_WORKER] [--claim-only]     (TRIALS_PER_WORKER = 25)

About 1.8 min on 2 cores. For each storage and N = 2, 4, 8 processes (multiprocessing spawn, started together behind a barrier), a fresh
study holds N * TRIALS_PER_WORKER enqueued (WAITING) trials, as a grid sweep's does. Each process does what an
rlvrlab sweep worker does per trial (rlvrlab/sweep/trials.py: _next_trial, Heartbeat, run_trial), without
training: claim a WAITING trial (get_all_trials(WAITING) + set_trial_state_values(RUNNING)), set the worker and
heartbeat system attrs, set 3 user attrs (MLflow run id, config hash, per-seed values), report 20 intermediate
values, tell a value; until no trial waits. Then (unless --claim-only) a second workload where each process
instead creates TRIALS_PER_WORKER trials with study.ask() (a sampler sweep; RandomSampler), the same per trial.

Storages: (a) JournalStorage(JournalFileBackend(path)), rlvrlab's default; (b) RDBStorage("sqlite:///...")
as rlvrlab opens an RDB URL (engine_kwargs pool_pre_ping only: pysqlite's 5 s lock timeout); (c) the same with
connect_args timeout 30 s.

Reported per storage and N: trials told per second (wall from the barrier to the last process done), errors
(exception type and root message, e.g. sqlite "database is locked"), trials claimed by more than one process
(duplicated; of those, told COMPLETE by two processes), trials a process told that the storage does not hold COMPLETE with 20 intermediate values and its
attrs (lost), trials left RUNNING or WAITING, and the slowest single storage call.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

STUDY = "bench"
REPORTS = 20
BARRIER_TIMEOUT = 120.0


def open_storage(kind: str, where: Path):
    import optuna

    if kind == "journal":
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(where / "optuna.journal")))
    kwargs = {"pool_pre_ping": True}  # what rlvrlab.sweep.trials.open_storage passes
    if kind == "sqlite+timeout30":
        kwargs["connect_args"] = {"timeout": 30}
    return optuna.storages.RDBStorage(f"sqlite:///{where / 'optuna.db'}", engine_kwargs=kwargs)


def root_message(error: BaseException) -> str:
    """Type of the raised error and the first line of its innermost cause."""
    inner = error
    while inner.__cause__ is not None or inner.__context__ is not None:
        inner = inner.__cause__ or inner.__context__
    text = (str(inner).strip().splitlines() or [""])[0]
    text = re.sub(r"#\d+", "#N", text.split(" [SQL:")[0])[:90]  # one line per kind, not per trial
    name = type(error).__name__
    return f"{name}: {type(inner).__name__}: {text}" if inner is not error else f"{name}: {text}"


def worker(kind: str, where: str, mode: str, count: int, index: int, barrier, results) -> None:
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")  # "step already reported" on a trial claimed twice: counted, not printed
    out = {"index": index, "claimed": [], "told": [], "errors": Counter(), "slowest": 0.0, "slowest_call": "",
           "calls": 0, "abandoned": 0}

    def call(fn, *args, **kwargs):
        tic = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - tic
            if seconds > out["slowest"]:
                out["slowest"], out["slowest_call"] = seconds, fn.__name__
            out["calls"] += 1

    try:
        storage = open_storage(kind, Path(where))
        study = optuna.load_study(study_name=STUDY, storage=storage, sampler=optuna.samplers.RandomSampler(index))
        study_id = storage.get_study_id_from_name(STUDY)
    except Exception as error:  # noqa: BLE001 - any storage error is a measured outcome
        out["errors"][f"open: {root_message(error)}"] += 1
        barrier.wait(BARRIER_TIMEOUT)
        results.put(out)
        return
    barrier.wait(BARRIER_TIMEOUT)
    started = time.perf_counter()
    misses = 0
    while True:
        trial = None
        try:
            if mode == "claim":
                waiting = call(storage.get_all_trials, study_id, deepcopy=False, states=(TrialState.WAITING,))
                if not waiting:
                    break
                for frozen in waiting:
                    try:
                        if call(storage.set_trial_state_values, frozen._trial_id, state=TrialState.RUNNING):
                            trial = optuna.Trial(study, frozen._trial_id)
                            break
                    except UpdateFinishedTrialError:
                        continue
                if trial is None:
                    continue  # every waiting trial was taken in between: look again
            else:
                if len(out["claimed"]) + out["abandoned"] >= count:
                    break
                trial = call(study.ask)
        except Exception as error:  # noqa: BLE001
            out["errors"][f"claim: {root_message(error)}"] += 1
            misses += 1
            if misses > 50:  # a storage that keeps failing: give up rather than spin
                break
            continue
        out["claimed"].append(trial._trial_id)
        try:
            tid = trial._trial_id
            call(storage.set_trial_system_attr, tid, "rlvrlab.worker", f"host:{os.getpid()}:0")
            call(storage.set_trial_system_attr, tid, "rlvrlab.heartbeat", time.time())
            call(trial.set_user_attr, "rlvrlab.mlflow_run_id", f"run{tid:08d}" * 4)
            call(trial.set_user_attr, "rlvrlab.config_hash", f"{tid:012x}")
            call(trial.set_user_attr, "rlvrlab.values", {str(s): 0.1 * s for s in range(3)})
            for step in range(REPORTS):
                call(trial.report, 0.01 * step, step)
            call(study.tell, trial, float(tid))
            out["told"].append(tid)
        except Exception as error:  # noqa: BLE001
            # a real sweep worker would end here (run_trial re-raises); the trial stays RUNNING
            out["errors"][f"trial: {root_message(error)}"] += 1
            out["abandoned"] += 1
    out["seconds"] = time.perf_counter() - started
    results.put(out)


def measure(kind: str, workers: int, mode: str, count: int) -> dict:
    import optuna
    from optuna.trial import TrialState

    where = Path(tempfile.mkdtemp(prefix=f"sweep_storage_{kind}_"))
    try:
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        storage = open_storage(kind, where)
        study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
        if mode == "claim":
            for i in range(workers * count):
                study.enqueue_trial({"x": float(i)}, skip_if_exists=False)
        context = multiprocessing.get_context("spawn")
        barrier, results = context.Barrier(workers + 1), context.Queue()
        procs = [context.Process(target=worker, args=(kind, str(where), mode, count, i, barrier, results))
                 for i in range(workers)]
        for proc in procs:
            proc.start()
        barrier.wait(BARRIER_TIMEOUT)  # every process has imported optuna and opened the storage
        tic = time.perf_counter()
        outs = [results.get(timeout=600) for _ in procs]
        wall = time.perf_counter() - tic
        for proc in procs:
            proc.join()

        claims = Counter(t for out in outs for t in out["claimed"])
        told_by = Counter(t for out in outs for t in out["told"])
        told = set(told_by)
        check = open_storage(kind, where)
        trials = {t._trial_id: t for t in check.get_all_trials(check.get_study_id_from_name(STUDY), deepcopy=False)}
        lost = [t for t in told if t not in trials or trials[t].state != TrialState.COMPLETE
                or len(trials[t].intermediate_values) != REPORTS or len(trials[t].user_attrs) != 3]
        states = Counter(t.state.name for t in trials.values())
        numbers = Counter(t.number for t in trials.values())
        errors = Counter()
        for out in outs:
            errors.update(out["errors"])
        return {"kind": kind, "workers": workers, "mode": mode, "wall": wall, "told": len(told),
                "rate": len(told) / wall if wall else 0.0, "errors": errors, "expected": workers * count,
                "duplicated": sum(1 for n in claims.values() if n > 1), "lost": len(lost),
                "told_twice": sum(1 for n in told_by.values() if n > 1),
                "running": states.get("RUNNING", 0), "waiting": states.get("WAITING", 0),
                "same_number": sum(1 for n in numbers.values() if n > 1),
                "slowest": max(out["slowest"] for out in outs), "calls": sum(out["calls"] for out in outs),
                "slowest_call": max(outs, key=lambda out: out["slowest"])["slowest_call"]}
    finally:
        shutil.rmtree(where, ignore_errors=True)


def main(argv: list[str]) -> None:
    numbers = [int(a) for a in argv if not a.startswith("--")]
    count = numbers[0] if numbers else 25
    modes = ["claim"] if "--claim-only" in argv else ["claim", "ask"]
    import optuna

    print(f"Optuna {optuna.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start; "
          f"per trial: claim, 2 system attrs, 3 user attrs, {REPORTS} reports, tell; {count} trials per process")
    rows = []
    for mode in modes:
        for kind in ("journal", "sqlite", "sqlite+timeout30"):
            for workers in (2, 4, 8):
                try:
                    row = measure(kind, workers, mode, count)
                except Exception:  # noqa: BLE001 - one broken configuration must not hide the others
                    traceback.print_exc()
                    continue
                rows.append(row)
                errors = sum(row["errors"].values())
                print(f"  {mode:5s} {kind:17s} N={workers}: {row['told']:4d}/{row['expected']} told in "
                      f"{row['wall']:5.1f} s = {row['rate']:6.1f} trials/s, errors {errors}, duplicated "
                      f"{row['duplicated']} (told by 2 processes {row['told_twice']}), lost {row['lost']}, "
                      f"left RUNNING {row['running']} WAITING {row['waiting']}, slowest call {row['slowest']:.2f} s "
                      f"({row['slowest_call']})", flush=True)
    print()
    print(f"{'workload':8s} {'storage':17s} {'N':>2s} {'trials/s':>8s} {'told':>9s} {'errors':>6s} {'dup':>4s} "
          f"{'2xtold':>6s} {'lost':>4s} {'stuck':>5s} {'slowest':>8s}")
    for row in rows:
        told = f"{row['told']}/{row['expected']}"
        print(f"{row['mode']:8s} {row['kind']:17s} {row['workers']:2d} {row['rate']:8.1f} {told:>9s} "
              f"{sum(row['errors'].values()):6d} {row['duplicated']:4d} {row['told_twice']:6d} {row['lost']:4d} "
              f"{row['running'] + row['waiting']:5d} {row['slowest']:7.2f}s")
    kinds = Counter()
    for row in rows:
        for message, n in row["errors"].items():
            kinds[(row["mode"], row["kind"], row["workers"], message)] += n
    if kinds:
        print("\nerrors:")
        for (mode, kind, workers, message), n in sorted(kinds.items()):
            print(f"  {mode} {kind} N={workers}: {n} x {message}")
    same = [r for r in rows if r["same_number"]]
    for row in same:
        print(f"  {row['mode']} {row['kind']} N={row['workers']}: {row['same_number']} trial numbers given twice")
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main(sys.argv[1:])
