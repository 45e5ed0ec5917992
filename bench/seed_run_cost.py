"""CPU per seed run of one toy-grid cell, with MLflow tracking and without, side by side in one process.

    .venv/bin/python bench/seed_run_cost.py [RUNS]                       (RUNS = 6 seeds per side)
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/seed_run_cost.py   (the same for another checkout)

The cell is sweeps/tau_eps_staleness_grid.yaml's ucpo / ppo_epochs=2 with tau 0.2, eps_high 0.28, staleness 1 and
the sweep's logging (every 10th step and the objective's last 20): 200 steps, checkpoints every 50. All runs of a
side share one output folder (one MLflow store, as a sweep's seed runs do); one untimed run first warms it and the
imports. One torch thread (bench/README.md explains why). The difference of the two lines is what recording a seed
run costs: creating the MLflow run, its params and tags, and its metric points (written on the tracker's thread,
counted here: the process's CPU time).
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time

import torch

CELL = ["algorithm=ucpo", "trainer.ppo_epochs=2", "tracking.log_every=10", "tracking.log_last=20",
        "algorithm.tau=0.2", "algorithm.eps_high=0.28", "trainer.staleness=1", "trainer.checkpoint_every=50"]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_run(runs: int, extra: list[str]) -> tuple[float, float]:
    """(CPU s, wall s) per seed run of the cell with `extra` overrides."""
    from rlvrlab.config import compose
    from rlvrlab.train.loop import train

    out = tempfile.mkdtemp(prefix="seed_run_cost_")
    train(compose("toy", [*CELL, *extra, f"output_dir={out}"]))
    cpu, wall = cpu_seconds(), time.perf_counter()
    for seed in range(runs):
        train(compose("toy", [*CELL, *extra, f"output_dir={out}", f"seed={seed}"]))
    return (cpu_seconds() - cpu) / runs, (time.perf_counter() - wall) / runs


def main(argv: list[str]) -> None:
    import rlvrlab

    torch.set_num_threads(1)
    runs = int(argv[0]) if argv else 6
    print(f"rlvrlab from {rlvrlab.__file__.rsplit('/rlvrlab/', 1)[0]}; {runs} seed runs per side")
    for label, extra in (("tracking.backend=none", ["tracking.backend=none"]), ("MLflow (sqlite)", [])):
        cpu, wall = per_run(runs, extra)
        print(f"{label:22s} {cpu:.3f} s of CPU, {wall:.3f} s wall per seed run")


if __name__ == "__main__":
    main(sys.argv[1:])
