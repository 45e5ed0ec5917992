"""Everything a run needs, built from a RunConfig before the first step: data, policy, engines, tracker.

Bad paths and unreadable data fail here, in one line, before any model is loaded or any MLflow run exists.
"""

from __future__ import annotations

import copy
import functools
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvrlab.algorithms import BoundAlgorithm, bind_algorithm
from rlvrlab.config.compose import config_hash, to_yaml
from rlvrlab.config.schema import DatasetConfig, RunConfig
from rlvrlab.data import load_split
from rlvrlab.data.problems import Problem
from rlvrlab.errors import RlvrlabError
from rlvrlab.policy.toy import ToyDiagnostics
from rlvrlab.rewards.pool import RewardPool, default_workers
from rlvrlab.rollout.base import RolloutEngine
from rlvrlab.tracking.base import NullTracker, Tracker
from rlvrlab.update.base import UpdateEngine
from rlvrlab.update.dist import world


@dataclass
class Run:
    cfg: RunConfig
    problems: list[Problem]  # training problems (the data stream cycles through them)
    prompt_ids: Callable[[Problem], list[int]]
    verifier: RewardPool  # scores whole batches (isolated verifiers in worker processes); closed by train()
    update: UpdateEngine
    rollout: RolloutEngine
    reference: torch.nn.Module | None  # frozen initial policy, when algorithm.kl_coef > 0
    tracker: Tracker
    rank: int
    world_size: int
    pad_id: int
    run_dir: Path  # <output_dir>/<run id>: resolved config, checkpoints
    save_model: Callable[[torch.nn.Module, Path], None]  # weights as safetensors (+ tokenizer): a loadable folder
    toy_diagnostics: Callable[[], ToyDiagnostics] | None  # exact toy-policy collapse measures
    algorithm: BoundAlgorithm  # estimator, loss and loss terms with their knobs bound once from cfg.algorithm


def cache_root() -> Path:
    return Path(os.environ.get("RLVRLAB_CACHE") or Path.home() / ".cache" / "rlvrlab")


def model_folder(cfg: RunConfig, problems: list[Problem]) -> Path:
    """The HF folder of the tiny or real tier (the tiny one is built and warm-started once, then cached)."""
    if cfg.model.tier == "real":
        folder = Path(cfg.model.path).expanduser()
        if not (folder / "config.json").is_file():
            what = "does not exist" if not folder.exists() else "has no config.json"
            raise RlvrlabError(f"model.path {folder} {what}; point it at a Hugging Face model folder "
                               "(config.json, weights, tokenizer)")
        return folder
    from rlvrlab.policy.tiny import tiny_model_folder

    return tiny_model_folder(layers=cfg.model.tiny_layers, hidden=cfg.model.tiny_hidden, heads=cfg.model.tiny_heads,
                             warmstart_steps=cfg.model.warmstart_steps, problems=problems, seed=0,
                             cache_root=cache_root())


def build(cfg: RunConfig, *, run_id: str | None = None, tags: Mapping[str, str] | None = None) -> Run:
    """Wire a run. run_id: continue that MLflow run (resume) instead of creating one. tags: extra MLflow tags of a
    new run (a sweep nests its seed runs with mlflow.parentRunId)."""
    rank, world_size = world()
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
    if cfg.model.tier == "toy":
        parts = _toy_parts(cfg, problems, world_size)
    else:
        parts = _hf_parts(cfg, model_folder(cfg, problems), world_size)
    module, engine, prompt_ids, pad_id, save_model, reference, toy_diagnostics = parts

    output_dir = Path(cfg.output_dir).expanduser().resolve()
    tracker = _tracker(cfg, output_dir, run_id, rank, tags or {})
    run_id = _broadcast(tracker.run_id if rank == 0 else None)
    run_dir = output_dir / run_id
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return Run(cfg, problems, prompt_ids, reward_pool(cfg, world_size), module, engine, reference, tracker, rank,
               world_size, pad_id, run_dir, save_model, toy_diagnostics, algorithm=bind_algorithm(cfg.algorithm))


