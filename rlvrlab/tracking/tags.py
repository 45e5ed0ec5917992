"""Every MLflow tag name rlvrlab writes or reads, in one place.

Training runs carry the plain tags (grouping and provenance); sweeps and evaluations add ``rlvrlab.*`` tags
that place a run in its study or link an evaluation to the run it evaluated. Optuna study and trial attributes
use the same ``rlvrlab.`` prefix (`attr`).
"""

from __future__ import annotations

PARENT = "mlflow.parentRunId"  # MLflow's own nesting tag (study -> trial -> seed runs)

# every training run (rlvrlab.tracking.provenance.run_tags)
ALGORITHM = "algorithm"
MODEL = "model"
DATASET = "dataset"
TIER = "tier"
CONFIG_HASH = "config_hash"  # the configuration without seed and output settings: the seeds of one config share it
SEED = "seed"
GIT_SHA = "git_sha"
GIT_DIRTY = "git_dirty"  # "true" | "false"
WARM_START_SEED = "warm_start_seed"  # tiny tier: the seed its initial model was built with (rlvrlab.config)

PREFIX = "rlvrlab."


def attr(name: str) -> str:
    """rlvrlab's tag (or Optuna attribute) `name`: "role" -> "rlvrlab.role"."""
    return PREFIX + name


# sweeps (rlvrlab.sweep): roles and placement in a study
ROLE = attr("role")  # "study" | "trial" | "seed"
STUDY = attr("study")
TRIAL = attr("trial")
RETRY_OF = attr("retry_of")
ATTEMPT = attr("attempt")  # on trial and seed runs: 1, then 2 for the first retry of the same params, ...
CODE_DIGEST = attr("code_digest")  # the digest of the code a seed run ran (rlvrlab.sweep.guard); on the study run too
STORAGE = attr("storage")
FINGERPRINT = attr("fingerprint")
OBJECTIVE = attr("objective")
FAIL_REASON = attr("fail_reason")  # why a run (training, trial or seed) ended FAILED: every FAILED run has it
PRUNED = attr("pruned")
BEST_TRIAL = attr("best_trial")
BEST_PARAMS = attr("best_params")
BEST_VALUE = attr("best_value")
CONFIRMATION_LINE = attr("confirmation")  # confirm: the search and confirmation estimates (rlvrlab.sweep.confirmation)
SEQUENTIAL_LINE = attr("sequential_seeds")  # pruner sequential: trials pruned early, seed runs saved

# Optuna study and trial attributes (rlvrlab.sweep)
MLFLOW_RUN_ID = attr("mlflow_run_id")  # the MLflow run of a study or trial
READY = attr("ready")  # the study's creator finished enqueueing its grid
START_KEY = attr("start_key")  # a random key of a study, also tagged on its MLflow study run: a start-up
# stopped before recording the run's id finds that run again (rlvrlab.sweep.trials._initialise)
SEEDS = attr("seeds")
VALUES = attr("values")  # a trial's objective value per seed
RUN_IDS = attr("run_ids")  # a trial's MLflow seed run per seed
SUMMARY = attr("summary")  # a trial's mean and interval over seeds
TRIAL_CONFIG_HASH = attr("config_hash")
FAILURE = attr("failure")  # why a trial failed: "run" (its seed runs), "worker" (died; retried), "pruned"
WORKER = attr("worker")  # host:pid:start of the worker running a trial
HEARTBEAT = attr("heartbeat")
DEVICES = attr("devices")  # CUDA_VISIBLE_DEVICES of the worker that ran a trial (--gpus-per-run placement)

# evaluations (rlvrlab.eval)
KIND = attr("kind")  # "eval" on evaluation runs
MODEL_PATH = attr("model_path")
EVAL_SEED = attr("seed")
DATASETS = attr("datasets")
DATASET_SHA256 = attr("dataset_sha256")  # + "." + dataset name when several
SOURCE_RUN = attr("source_run")
CHECKPOINT_STEP = attr("checkpoint_step")
EVAL_LINK = attr("eval.")  # + eval run id, set on the evaluated training run

# every training and evaluation run (rlvrlab.tracking.identity): the weights it starts from (an evaluation: the
# weights it evaluates) and the environment it ran in
INITIAL_MODEL = attr("initial_model.sha256")  # state_digest of the initial weights, after any warm start or import
# where they came from: warm_start:<cache folder>, import:<gguf sha256>, hf:<folder>@<revision>, toy:<init>,
# run:<run id>@step<N> (an evaluated checkpoint)
INITIAL_MODEL_SOURCE = attr("initial_model.source")
INITIAL_MODEL_OVERRIDE = attr("initial_model.override")  # "true": --allow-initial-model-change overrode a protocol
INITIAL_MODEL_EXPECTED = attr("initial_model.expected")  # ... whose fixed digest (```testbed) was this one
ENV_PREFIX = attr("env.")  # + each key of rlvrlab.tracking.identity.environment(): python, torch, threads, ...

# resumed training runs (rlvrlab.train.loop): the steps a run had before each `--resume steps=N` extended it, and the
# steps it has now (its `steps` param is the one it started with)
STEPS_EXTENDED_FROM = attr("resume.steps_extended_from")
STEPS = attr("steps")

# a param value longer than MLflow's limit (rlvrlab.tracking.mlflow_tracker): its key; the full value is the
# artifact params/<key>.txt
TRUNCATED_PARAMS = attr("truncated_params")

# evaluation during training (rlvrlab.train.heldout) and why a run failed
EVAL_METHOD = "eval_method"  # exact | toy | sampled: how the run's eval/ metrics were computed
NONFINITE_STEP = "nonfinite_step"  # the step at which a FAILED run's loss, gradient or weights were not finite
LEFT_REGIME_STEP = "left_regime_step"  # first evaluation at which the held-out group signal fell below the floor


# MLflow's tag values hold 8000 characters (mlflow.utils.validation.MAX_TAG_VAL_LENGTH); a reason is one line
FAIL_REASON_CHARS = 1000


def failure_reason(error: BaseException) -> str:
    """Why a run failed, for its FAIL_REASON tag: the exception's type and the first line of its message."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}"[:FAIL_REASON_CHARS] if first else type(error).__name__
