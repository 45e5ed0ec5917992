"""Side by side in one process, tiny tier on this machine: what DeepSpeed and MLflow cost the training loop.

    .venv/bin/python bench/train_overhead.py [STEPS]

1. Update time per step, plain torch AdamW vs DeepSpeed ZeRO 0/1/2 (same model, batch and seed), as ratios.
2. MLflow logging cost: the loop's per-step metrics logged through rlvrlab's tracker (buffered, log_batch on
   flush) to a fresh sqlite store, as a share of the measured step time (target: under 1%).
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from rlvrlab.config import compose
from rlvrlab.train.loop import train


def steady(output_dir: Path, run_id: str, name: str) -> float:
    client = MlflowClient(f"sqlite:///{output_dir / 'mlflow.db'}")
    values = [m.value for m in sorted(client.get_metric_history(run_id, name), key=lambda m: m.step)]
    return statistics.mean(values[2:])  # skip warm-up steps


def main(steps: int = 30) -> None:
    root = Path(tempfile.mkdtemp())
    variants = {"torch": ["trainer.engine=torch"]} | {
        f"deepspeed-zero{z}": ["trainer.engine=deepspeed", f"trainer.zero_stage={z}"] for z in (0, 1, 2)
    }
    update, step = {}, {}
    for name, overrides in variants.items():
        out = root / name
        run_id = train(compose(None, [f"steps={steps}", "trainer.checkpoint_every=0", f"output_dir={out}",
                                      *overrides]))
        update[name], step[name] = steady(out, run_id, "time/update"), steady(out, run_id, "time/step")
    print(f"tiny tier, {steps} steps each, update time per step (mean after 2 warm-up steps)")
    for name in variants:
        print(f"  {name:18s} {update[name] * 1000:8.1f} ms   ratio to torch {update[name] / update['torch']:.2f}")

    from rlvrlab.tracking.mlflow_tracker import MlflowTracker

    # the metrics of one real step, logged `steps` times
    out = root / "deepspeed-zero0"
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1)
    metrics = dict(run.data.metrics)
    tracker = MlflowTracker(f"sqlite:///{root / 'log.db'}", "logging-cost", artifact_root=root / "art")
    tic = time.perf_counter()
    for s in range(steps):
        tracker.log_metrics(s, metrics)
    tracker.flush(wait=False)
    on_loop = (time.perf_counter() - tic) / steps  # what the training thread pays
    tracker.flush(wait=True)
    written = (time.perf_counter() - tic) / steps  # until the points are in sqlite (background thread)
    base = step["deepspeed-zero0"]
    print(f"MLflow logging, {len(metrics)} metrics/step, tiny step {base * 1000:.0f} ms:")
    print(f"  on the training thread  {on_loop * 1000:.3f} ms/step = {on_loop / base:.3%} of a step")
    print(f"  sqlite write (background thread) {written * 1000:.2f} ms/step = {written / base:.2%} of a step")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