def reward_pool(cfg: RunConfig, world_size: int = 1) -> RewardPool:
    """The dataset's verifier as a RewardPool (workers start on the first batch that needs them). With
    verifier_workers=0 the cores are shared among the processes of this node, not taken by each."""
    d = cfg.dataset
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    workers = d.verifier_workers or max(1, default_workers() // max(1, local))
    return RewardPool(d.verifier, workers=workers, timeout_s=d.verifier_timeout, math_extraction=d.math_extraction)


def _toy_parts(cfg: RunConfig, problems: list[Problem], world_size: int):
    from safetensors.torch import save_file

    from rlvrlab.policy.toy import ToyPolicy, diagnostics
    from rlvrlab.rollout.toy_engine import ToyEngine
    torch.manual_seed(cfg.seed)
    policy = ToyPolicy.initial(problems, num_responses=cfg.model.toy_num_responses, init=cfg.model.toy_init,
                               skew=cfg.model.toy_init_skew)
    reference = copy.deepcopy(policy).requires_grad_(False) if cfg.algorithm.kl_coef > 0 else None
    update = _update_engine(cfg, policy, world_size)
    engine = ToyEngine(policy.logits, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)

    def save_model(module: torch.nn.Module, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(folder / "model.safetensors"))

    return (update, engine, lambda p: [int(p.prompt)], 0, save_model, reference,
            lambda: diagnostics(update.module, problems))


def _hf_parts(cfg: RunConfig, folder: Path, world_size: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars would break rich's

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        torch.manual_seed(cfg.seed)
        # the trainer keeps fp32 weights (DeepSpeed bf16 computes in bf16 from fp32 masters)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise RlvrlabError(f"model folder {folder} could not be loaded ({str(error).splitlines()[0]}); "
                           "check that it is a complete Hugging Face causal-LM folder") from None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()  # no dropout: the behaviour and current log-probs of the same weights must agree
    reference = copy.deepcopy(model).to(dtype).requires_grad_(False) if cfg.algorithm.kl_coef > 0 else None
    engine = _rollout_engine(cfg, folder, model, tokenizer)
    update = _update_engine(cfg, model, world_size)
    if reference is not None:
        reference.to(next(update.module.parameters()).device)

    def save_model(module: torch.nn.Module, out: Path) -> None:
        module.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)

    return update, engine, prompt_renderer(cfg.dataset, tokenizer), pad_id, save_model, reference, None


def _rollout_engine(cfg: RunConfig, folder: Path, model: torch.nn.Module, tokenizer) -> RolloutEngine:
    r = cfg.rollout
    if r.engine == "vllm":
        from rlvrlab.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_path=str(folder), temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                          gpu_memory_utilization=r.vllm_gpu_memory_utilization, dtype=cfg.model.dtype,
                          seed=cfg.seed)
    from rlvrlab.rollout.hf_engine import HFEngine

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return HFEngine(copy.deepcopy(model).to(device=device, dtype=dtype), tokenizer, temperature=r.temperature,
                    top_p=r.top_p, max_new_tokens=r.max_new_tokens)


