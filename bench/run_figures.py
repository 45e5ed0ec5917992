"""Print the speed and agreement figures of one finished rlvrlab run from its MLflow store.

    python bench/run_figures.py OUTPUT_DIR [RUN_ID]      (the newest run of OUTPUT_DIR/mlflow.db by default)

Steady-state means skip step 0 (engine warm-up, first compile).
"""

import statistics
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient


def main(output_dir: str, run_id: str | None = None) -> None:
    client = MlflowClient(f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}")
    if run_id is None:
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()], order_by=["start_time DESC"],
                                  max_results=1)
        run_id = runs[0].info.run_id

    def series(name: str) -> list[float]:
        points = sorted(client.get_metric_history(run_id, name), key=lambda m: m.step)
        return [m.value for m in points]

    def steady(name: str) -> float:
        values = series(name)
        return statistics.mean(values[1:] if len(values) > 1 else values)

    run = client.get_run(run_id)
    print(f"run {run_id}  {run.data.tags.get('model')}  rollout engine {run.data.params.get('rollout.engine')}  "
          f"update engine {run.data.params.get('trainer.engine')} (ZeRO {run.data.params.get('trainer.zero_stage')})  "
          f"{len(series('time/step'))} steps")
    print(f"  rollout tokens/s      {steady('rollout/tokens_per_s'):10.1f}")
    print(f"  generate s/step       {steady('time/generate'):10.3f}")
    print(f"  update s/step         {steady('time/update'):10.3f}")
    print(f"  weight sync s/step    {steady('time/sync'):10.3f}")
    print(f"  step s                {steady('time/step'):10.3f}")
    print(f"  logp gap max (all)    {max(series('rollout/logp_gap_max')):10.2e}")
    print(f"  logp gap mean         {steady('rollout/logp_gap_mean'):10.2e}")


if __name__ == "__main__":
    main(*sys.argv[1:])
