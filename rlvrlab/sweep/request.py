"""`rlvrlab sweep`'s options, defined once: each field of SweepRequest with `Option` metadata is an option with its
flag, help and minimum (rlvrlab.cli.sweep builds the typer command from these fields, as `rlvrlab eval pass-at-k`
does from rlvrlab.eval.request), and `run` hands them to rlvrlab.sweep.workers.run_sweep_file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from rlvrlab.config.flags import option as _opt
from rlvrlab.tracking.testbed import Testbed


@dataclass(frozen=True)
class SweepRequest:
    """One `rlvrlab sweep` invocation's options (the sweep file and its overrides are its arguments)."""

    workers: int = _opt(1, "--workers", "Trials run in parallel processes on this machine (at most the trials left; "
                        "refused beyond a core and ~400 MiB each).", shown=True, minimum=1)
    storage: Optional[str] = _opt(None, "--storage", "Optuna storage: a journal file path, or an RDB URL such as "
                                  "postgresql://user:pw@host/db for workers on several machines. Default: "
                                  "<output_dir>/optuna.journal.")
    name: Optional[str] = _opt(None, "--name", "Study name (default: the file's name:).")
    seeds: Optional[int] = _opt(None, "--seeds", "Seeds per trial (default: the file's seeds:).", minimum=1)
    status: bool = _opt(False, "--status", "Show the study's trials and best config; run nothing.", shown=True)
    launcher: Optional[str] = _opt(None, "--launcher", "How seed runs run: inprocess (the toy default), process (a "
                                   "child `rlvrlab train`; torchrun with --nproc ranks), slurm (--workers jobs through "
                                   "submitit). Default: the file's launcher:.")
    nproc: Optional[int] = _opt(None, "--nproc", "Ranks per seed run (process, slurm); default: --gpus-per-run, "
                                "else 1.", minimum=1)
    gpus_per_run: Optional[int] = _opt(None, "--gpus-per-run", "GPUs each worker owns (disjoint CUDA_VISIBLE_DEVICES "
                                       "sets of this machine).", minimum=1)
    slurm: tuple[str, ...] = _opt((), "--slurm", "KEY=VALUE over the file's slurm: block (partition, time, "
                                  "gpus_per_node, cpus_per_task, account, nodes, cluster); repeatable.")
    oversubscribe: bool = _opt(False, "--oversubscribe", "Start --workers processes even beyond a core and ~400 MiB "
                               "of available memory each.", shown=True)
    keep_going: bool = _opt(False, "--keep-going", "No fail-fast: run every seed even when the first failed seed "
                            "runs fail the same way.", shown=True)
    retry_failed: bool = _opt(False, "--retry-failed", "Re-run the failed (and timed-out) seeds of the study's failed "
                              "trials; their finished seeds are reused.", shown=True)
    allow_code_change: bool = _opt(False, "--allow-code-change", "Continue a study whose code (the command's files, "
                                   "watch:, rlvrlab's source) changed; new seed runs are tagged with the new "
                                   "rlvrlab.code_digest.", shown=True)
    seed_timeout: Optional[str] = _opt(None, "--seed-timeout", "Seconds a seed run may take (launcher process, "
                                       "command sweeps): then its processes are stopped and the seed fails. Default: "
                                       "the file's seed_timeout:.")
    confirm_seeds: Optional[int] = _opt(None, "--confirm-seeds", "Fresh seeds for the best trial and the baseline "
                                        "once the search is done (over the file's confirm.seeds; the file names "
                                        "confirm.baseline).", minimum=2)
    testbed: Optional[Testbed] = None  # --protocol: the initial model its test bed fixes (rlvrlab.tracking.testbed)


def run(sweep_file: str, overrides: list[str], request: SweepRequest, *, on_progress: Callable,
        warn: Callable[[str], None]):
    """The sweep the request asks for (rlvrlab.sweep.workers.run_sweep_file): its Sweep once run, or with --status
    once opened. A --seed-timeout given overrides the file's seed_timeout:."""
    from rlvrlab.sweep.workers import run_sweep_file

    return run_sweep_file(sweep_file, overrides, seeds=request.seeds, study=request.name, launcher=request.launcher,
                          nproc=request.nproc, gpus_per_run=request.gpus_per_run, slurm=list(request.slurm),
                          storage=request.storage, workers=request.workers, status_only=request.status,
                          on_progress=on_progress, oversubscribe=request.oversubscribe,
                          keep_going=request.keep_going, retry_failed=request.retry_failed,
                          allow_code_change=request.allow_code_change, testbed=request.testbed, warn=warn,
                          confirm_seeds=request.confirm_seeds,
                          **({"seed_timeout": request.seed_timeout} if request.seed_timeout is not None else {}))
