"""Everything a run needs, built from a RunConfig before the first step: data, policy, engines, tracker.

Bad paths and unreadable data fail here, in one line, before any model is loaded or any MLflow run exists.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch

from rlvrlab import components, outputs, rundir
from rlvrlab.algorithms import BoundAlgorithm, bind_algorithm
from rlvrlab.config.compose import compose, legacy_overrides, to_yaml
from rlvrlab.config.schema import RunConfig
from rlvrlab.data import load_split
from rlvrlab.data.problems import Problem
from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.rewards.pool import RewardPool
from rlvrlab.rollout.base import RolloutEngine
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.base import NullTracker, Tracker
from rlvrlab.tracking.identity import environment_tags
from rlvrlab.tracking.provenance import provenance, record_run
from rlvrlab.tracking.store import store
from rlvrlab.tracking.testbed import Testbed
from rlvrlab.train import heldout
from rlvrlab.train.heldout import HeldOut
from rlvrlab.train.logprobs import can_share_prompt
from rlvrlab.train.packing import shared_cache_ratio
from rlvrlab.update.base import UpdateEngine
from rlvrlab.update.dist import barrier, setup_distributed, waiting

RESUMABLE_OVERRIDES = ("output_dir=", "tracking.", "steps=", "trainer.dist_timeout_minutes=")


def run_config(experiment: str | None, overrides: list[str], *, resume: str | None = None) -> RunConfig:
    """The configuration `rlvrlab train` runs: composed from the experiment and overrides, or (resume) the run's
    own resolved config with the few overrides a resumed run may take."""
    if resume:
        return _resumed_config(resume, experiment, overrides)
    return compose(experiment, overrides)


def _resumed_config(run_id: str, experiment: str | None, overrides: list[str]) -> RunConfig:
    """The run's own config.yaml; overrides may only say where the run is (output_dir=, tracking.uri=), extend it
    (steps= larger than its steps) and how long its ranks wait for each other (trainer.dist_timeout_minutes=, e.g.
    after a run ended on that timeout). Anything else would rewrite the history of the run, and is refused."""
    bad = [o for o in overrides if not o.startswith(RESUMABLE_OVERRIDES)] + ([experiment] if experiment else [])
    if bad:
        raise ConfigError(f"--resume continues a run with its own config; {bad[0]!r} cannot change it "
                          f"(only {ALLOWED_ON_RESUME} can be given)")
    output_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("output_dir=")), RunConfig.output_dir)
    saved = rundir.config_file(rundir.run_dir(output_dir, run_id))
    if not saved.is_file():
        raise ConfigError(f"--resume {run_id}: {saved} does not exist; pass output_dir= of the run to resume")
    legacy = legacy_overrides(saved)  # what an older config.yaml meant when it was written
    own = compose(saved, legacy)
    cfg = compose(saved, [*legacy, *overrides])
    if cfg.steps < own.steps:
        raise ConfigError(f"--resume {run_id}: steps={cfg.steps} would shorten the run, which has steps "
                          f"{own.steps}; --resume only continues a run or extends it (give steps= larger than "
                          f"{own.steps}, or none)")
    changed = [key for key, value in _flat(cfg).items()
               if key not in _WHERE + ("steps", "trainer.dist_timeout_minutes") and value != _flat(own).get(key)]
    if changed:
        raise ConfigError(f"--resume {run_id}: {changed[0]} differs from the run's own config.yaml; --resume "
                          f"continues a run with its own config (only {ALLOWED_ON_RESUME} can be given)")
    return cfg


_WHERE = ("output_dir", "tracking.uri")  # where the run and its records are: not part of its history
ALLOWED_ON_RESUME = "output_dir=, tracking.uri=, trainer.dist_timeout_minutes= and a larger steps="


def _flat(cfg: RunConfig) -> dict[str, object]:
    out: dict[str, object] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            out[prefix] = value

    walk("", asdict(cfg))
    return out


@dataclass(kw_only=True)
class Run:
    """A run as its steps see it; built by build() only."""

    cfg: RunConfig
    problems: list[Problem]  # training problems (the data stream cycles through them)
    policy: components.Policy  # the tier's policy and engines (rlvrlab.components.policy)
    verifier: RewardPool  # scores whole batches (isolated verifiers in worker processes); closed by train()
    tracker: Tracker
    rank: int
    world_size: int
    run_dir: Path  # <output_dir>/<run id>: resolved config, checkpoints
    algorithm: BoundAlgorithm  # estimator, loss and loss terms with their knobs bound once from cfg.algorithm
    heldout: HeldOut | None = None  # trainer.eval_every's evaluation (rlvrlab.train.heldout), None when off
    # the update shares a prompt's forward among its rows (share_prompt): one position of the repeated KV cache
    # relative to one token's activations, which packing by length charges (rlvrlab.train.packing.micro_batches)
    shared_cache: float | None = None
    left_regime: bool = False  # the held-out group signal has fallen below its floor (tagged once)

    @property
    def update(self) -> UpdateEngine:
        return self.policy.update

    @property
    def rollout(self) -> RolloutEngine:
        return self.policy.rollout

    @property
    def reference(self) -> torch.nn.Module | None:
        return self.policy.reference

    @property
    def prompt_ids(self) -> Callable[[Problem], list[int]]:
        return self.policy.prompt_ids

    @property
    def pad_id(self) -> int:
        return self.policy.pad_id

    @property
    def eos_id(self) -> int | None:
        return self.policy.eos_id

    @property
    def tokenizer(self) -> object | None:
        return self.policy.tokenizer


def build(cfg: RunConfig, *, run_id: str | None = None, tags: Mapping[str, str] | None = None,
          testbed: Testbed | None = None) -> Run:
    """Wire a run. run_id: continue that MLflow run (resume) instead of creating one. tags: extra MLflow tags of a
    new run (a sweep nests its seed runs with mlflow.parentRunId). A new run is also tagged with its initial model's
    digest and source and the environment (rlvrlab.tracking.identity); testbed: a protocol's fixed initial model,
    checked once the policy is built and before any run is created or resumed (a one-line error when it differs;
    an allowed difference is tagged).

    Order (rlvrlab.update.dist): this rank's device and the full process group first, then the rollout engine
    (vLLM joins the group through its external launcher), then the update engine, then a barrier."""
    placement = setup_distributed(timedelta(minutes=cfg.trainer.dist_timeout_minutes), device=cfg.trainer.device,
                                  rollout_engine=cfg.rollout.engine)
    rank, world_size = placement.rank, placement.world_size
    if cfg.trainer.world_size is not None and cfg.trainer.world_size != world_size:
        raise RlvrlabError(f"trainer.world_size={cfg.trainer.world_size} but this launch has {world_size} "
                           f"process(es); launch {cfg.trainer.world_size} ranks (torchrun --nproc_per_node "
                           f"{cfg.trainer.world_size} ...) or set trainer.world_size={world_size}")
    per_rank, rest = divmod(cfg.rollout.prompts_per_step, world_size)
    if rest:
        raise RlvrlabError(f"rollout.prompts_per_step ({cfg.rollout.prompts_per_step}) must be divisible by the "
                           f"number of processes ({world_size}); change one of them")
    if (per_rank * cfg.rollout.group_size) % cfg.trainer.mini_batches:
        raise RlvrlabError(f"each of the {world_size} processes trains on {per_rank * cfg.rollout.group_size} "
                           f"responses, which trainer.mini_batches ({cfg.trainer.mini_batches}) must divide")
    if world_size > 1 and cfg.trainer.engine != "deepspeed":
        raise RlvrlabError(f"{world_size} processes need trainer.engine=deepspeed (data parallel); "
                           "the torch engine trains in one process")
    problems = load_split(cfg.dataset, cfg.model)  # dataset.split: train (default), eval or all
    policy = components.policy(cfg, problems, placement)
    assert policy.initial is not None  # every tier's policy digests its initial weights (rlvrlab.components)
    allowed = testbed.check(policy.initial.sha256) if testbed is not None else {}
    tags = {**(tags or {}), **policy.initial.tags(), **allowed, **environment_tags()}

    output_dir = Path(cfg.output_dir).expanduser().resolve()
    if rank == 0:  # a new default folder gets a .gitignore of `*` (an existing one is left as it is)
        outputs.make_output_dir(output_dir, default=cfg.output_dir == RunConfig.output_dir)
    resumed = run_id is not None
    tracker, resolved = _tracker(cfg, output_dir, run_id, rank, tags)
    try:
        run_id = _broadcast(tracker.run_id if rank == 0 else None)
        run_folder = rundir.run_dir(output_dir, run_id)
        if rank == 0:
            run_folder.mkdir(parents=True, exist_ok=True)
            outputs.write_replacing(rundir.config_file(run_folder), resolved if resolved is not None else to_yaml(cfg))
        evaluation = _heldout(cfg, policy)
        if rank == 0 and evaluation is not None:
            tracker.set_tags({T.EVAL_METHOD: evaluation.method})
        barrier("the end of the setup")  # every rank's engines are built before any rank starts sampling
        return Run(cfg=cfg, problems=problems, policy=policy, verifier=components.reward_pool(cfg.dataset, world_size),
                   tracker=tracker, rank=rank, world_size=world_size, run_dir=run_folder,
                   algorithm=bind_algorithm(cfg.algorithm), heldout=evaluation,
                   shared_cache=_shared_cache(cfg, policy.update.module))
    except BaseException as error:
        _end_unbuilt(tracker, error, resumed=resumed)
        raise


def _end_unbuilt(tracker: Tracker, error: BaseException, *, resumed: bool) -> None:
    """A run whose setup failed once its record existed is not left RUNNING: a new run ends FAILED with its reason
    (KILLED when it was stopped), a resumed one goes back to the status it had. Best effort: the setup's own error
    is the one raised."""
    try:
        if resumed:
            tracker.finish(getattr(tracker, "prior_status", "FAILED"))
        elif isinstance(error, Exception):
            tracker.set_tags({T.FAIL_REASON: T.failure_reason(error)})
            tracker.finish("FAILED")
        else:  # KeyboardInterrupt, SystemExit: a stop
            tracker.finish("KILLED")
    except Exception:  # noqa: BLE001 - the store may refuse this too
        pass


def share_prompt(cfg: RunConfig) -> bool:
    """trainer.share_prompt where it applies: not under ZeRO-3 (its parameters are gathered per forward, and two
    forwards per micro-batch are untested there) nor gradient checkpointing (transformers turns the KV cache off
    in training with it). The toy policy falls back by itself (rlvrlab.train.logprobs.can_share_prompt)."""
    t = cfg.trainer
    return t.share_prompt and t.zero_stage < 3 and not t.gradient_checkpointing


def _shared_cache(cfg: RunConfig, module: torch.nn.Module) -> float | None:
    """Run.shared_cache: None unless the update shares prompts (a transformers model of a known shape,
    share_prompt on)."""
    if not (share_prompt(cfg) and can_share_prompt(module)):
        return None
    return shared_cache_ratio(module.config)


def _heldout(cfg: RunConfig, policy: components.Policy) -> HeldOut | None:
    """trainer.eval_every's evaluation; an exact task whose listed answers have a second tokenization under this
    tokenizer is evaluated by sampling instead (its probabilities would not be the answers' whole probability)."""
    evaluation = heldout.make(cfg)
    if evaluation is not None and evaluation.method == "exact":
        from rlvrlab.policy.exact import single_tokenization

        assert evaluation.space is not None
        texts = sorted({t for p in evaluation.heldout + evaluation.train for t in evaluation.space(p)})
        if single_tokenization(policy.tokenizer, texts) is not None:
            evaluation = HeldOut("sampled", evaluation.heldout, [], None)
    return evaluation


def _tracker(cfg: RunConfig, output_dir: Path, run_id: str | None, rank: int,
             tags: Mapping[str, str]) -> tuple[Tracker, str | None]:
    """This rank's tracker, and for a new run on rank 0 the resolved config YAML it recorded (else None)."""
    if rank != 0:
        return NullTracker(run_id or ""), None
    if cfg.tracking.backend == "none":  # nothing recorded; the id names the run folder (as an MLflow run id would)
        return NullTracker(run_id or uuid.uuid4().hex), None
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker

    output_dir.mkdir(parents=True, exist_ok=True)
    where = store(output_dir, cfg.tracking.uri)
    name = f"{cfg.algorithm.name}-{cfg.model.tier}-{cfg.dataset.name}-s{cfg.seed}"
    if run_id is not None:  # resumed: its records are kept
        return MlflowTracker(where.uri, cfg.experiment, artifact_root=where.artifact_root, run_id=run_id), None
    made = provenance(cfg)
    tracker = MlflowTracker(where.uri, cfg.experiment, artifact_root=where.artifact_root, run_name=name,
                            tags={**tags, **made.tags})
    return tracker, record_run(tracker, cfg, made)


def _broadcast(value: str | None) -> str:
    """Rank 0's run id to every rank (they share the run folder for DeepSpeed's sharded checkpoints)."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value or ""
    box = [value]
    with waiting("the run id's broadcast (rank 0 creates the MLflow run)"):
        dist.broadcast_object_list(box, src=0)
    return box[0] or ""
