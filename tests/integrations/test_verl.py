"""rlvrlab's UCPO and UP inside verl, and verl's metric names in MLflow: runs tests/integrations/verl_check.py in
verl's environment and judges its numbers here.

verl cannot share the main environment (its hydra-core pins antlr4 4.9, rlvrlab's math-verify needs 4.13), so the
check runs as a subprocess with the python of `.venv-verl` (`make verl-env`), or of $RLVRLAB_VERL_PYTHON. A missing
environment is a failure, not a skip: CI runs this test (`make test` builds the environment first).

What it shows (verl 0.9.1, CPU; measured figures in brackets):
- `import verl` alone registers `ucpo` and `up` (rlvrlab's verl.plugins entry point);
- on 5 random batches (6 prompts x 4 responses, shuffled rows, binary rewards, an all-correct and an all-wrong
  group), verl's `get_adv_estimator_fn("ucpo")` and verl's own trainer step `compute_advantage(DataProto, "ucpo")`
  give rlvrlab's `ucpo` advantages and returns (max |diff| 0: the same function); verl's built-in `grpo` gives
  rlvrlab's `grpo` on those batches (0) and on uniform rewards (8.3e-7: verl sums group statistics in float32,
  rlvrlab in float64), and differs where rlvrlab documents it does (D1: 7 x 0.7 gives verl 0.056, rlvrlab 0; D2: a
  response without siblings gives verl r/(1+eps), rlvrlab 0);
- on 64 cases (4 random batches x 4 loss_agg_modes x local or global batch counts x with or without
  rollout_is_weights), verl's `get_policy_loss_fn("up")` gives rlvrlab's UP-over-clip loss, gradient and clip
  metrics (max |diff| 0), and with no positive advantage it is verl's `vanilla` loss (loss 7e-7: float32 sums in
  another order; gradient 0; metrics 3e-9);
- verl's `Tracking(default_backend=["mlflow"])`, given MLFLOW_RUN_ID of a run rlvrlab created, writes its metrics
  into that run under the names `rlvrlab.integrations.verl_metrics.mlflow_key` predicts ('@' -> '_at_').
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvrlab.integrations.verl_metrics import VERL_METRICS, mlflow_key, val_metric

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "integrations" / "verl_check.py"
MARKER = "VERL_CHECK_RESULT "
ATOL = 1e-6

# verl's raw names, as its trainers put them in the dict they log (the validation ones with '@', one data source
# with a character MLflow refuses and a doubled slash)
LOGGED = [*VERL_METRICS.values(), "val-core/openai/gsm8k/acc/mean@4", "val-core/openai/gsm8k/acc/best@4/mean",
          "val-core/openai/gsm8k/acc/maj@4/mean", "val-aux/openai/gsm8k/reward/mean@1",
          "val-core/my+data//acc/mean@4", "timing_s/gen", "perf/throughput"]


def verl_python() -> Path:
    return Path(os.environ.get("RLVRLAB_VERL_PYTHON") or REPO / ".venv-verl" / "bin" / "python")


@pytest.mark.heavy
@pytest.mark.slow
def test_ucpo_and_up_in_verl_are_rlvrlabs_and_verl_logs_the_documented_names(tmp_path: Path) -> None:
    import mlflow

    from rlvrlab.tracking import tags as T
    from rlvrlab.tracking.store import store

    python = verl_python()
    if not python.exists():
        pytest.fail(f"no verl environment at {python}: run `make verl-env` (or set RLVRLAB_VERL_PYTHON)")
    # the run a command sweep's seed would be: created by rlvrlab, then handed to the trainer by MLFLOW_RUN_ID
    uri = store(tmp_path).uri
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("verl_names")
    run_id = client.create_run(experiment, run_name="trial 0 seed 0",
                               tags={T.ROLE: "seed", T.SEED: "0", T.CONFIG_HASH: "0123456789ab"}).info.run_id
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "MLFLOW_"))}
    env.update(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri, MLFLOW_RUN_ID=run_id, VERL_USE_EXTERNAL_MODULES="",
               TOKENIZERS_PARALLELISM="false", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([str(python), str(SCRIPT), "--metric-names", json.dumps(LOGGED)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + "\n" + proc.stderr[-8000:])
        pytest.fail(f"verl_check.py failed (exit {proc.returncode}); its output is above")
    res = json.loads(lines[-1][len(MARKER):])
    print("\nverl check:\n" + "\n".join(f"  {k}: {json.dumps(v)}" for k, v in res.items() if k != "sanitized_by_rlvrlab"))

    assert res["verl_version"] == "0.9.1", res["verl_version"]  # the version these signatures were read from
    assert res["registered_on_import_verl"], "rlvrlab's verl.plugins entry point did not register ucpo/up"
    assert res["v1_compute_advantage_wrapped"], "verl's v1 trainer would call ucpo without old_log_probs"

    # UCPO and GRPO: verl's registry (and verl's trainer step) against rlvrlab's functions
    est = res["estimator_max_abs_diff"]
    assert res["ucpo_nonzero_tokens"] > 100  # the comparison is not over zeros
    for key in ("ucpo", "ucpo_trainer", "ucpo_returns", "grpo_binary", "grpo_uniform"):
        assert est[key] <= ATOL, (key, est[key])
    assert res["grpo_d1_verl_max_abs"] > 0.05 and res["grpo_d2_verl"] > 0.99  # D1, D2 (rlvrlab gives 0 for both)
    assert res["ucpo_without_old_log_probs"].startswith("ConfigError") and "old_log_probs" in \
        res["ucpo_without_old_log_probs"]

    # UP: loss, gradient and verl's metrics; with no A > 0 token it is verl's vanilla loss
    loss = res["loss_max_abs_diff"]
    assert res["loss_cases"] == 64
    for key in ("loss", "grad", "metrics", "vanilla_grad_all_negative", "vanilla_metrics_all_negative"):
        assert loss[key] <= ATOL, (key, loss[key])
    assert loss["vanilla_loss_all_negative"] <= 1e-5, loss  # float32 sums in another order (measured 7e-7)

    # verl's MLflow logger wrote into rlvrlab's run, under the names rlvrlab predicts
    assert res["sanitized_by_rlvrlab"] == {name: mlflow_key(name) for name in LOGGED}
    run = client.get_run(run_id)
    stored = set(run.data.metrics)
    assert stored == {mlflow_key(name) for name in LOGGED}, stored ^ {mlflow_key(name) for name in LOGGED}
    assert set(VERL_METRICS.values()) <= stored  # verl's training names need no sanitising
    assert val_metric("openai/gsm8k", 4) == "val-core/openai/gsm8k/acc/mean_at_4" in stored
    assert val_metric("openai/gsm8k", 4, stat="maj") in stored and "val-core/my_data/acc/mean_at_4" in stored
    history = client.get_metric_history(run_id, VERL_METRICS["reward"])
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5)]
    assert run.data.tags[T.ROLE] == "seed" and run.data.params.get("algorithm/adv_estimator") == "ucpo"
    assert run.info.status == "FINISHED"  # verl's Tracking.finish() ends the run it re-attached to


def test_mlflow_key_is_verls_sanitiser_on_hand_worked_names() -> None:
    """verl/utils/tracking.py's rule, worked by hand: '@' first, then slashes, then refused characters."""
    assert mlflow_key("val-core/openai/gsm8k/reward/mean@16") == "val-core/openai/gsm8k/reward/mean_at_16"
    assert mlflow_key("val-aux/a//b/acc/best@4/std") == "val-aux/a/b/acc/best_at_4/std"
    assert mlflow_key("val-core/x+y (v2)/acc/mean@1") == "val-core/x_y _v2_/acc/mean_at_1"
    assert all(mlflow_key(name) == name for name in VERL_METRICS.values())
    assert val_metric("gsm8k", 8, var="reward", stat="best") == "val-core/gsm8k/reward/best_at_8/mean"
    from rlvrlab.errors import ConfigError

    with pytest.raises(ConfigError, match="give stat="):
        val_metric("gsm8k", 8, stat="median")
