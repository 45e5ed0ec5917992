"""verl's trainer entry on a pre-started Ray cluster, as a command sweep's command: run by
tests/integrations/test_ray_cluster.py with the python of `.venv-verl` (not rlvrlab's environment), on a cluster the
test started with `ray start --head`; RAY_ADDRESS names it, as `ray start` does on a node through
/tmp/ray/ray_current_cluster.

    python ray_cluster_check.py --report-dir DIR [HYDRA_OVERRIDE ...]

It composes verl's own `ppo_trainer` config with the overrides (the same grammar as `python -m
verl.trainer.main_ppo OVERRIDE ...`) and calls verl's own `main_ppo.run_ppo(config, TaskRunner)`: verl's ray.init
with `ray_kwargs.ray_init` (its runtime_env merged over verl's defaults), then one TaskRunner actor. The TaskRunner is
a stand-in for verl's: instead of building workers and models it does what verl's `RayPPOTrainer.fit` does with its
logger inside that actor -- `Tracking(project_name, experiment_name, trainer.logger, config)`, `log` per step,
`finish` -- and writes what the actor saw (its MLFLOW_* variables, the run the logger started) to
DIR/<experiment_name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import ray
import verl.trainer.main_ppo as main_ppo
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID")
# what the stand-in logs: verl's reward metric and a validation one (whose '@' verl's logger writes '_at_')
STEPS = [{"critic/score/mean": 0.25, "val-core/openai/gsm8k/acc/mean@4": 0.5},
         {"critic/score/mean": 0.75, "val-core/openai/gsm8k/acc/mean@4": 0.625}]


def task_runner(report_dir: Path):
    @ray.remote(num_cpus=1)
    class TaskRunner:
        def run(self, config) -> None:
            import mlflow
            from verl.utils.tracking import Tracking

            seen = {name: os.environ.get(name) for name in VARIABLES}
            tracking = Tracking(project_name=config.trainer.project_name,
                                experiment_name=config.trainer.experiment_name,
                                default_backend=config.trainer.logger,
                                config={"algorithm": OmegaConf.to_container(config.algorithm, resolve=True),
                                        "trainer": OmegaConf.to_container(config.trainer, resolve=True)})
            active = mlflow.active_run()
            for step, metrics in enumerate(STEPS):
                tracking.log(data=metrics, step=step)
            tracking.finish()
            report = {"seen": seen, "run_id": active.info.run_id if active else None,
                      "tracking_uri": mlflow.get_tracking_uri(), "pid": os.getpid()}
            (report_dir / f"{config.trainer.experiment_name}.json").write_text(json.dumps(report))

    return TaskRunner


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--report-dir", type=Path, required=True)
    args, overrides = parser.parse_known_args()
    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    print("driver MLFLOW_RUN_ID:", os.environ.get("MLFLOW_RUN_ID"), flush=True)
    main_ppo.run_ppo(config, task_runner(args.report_dir))


if __name__ == "__main__":
    main()
