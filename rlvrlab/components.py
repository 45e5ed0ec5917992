"""The one place components are built from config sections; training (`rlvrlab.train.setup`) and evaluation
(`rlvrlab.eval`) both build theirs here, so a model folder, a dtype, a rollout engine, an update engine, a verifier
pool or a prompt means the same thing in both.

Every builder fails with a one-line RlvrlabError naming what is wrong and how to fix it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from rlvrlab.config import memory
from rlvrlab.config.compose import warm_start_seed
from rlvrlab.config.memory import DS_BUCKET_ELEMENTS, sequence_tokens
from rlvrlab.config.rules import CHOICES
from rlvrlab.config.schema import DatasetConfig, RunConfig
from rlvrlab.data import warm_start_targets
from rlvrlab.data.problems import Problem
from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.policy import lora
from rlvrlab.policy.toy import ToyDiagnostics, ToyPolicy
from rlvrlab.rewards.pool import RewardPool, default_workers
from rlvrlab.rollout.base import RolloutEngine
from rlvrlab.tracking.identity import InitialModel, module_digest
from rlvrlab.update.base import UpdateEngine
from rlvrlab.update.dist import Placement

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SaveModel = Callable[[torch.nn.Module, Path, "dict | None"], None]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # model.dtype -> torch


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise RlvrlabError(f"dtype {name!r} is not one of {', '.join(DTYPES)}") from None


def cache_root() -> Path:
    """Where built artefacts (the tiny tier's warm-started models) are cached: $RLVRLAB_CACHE or ~/.cache/rlvrlab."""
    return Path(os.environ.get("RLVRLAB_CACHE") or Path.home() / ".cache" / "rlvrlab")


def check_model_folder(folder: Path, what: str = "model folder") -> Path:
    """`folder` resolved, when it is a Hugging Face model folder (has config.json); else a one-line error."""
    resolved = Path(folder).expanduser().resolve()
    if (resolved / "adapter_config.json").is_file() and not (resolved / "config.json").is_file():
        raise RlvrlabError(f"{what} {folder} is a LoRA adapter, not a model; give the merged model folder beside "
                           f"it ({resolved.parent}, in a checkpoint) or make one: rlvrlab model import {folder}")
    if not (resolved / "config.json").is_file():
        problem = "does not exist" if not resolved.exists() else "has no config.json"
        raise RlvrlabError(f"{what} {folder} {problem}; give a Hugging Face model folder (config.json, weights, "
                           "tokenizer)")
    return resolved


def model_folder(cfg: RunConfig, problems: list[Problem]) -> Path:
    """The HF folder of the tiny or real tier (the tiny one is built and warm-started once per warm start seed,
    then cached; a resumed run rebuilds the same, as its config.yaml resolves to the same seed)."""
    if cfg.model.tier == "real":
        assert cfg.model.path is not None  # config rule: model.tier=real needs model.path
        return check_model_folder(Path(cfg.model.path), "model.path")
    from rlvrlab.policy.tiny import tiny_model_folder

    return tiny_model_folder(layers=cfg.model.tiny_layers, hidden=cfg.model.tiny_hidden, heads=cfg.model.tiny_heads,
                             warmstart_steps=cfg.model.warmstart_steps, problems=problems,
                             seed=warm_start_seed(cfg),
                             cache_root=cache_root(), solutions_fn=warm_start_targets(cfg.dataset),
                             digest=lambda folder: module_digest(load_model(folder, torch.float32)))


def model_source(folder: Path) -> str:
    """Where an HF model folder's weights came from (rlvrlab.tracking.tags.INITIAL_MODEL_SOURCE): import:<the GGUF
    file's sha256> for `rlvrlab model import`'s folders; else hf:<folder>@<revision>, the revision being config.json's
    _commit_hash or, for a Hugging Face hub cache snapshot (.../snapshots/<commit>), the commit; hf:<folder> when
    neither says."""
    import json

    from rlvrlab.policy.gguf_import import MARKER

    try:
        imported = json.loads((folder / MARKER).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        imported = None
    if imported:
        return f"import:{imported}"
    try:
        revision = json.loads((folder / "config.json").read_text()).get("_commit_hash")
    except (OSError, ValueError, AttributeError):
        revision = None
    if not revision and folder.parent.name == "snapshots":
        revision = folder.name
    return f"hf:{folder}@{revision}" if revision else f"hf:{folder}"


def folder_model(folder: Path, dtype: torch.dtype, source: str | None = None) -> InitialModel:
    """The digest of the weights in an HF model folder as a run loads them (load_model in `dtype`: the same digest
    as a training run starting from the folder records), and their source (default: model_source)."""
    model = load_model(folder, dtype)
    try:
        return InitialModel(module_digest(model), source or model_source(folder))
    finally:
        del model


def initial_model(cfg: RunConfig, problems: list[Problem]) -> InitialModel:
    """The weights a training run with `cfg` on `problems` starts from, digested, without any engine: what
    `policy` records (the toy table; the tiny tier's warm start, built or taken from the cache; the real tier's
    folder in model.dtype). `rlvrlab model digest` prints it."""
    if cfg.model.tier == "toy":
        return InitialModel(module_digest(_toy_table(cfg, problems)), _toy_source(cfg))
    folder = model_folder(cfg, problems)
    return folder_model(folder, torch_dtype(cfg.model.dtype), _hf_source(cfg, folder))


def _hf_source(cfg: RunConfig, folder: Path) -> str:
    return f"warm_start:{folder.name}" if cfg.model.tier == "tiny" else model_source(folder)


def _toy_source(cfg: RunConfig) -> str:
    m = cfg.model
    return f"toy:init={m.toy_init} skew={m.toy_init_skew} responses={m.toy_num_responses}"


def load_tokenizer(folder: Path):
    """The folder's tokenizer, with pad = eos when it has no pad token."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise RlvrlabError(f"model folder {folder}: tokenizer could not be loaded ({str(error).splitlines()[0]})") \
            from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(folder: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The folder's causal LM in eval mode (no dropout: behaviour and current log-probs of one set of weights
    must agree). A peft adapter folder (a LoRA checkpoint's model/adapter) loads as its base model with the adapter
    merged in."""
    from transformers import AutoModelForCausalLM

    from rlvrlab.policy.gguf_import import adapter_base, is_adapter_folder, merged_adapter

    if is_adapter_folder(Path(folder)):
        return merged_adapter(Path(folder), load_model(adapter_base(Path(folder)), dtype))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars would break rich's progress display
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as error:
        raise RlvrlabError(f"model folder {folder} could not be loaded ({str(error).splitlines()[0]}); "
                           "check that it is a complete Hugging Face causal-LM folder") from None
    return model.eval()


@dataclass(frozen=True)
class Sampling:
    """How responses are sampled: the rollout engine and its settings (training's `rollout` section, or an
    evaluation's flags)."""

    engine: str = "hf"  # hf | vllm
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    dtype: str = "float32"  # float32 | bfloat16
    gpu_memory_utilization: float = 0.3  # vllm only
    batch_prompts: int | None = None  # evaluation: prompts per generate call; None: about 256 (hf) / 8192 (vllm) / n
    max_model_len: int | None = None  # vllm: longest prompt + max_new_tokens; None: the model's own context
    sleep_mode: bool = False  # vllm on a GPU: sleep while the trainer updates (training's engine)
    seeding: str = "request"  # vllm: request (a seed per prompt) | engine (one generator per rank)
    extensible_kv_cache: bool = False  # vllm >= 0.34 on CUDA: keep its extensible KV cache (rollout.vllm_engine)

    @classmethod
    def of(cls, cfg: RunConfig) -> Sampling:
        """Training's sampling: vLLM sized for the rollout lengths (rlvrlab.config.memory.sequence_tokens) and
        in sleep mode."""
        r = cfg.rollout
        return cls(engine=r.engine, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                   dtype=cfg.model.dtype, gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                   max_model_len=sequence_tokens(cfg), sleep_mode=True, seeding=r.vllm_seeding,
                   extensible_kv_cache=r.vllm_extensible_kv_cache)


ROLLOUT_ENGINES = CHOICES["rollout.engine"]


def rollout_engine(sampling: Sampling, folder: Path, tokenizer, *, seed: int,
                   model: torch.nn.Module | None = None, device: torch.device | None = None,
                   world_size: int = 1, rank: int = 0) -> RolloutEngine:
    """The rollout engine over the model in `folder`. hf: a copy of `model` (the trainer's, when given) in the
    sampling dtype on `device` (default: the current CUDA device, else the CPU); vllm: vLLM loads the folder
    itself (weights are synced later), one engine per rank through vLLM's external launcher when world_size > 1,
    its generator seeded from (seed, rank)."""
    if sampling.engine == "vllm":
        from rlvrlab.rollout.vllm_engine import VLLMEngine

        if sampling.seeding not in ("request", "engine"):
            raise RlvrlabError(f"vllm seeding {sampling.seeding!r} is unknown; expected request or engine")
        engine_seed = seed if world_size == 1 else int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
        return VLLMEngine(model_path=str(folder), temperature=sampling.temperature, top_p=sampling.top_p,
                          max_new_tokens=sampling.max_new_tokens,
                          gpu_memory_utilization=sampling.gpu_memory_utilization, dtype=sampling.dtype,
                          seed=engine_seed, max_model_len=_within_context(sampling.max_model_len, folder),
                          sleep_mode=sampling.sleep_mode, external_launcher=world_size > 1,
                          per_request_seeds=sampling.seeding == "request",
                          extensible_kv_cache=sampling.extensible_kv_cache)
    if sampling.engine != "hf":
        raise RlvrlabError(f"rollout engine {sampling.engine!r} is unknown; expected one of "
                           f"{', '.join(ROLLOUT_ENGINES)}")
    from rlvrlab.rollout.hf_engine import HFEngine

    dtype = torch_dtype(sampling.dtype)
    sampler = copy.deepcopy(model).to(dtype) if model is not None else load_model(folder, dtype)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else \
            torch.device("cpu")
    return HFEngine(sampler.to(device), tokenizer, temperature=sampling.temperature, top_p=sampling.top_p,
                    max_new_tokens=sampling.max_new_tokens)


def _within_context(length: int | None, folder: Path) -> int | None:
    """vLLM's max_model_len: the rollout lengths, at most the model's own context (vLLM refuses more)."""
    import json

    if length is None:
        return None
    config = json.loads((folder / "config.json").read_text())
    context = config.get("max_position_embeddings")
    return min(length, int(context)) if context else length


def update_engine(cfg: RunConfig, model: torch.nn.Module, world_size: int) -> UpdateEngine:
    """trainer.engine over `model`: DeepSpeed (ZeRO, bf16, data parallel) or plain torch AdamW."""
    t = cfg.trainer
    common: dict[str, Any] = dict(lr=t.lr, weight_decay=t.weight_decay, betas=tuple(t.betas), grad_clip=t.grad_clip)
    if t.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if t.engine == "torch":
        from rlvrlab.update.torch_engine import TorchEngine

        return TorchEngine(model, **common)
    from rlvrlab.update.deepspeed_engine import DeepSpeedEngine

    rows_per_mini = cfg.rollout.prompts_per_step // world_size * cfg.rollout.group_size // t.mini_batches
    micro = min(t.micro_batch_size, rows_per_mini)
    return DeepSpeedEngine(model, **common, zero_stage=t.zero_stage, bf16=cfg.model.dtype == "bfloat16",
                           micro_batch_size=micro, accumulation_steps=-(-rows_per_mini // micro),
                           world_size=world_size, offload_optimizer=t.offload_optimizer,
                           grad_accum_fp32=t.grad_accum_fp32 and cfg.model.dtype == "bfloat16",
                           bucket_elements=DS_BUCKET_ELEMENTS)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """transformers' gradient checkpointing (non-reentrant). It acts only in train mode, which changes nothing else
    for a model without active dropout; a model with dropout is refused (behaviour and current log-probs of one
    set of weights must agree); a model that is not a transformers model is refused (config rules allow it on the
    tiny and real tiers only)."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise RlvrlabError("trainer.gradient_checkpointing needs a transformers model (model.tier=tiny or real); "
                           "set trainer.gradient_checkpointing=false")
    dropouts = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    dropouts += [key for key in ("attention_dropout", "hidden_dropout", "dropout")
                 if float(getattr(getattr(model, "config", None), key, 0.0) or 0.0) > 0]
    if dropouts:
        raise RlvrlabError(f"trainer.gradient_checkpointing trains in train mode, and this model has dropout "
                           f"({dropouts[0]}); set its dropout to 0 in config.json or turn checkpointing off")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()


def check_memory(cfg: RunConfig, folder: Path, placement: Placement) -> None:
    """At launch on GPUs: the memory estimate (rlvrlab.config.memory) with the model's own config.json, the
    launch's world size and this device's total memory; a one-line ConfigError when it does not fit. On CPU the
    estimate is not checked (host memory is not what it sizes)."""
    if placement.device.type != "cuda":
        return
    import json

    arch = memory.Architecture.from_hf(json.loads((folder / "config.json").read_text()))
    total = torch.cuda.get_device_properties(placement.device).total_memory
    memory.check_fits(cfg, arch, world_size=placement.world_size, device_bytes=total)


def reward_pool(dataset: DatasetConfig, world_size: int = 1) -> RewardPool:
    """The dataset's verifier as a RewardPool (workers start on the first batch that needs them). With
    verifier_workers=0 the cores are shared among the processes of this node, not taken by each."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    workers = dataset.verifier_workers or max(1, default_workers() // max(1, local))
    return RewardPool(dataset.verifier, workers=workers, timeout_s=dataset.verifier_timeout,
                      math_extraction=dataset.math_extraction)


def prompt_renderer(dataset: DatasetConfig, tokenizer) -> Callable[[Problem], list[int]]:
    """Problem -> prompt token ids, as training and evaluation both render them.

    The question goes through dataset.template; so do the questions of dataset.fewshot. With
    dataset.use_chat_template the system prompt is the system turn and each example a user and an assistant turn
    before the question's user turn; without it they are paragraphs ("system\\n\\nQ1 A1\\n\\nQ2 A2\\n\\nQ")."""
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


@dataclass(frozen=True)
class Policy:
    """A tier's policy with the engines around it: what a run trains, samples from and saves."""

    update: UpdateEngine  # the trained weights and their optimizer
    rollout: RolloutEngine  # samples from a copy of them, synced after each update
    reference: torch.nn.Module | None  # frozen initial policy, when algorithm.kl_coef > 0
    prompt_ids: Callable[[Problem], list[int]]
    pad_id: int
    # weights as safetensors (+ tokenizer): a loadable folder; the state dict when the module's own is sharded (ZeRO-3)
    save_model: SaveModel
    eos_id: int | None = None  # the tokenizer's end of sequence (None: the toy tier, whose responses are complete)
    tokenizer: Any = None  # the hf tiers' tokenizer (None: toy)
    diagnostics: Callable[[], ToyDiagnostics] | None = None  # exact measures of the whole policy (the toy table)
    initial: InitialModel | None = None  # the weights it starts from, digested before any engine holds them


def policy(cfg: RunConfig, problems: list[Problem], placement: Placement) -> Policy:
    """model.tier's policy for training on `problems`: the toy table, or the tiny or real tier's HF model."""
    if cfg.model.tier == "toy":
        return _toy_policy(cfg, problems, placement.world_size)
    return _hf_policy(cfg, model_folder(cfg, problems), placement, problems)


def _frozen_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The reference policy: a copy of the initial model in `dtype`, without gradients."""
    return copy.deepcopy(model).to(dtype).requires_grad_(False)


def _toy_policy(cfg: RunConfig, problems: list[Problem], world_size: int) -> Policy:
    from safetensors.torch import save_file

    from rlvrlab.policy.toy import correct_members, diagnostics
    from rlvrlab.rollout.toy_engine import ToyEngine

    table = _toy_table(cfg, problems)
    initial = InitialModel(module_digest(table), _toy_source(cfg))
    reference = copy.deepcopy(table).requires_grad_(False) if cfg.algorithm.kl_coef > 0 else None
    update = update_engine(cfg, table, world_size)
    engine = ToyEngine(table.logits, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)

    def save_model(module: torch.nn.Module, folder: Path, state: dict | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in (state or module.state_dict()).items()},
                  str(folder / "model.safetensors"))

    members = correct_members(problems, table.logits.shape[1])
    return Policy(update=update, rollout=engine, reference=reference, prompt_ids=lambda p: [int(p.prompt)],
                  pad_id=0, save_model=save_model,
                  diagnostics=lambda: diagnostics(table, problems, members=members), initial=initial)


def _toy_table(cfg: RunConfig, problems: list[Problem]) -> ToyPolicy:
    """The toy tier's initial table (seeded with the run's seed, as the policy's engines are after it)."""
    torch.manual_seed(cfg.seed)
    return ToyPolicy.initial(problems, num_responses=cfg.model.toy_num_responses, init=cfg.model.toy_init,
                             skew=cfg.model.toy_init_skew)


def _hf_policy(cfg: RunConfig, folder: Path, placement: Placement, problems: list[Problem]) -> Policy:
    tokenizer = load_tokenizer(folder)
    prompt_ids = prompt_renderer(cfg.dataset, tokenizer)
    _check_prompt_lengths(cfg, problems, prompt_ids)
    check_memory(cfg, folder, placement)
    torch.manual_seed(cfg.seed)
    # weights in model.dtype: under bf16 DeepSpeed casts the module to bf16 and builds its fp32 masters from those
    # bf16 values, so loading fp32 first would give the same masters (tests/update/test_bf16_load.py) for twice the
    # host memory per rank
    dtype = torch_dtype(cfg.model.dtype)
    model = load_model(folder, dtype)
    initial = InitialModel(module_digest(model), _hf_source(cfg, folder))
    engine = rollout_engine(Sampling.of(cfg), folder, tokenizer, seed=cfg.seed, model=model, device=placement.device,
                            world_size=placement.world_size, rank=placement.rank)
    peft_model = None
    if cfg.model.lora.r > 0:  # after the sampler's copy of the base (rlvrlab.policy.lora: merged weights sync)
        peft_model, engine = _with_lora(cfg, model, engine)
        reference: torch.nn.Module | None = lora.NoAdapters(peft_model) if cfg.algorithm.kl_coef > 0 else None
        model = peft_model.get_base_model()  # the transformers model, adapters in place: what the engine trains
    else:
        reference = _frozen_copy(model, dtype) if cfg.algorithm.kl_coef > 0 else None
    update = update_engine(cfg, model, placement.world_size)
    if reference is not None:
        reference.to(next(update.module.parameters()).device)

    def save_model(module: torch.nn.Module, out: Path, state: dict | None = None) -> None:
        assert isinstance(module, type(model))  # the update engine's module is the model it was given
        if peft_model is not None:
            lora.save(peft_model, module, out, state)  # merged weights, and the adapter in out/adapter
        else:
            module.save_pretrained(out, safe_serialization=True, state_dict=state)
        tokenizer.save_pretrained(out)

    return Policy(update=update, rollout=engine, reference=reference, prompt_ids=prompt_ids,
                  pad_id=tokenizer.pad_token_id, save_model=save_model, eos_id=tokenizer.eos_token_id,
                  tokenizer=tokenizer, initial=initial)


def _with_lora(cfg: RunConfig, model: PreTrainedModel, engine: RolloutEngine) -> tuple[Any, RolloutEngine]:
    """model.lora's adapters on `model` (peft, in place), and the rollout engine that syncs their merged weights."""
    c = cfg.model.lora
    peft_model = lora.with_adapters(model, r=c.r, alpha=c.alpha, dropout=c.dropout, target_modules=c.target_modules)
    return peft_model, cast(RolloutEngine, lora.MergedSync(engine, lora.lora_scaling(peft_model)))


def _check_prompt_lengths(cfg: RunConfig, problems: list[Problem], prompt_ids: Callable[[Problem], list[int]]) -> None:
    """Every training prompt fits rollout.max_prompt_tokens (vLLM's max_model_len and the memory estimate count on
    it); else one line naming the longest."""
    longest = max(problems, key=lambda p: len(prompt_ids(p)), default=None)
    if longest is not None and len(prompt_ids(longest)) > cfg.rollout.max_prompt_tokens:
        raise ConfigError(f"problem {longest.id}'s prompt has {len(prompt_ids(longest))} tokens, more than "
                          f"rollout.max_prompt_tokens={cfg.rollout.max_prompt_tokens}; raise it or shorten the "
                          "prompts (template, few-shot examples)")