def _update_engine(cfg: RunConfig, model: torch.nn.Module, world_size: int) -> UpdateEngine:
    t = cfg.trainer
    common = dict(lr=t.lr, weight_decay=t.weight_decay, betas=tuple(t.betas), grad_clip=t.grad_clip)
    if t.engine == "torch":
        from rlvrlab.update.torch_engine import TorchEngine

        return TorchEngine(model, **common)
    from rlvrlab.update.deepspeed_engine import DeepSpeedEngine

    rows_per_mini = cfg.rollout.prompts_per_step // world_size * cfg.rollout.group_size // t.mini_batches
    micro = min(t.micro_batch_size, rows_per_mini)
    return DeepSpeedEngine(model, **common, zero_stage=t.zero_stage, bf16=cfg.model.dtype == "bfloat16", micro_batch_size=micro,
                           accumulation_steps=-(-rows_per_mini // micro), world_size=world_size)


def prompt_renderer(dataset: DatasetConfig, tokenizer) -> Callable[[Problem], list[int]]:
    """Problem -> prompt token ids, as training and evaluation both render them.

    The question goes through dataset.template; so do the questions of dataset.fewshot. With
    dataset.use_chat_template the system prompt is the system turn and each example a user and an assistant turn
    before the question's user turn; without it they are paragraphs ("system\n\nQ1 A1\n\nQ2 A2\n\nQ")."""
    template, chat, system = dataset.template, dataset.use_chat_template, dataset.system_prompt
    shots = [(template.format(prompt=q) if template else q, a) for q, a in dataset.fewshot]

    def prompt_ids(problem: Problem) -> list[int]:
        text = template.format(prompt=problem.prompt) if template else problem.prompt
        if chat:
            turns = [{"role": "system", "content": system}] if system else []
            for question, answer in shots:
                turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            turns.append({"role": "user", "content": text})
            return list(tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True,
                                                      return_dict=False))
        paragraphs = ([system] if system else []) + [f"{q} {a}" for q, a in shots] + [text]
        return tokenizer("\n\n".join(paragraphs)).input_ids

    return prompt_ids


def _tracker(cfg: RunConfig, output_dir: Path, run_id: str | None, rank: int, tags: Mapping[str, str]) -> Tracker:
    if rank != 0:
        return NullTracker(run_id or "")
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker, default_uri

    output_dir.mkdir(parents=True, exist_ok=True)
    uri = cfg.tracking.uri or default_uri(output_dir)
    artifacts = None if cfg.tracking.uri else output_dir / "mlartifacts"
    name = f"{cfg.algorithm.name}-{cfg.model.tier}-{cfg.dataset.name}-s{cfg.seed}"
    tracker = MlflowTracker(uri, cfg.experiment, artifact_root=artifacts, run_id=run_id, run_name=name, tags=tags)
    if run_id is None:
        _record_run(tracker, cfg)
    return tracker


def _record_run(tracker: Tracker, cfg: RunConfig) -> None:
    """Params, tags and artifacts that make the run reproducible and groupable (config hash without seed)."""
    from omegaconf import OmegaConf

    flat = _flatten(OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))
    tracker.log_params(flat)
    sha, dirty, diff = _git_state()
    tracker.set_tags({
        "algorithm": cfg.algorithm.name, "model": cfg.model.path or cfg.model.tier, "dataset": cfg.dataset.name,
        "config_hash": config_hash(cfg), "seed": str(cfg.seed), "git_sha": sha, "git_dirty": str(dirty).lower(),
        "tier": cfg.model.tier,
    })
    tracker.log_text(to_yaml(cfg), "config.yaml")
    tracker.log_text(_packages(), "packages.txt")
    if dirty:
        tracker.log_text(diff, "git.diff")


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _git_state() -> tuple[str, bool, str]:
    """(commit, dirty, diff against HEAD) of the rlvrlab checkout that runs; ("unknown", False, "") outside git."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    try:
        sha = git("rev-parse", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
        return sha, dirty, git("diff", "HEAD") if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False, ""


@functools.lru_cache(maxsize=1)
def _packages() -> str:
    """Installed distributions (~90 ms to read; once per process: a sweep trains many runs in one). A distribution
    whose metadata cannot be read (pip installing into the environment meanwhile) is skipped, not fatal."""
    from importlib.metadata import distributions

    names = set()
    for dist in distributions():
        try:
            names.add(f"{dist.metadata['Name']}=={dist.version}")
        except Exception:
            continue
    return "\n".join(sorted(names)) + "\n"


def _broadcast(value: str | None) -> str:
    """Rank 0's run id to every rank (they share the run folder for DeepSpeed's sharded checkpoints)."""
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value or ""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
