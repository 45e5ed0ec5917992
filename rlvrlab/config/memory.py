"""Per-GPU memory of a run, estimated before anything is loaded: the update (weights, gradients, AdamW states by
ZeRO stage and world size, activations from the batch shape and the model's shape) and the rollout engine (vLLM's
share of the device, or the hf engine's copy and KV cache).

Sources of the formulas (docs/scaling.md, "Memory estimate", lists the assumptions and the measured tolerance):
- weights, gradients and optimizer states by ZeRO stage: Rajbhandari et al. 2020, "ZeRO", §5 (mixed precision:
  2 + 2 + 12 bytes per parameter, stage 1 partitions the 12, stage 2 also the gradients, stage 3 also the weights);
  fp32 training keeps 4 + 4 + 8. DeepSpeed's bucket sizes are its defaults (DS_BUCKET_ELEMENTS).
- activations of a decoder layer: the tensors a Llama/Qwen layer of transformers keeps for backward (two RMSNorms,
  q/k/v and RoPE, attention output, o_proj input, SwiGLU's four intermediate tensors), with SDPA attention (no
  seq x seq matrix; Korthikanti et al. 2022, "Reducing Activation Recomputation", Table 2, without the 5as/h term).
  Gradient checkpointing keeps one hidden state per layer and recomputes one layer at a time.
- logits: the response positions only (`logits_to_keep`), the lm_head output plus the fp32 copies the log-prob
  and its backward hold (rlvrlab.train.batch.logp_and_entropy).
- vLLM: gpu_memory_utilization is the share of the whole device vLLM may take (weights, activations, KV cache);
  it sleeps (level 1: KV freed, weights offloaded) while the trainer updates.

Pure functions of a RunConfig and the model's config.json values; no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import ConfigError

GIB = 2**30
DS_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size and allgather_bucket_size (set explicitly)
DS_MAX_LIVE_PARAMETERS = 1_000_000_000  # DeepSpeed's default stage3_max_live_parameters
TINY_VOCAB_BOUND = 320  # rlvrlab.policy.tiny.VOCAB_SIZE: the tiny tokenizer's vocabulary is at most this


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder-only transformer's config.json that its memory depends on."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> Architecture:
        """From a Hugging Face config.json (Llama, Qwen2, Qwen3, Mistral key names)."""
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(hidden=hidden, layers=int(config["num_hidden_layers"]),
                   intermediate=int(config["intermediate_size"]), heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads), vocab=int(config["vocab_size"]),
                   tied=bool(config.get("tie_word_embeddings", False)))

    @property
    def params(self) -> int:
        """Parameter count: embeddings (twice when untied), attention, SwiGLU MLP and norms; biases left out
        (Qwen2's q/k/v biases are < 0.1% of the total)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + 3 * self.hidden * self.intermediate \
            + 2 * self.hidden
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * layer + self.hidden

    def layer_activation_elements(self) -> int:
        """Elements per token one decoder layer keeps for backward (see the module docstring)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        norms = 2 * 2 * self.hidden  # input and normalised output of both RMSNorms
        attention = (q + 2 * kv) + 2 * (q + kv) + q + q  # q/k/v, RoPE inputs and outputs, SDPA output, o_proj input
        mlp = 4 * self.intermediate  # gate, up, silu(gate), silu(gate) * up
        return norms + attention + mlp


def architecture(cfg: RunConfig) -> Architecture | None:
    """The model's shape: the tiny tier's from its knobs (vocabulary bounded), a real model's from
    model.path/config.json when it is on this machine, else from model.architecture; None for the toy tier or a
    real model whose shape is not known here."""
    m = cfg.model
    if m.tier == "tiny":
        return Architecture(hidden=m.tiny_hidden, layers=m.tiny_layers, intermediate=2 * m.tiny_hidden,
                            heads=m.tiny_heads, kv_heads=m.tiny_heads, head_dim=m.tiny_hidden // m.tiny_heads,
                            vocab=TINY_VOCAB_BOUND, tied=True)
    if m.tier != "real":
        return None
    config_json = Path(m.path or "").expanduser() / "config.json"
    if m.path and config_json.is_file():
        return Architecture.from_hf(json.loads(config_json.read_text()))
    if m.architecture:
        return Architecture.from_hf(m.architecture)
    return None


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU of one rank. The update phase holds the trainer's state and one micro-batch's activations;
    the rollout phase holds the trainer's state and the engine."""

    world_size: int
    device_bytes: int
    weights: int
    master_weights: int
    gradients: int
    optimizer: int
    buffers: int
    reference: int
    activations: int
    logits: int
    engine: int  # vLLM's share of the device, or the hf engine's weights and KV cache
    engine_asleep_in_update: bool  # vLLM sleeps during the update; the hf engine's weights stay

    @property
    def resident(self) -> int:
        """What the trainer keeps on the GPU between steps."""
        return self.weights + self.master_weights + self.gradients + self.optimizer + self.buffers + self.reference

    @property
    def update(self) -> int:
        return self.resident + self.activations + self.logits + (0 if self.engine_asleep_in_update else self.engine)

    @property
    def rollout(self) -> int:
        return self.resident + self.engine

    @property
    def peak(self) -> int:
        return max(self.update, self.rollout)

    @property
    def fits(self) -> bool:
        return self.peak <= self.device_bytes

    def rows(self) -> list[tuple[str, float]]:
        """(name, GiB) of each part and phase, for `rlvrlab config show --memory`."""
        parts = [("weights", self.weights), ("fp32 master weights", self.master_weights),
                 ("gradients", self.gradients), ("AdamW states", self.optimizer), ("DeepSpeed buffers", self.buffers),
                 ("reference model", self.reference), ("activations (one micro-batch)", self.activations),
                 ("logits (one micro-batch)", self.logits), ("rollout engine", self.engine),
                 ("update phase", self.update), ("rollout phase", self.rollout), ("peak", self.peak),
                 ("device", self.device_bytes)]
        return [(name, value / GIB) for name, value in parts]

    def summary(self) -> str:
        return (f"~{self.peak / GIB:.1f} GiB per GPU at {self.world_size} GPU(s) (update {self.update / GIB:.1f}, "
                f"rollout {self.rollout / GIB:.1f}) of {self.device_bytes / GIB:.0f} GiB")


def sequence_tokens(cfg: RunConfig) -> int:
    """The longest row a run trains on or vLLM holds: the longest prompt allowed plus max_new_tokens (vLLM's
    max_model_len)."""
    return cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens


def micro_batch_rows(cfg: RunConfig, world_size: int) -> int:
    """Rows of one micro-batch: trainer.micro_batch_size, at most one mini-batch of this rank's rows (as
    rlvrlab.components.update_engine gives DeepSpeed)."""
    rows_per_mini = cfg.rollout.prompts_per_step // world_size * cfg.rollout.group_size // cfg.trainer.mini_batches
    return max(1, min(cfg.trainer.micro_batch_size, rows_per_mini))


def update_parts(cfg: RunConfig, arch: Architecture, world_size: int) -> dict[str, int]:
    """Bytes per rank of the trainer's state and of one micro-batch's forward and backward (see the module
    docstring for the sources)."""
    t, n, psi = cfg.trainer, world_size, arch.params
    bf16 = cfg.model.dtype == "bfloat16"
    deepspeed = t.engine == "deepspeed"
    stage = t.zero_stage if deepspeed else 0
    param_bytes = 2 if bf16 else 4
    grad_bytes = 4 if (not bf16 or t.grad_accum_fp32) else 2
    share = {k: (1 / n if stage >= k else 1.0) for k in (1, 2, 3)}
    offload = deepspeed and t.offload_optimizer
    weights = int(psi * param_bytes * share[3])
    master = 0 if (not bf16 or offload) else int(psi * 4 * share[1])
    optimizer = 0 if offload else int(psi * 8 * share[1])
    gradients = int(psi * grad_bytes * share[2])
    buffers = 0
    if deepspeed and stage in (1, 2):
        buffers = 2 * min(DS_BUCKET_ELEMENTS, psi) * grad_bytes  # reduce and all-gather buckets
    elif deepspeed and stage == 3:
        buffers = min(DS_MAX_LIVE_PARAMETERS, psi) * param_bytes + min(DS_BUCKET_ELEMENTS, psi) * grad_bytes
    reference = psi * param_bytes if cfg.algorithm.kl_coef > 0 else 0
    rows, compute = micro_batch_rows(cfg, n), 2 if bf16 else 4
    tokens, positions = rows * sequence_tokens(cfg), rows * (cfg.rollout.max_new_tokens + 1)
    if t.micro_batch_tokens is not None or t.pack_by_length:
        # packed by length: micro_batch_tokens' budget (or one row longer than it, alone); pack_by_length's is
        # `rows` rows at the batch's longest prompt + max_new_tokens, at most the `tokens` above
        rows_per_mini = cfg.rollout.prompts_per_step // n * cfg.rollout.group_size // t.mini_batches
        if t.micro_batch_tokens is not None:
            tokens = max(t.micro_batch_tokens, sequence_tokens(cfg))
        # each row keeps logits for its response width + 1 <= its padded width, so at most `tokens` positions
        positions = min(tokens, max(1, rows_per_mini) * (cfg.rollout.max_new_tokens + 1))
    if t.gradient_checkpointing:  # one hidden state per layer, one layer recomputed at a time
        activations = tokens * compute * (arch.layers * arch.hidden + arch.layer_activation_elements())
    else:
        activations = tokens * compute * arch.layers * arch.layer_activation_elements()
    # lm_head output; fp32 copy (bf16 only), / temperature, log_softmax (kept for backward), its gradient
    logits = positions * arch.vocab * (compute + (4 if bf16 else 0) + 3 * 4)
    return dict(weights=weights, master_weights=master, gradients=gradients, optimizer=optimizer, buffers=buffers,
                reference=reference, activations=activations, logits=logits)


def engine_bytes(cfg: RunConfig, arch: Architecture, world_size: int, device_bytes: int) -> int:
    """The rollout engine's bytes per rank: vLLM's gpu_memory_utilization share of the device; the hf engine's copy
    of the weights in model.dtype plus the KV cache of this rank's rows at full length."""
    r = cfg.rollout
    if r.engine == "vllm":
        return int(r.vllm_gpu_memory_utilization * device_bytes)
    compute = 2 if cfg.model.dtype == "bfloat16" else 4
    rows = r.prompts_per_step // world_size * r.group_size
    kv = rows * sequence_tokens(cfg) * arch.layers * 2 * arch.kv_heads * arch.head_dim * compute
    return arch.params * compute + kv


def estimate(cfg: RunConfig, arch: Architecture, *, world_size: int, device_bytes: int) -> MemoryEstimate:
    """Per-GPU memory of `cfg` on `world_size` ranks of `device_bytes` each."""
    parts = update_parts(cfg, arch, world_size)
    return MemoryEstimate(world_size=world_size, device_bytes=device_bytes, **parts,
                          engine=engine_bytes(cfg, arch, world_size, device_bytes),
                          engine_asleep_in_update=cfg.rollout.engine == "vllm")


def planned_world_size(cfg: RunConfig) -> int:
    """The GPUs a run is planned for: trainer.world_size, or 1 when it is not stated."""
    return cfg.trainer.world_size or 1


def check_fits(cfg: RunConfig, arch: Architecture, *, world_size: int, device_bytes: int) -> MemoryEstimate:
    """The estimate, or a one-line ConfigError when it does not fit the devices."""
    found = estimate(cfg, arch, world_size=world_size, device_bytes=device_bytes)
    if not found.fits:
        fewest = next((n for n in (2, 4, 8, 16, 32, 64) if n > world_size and estimate(
            cfg, arch, world_size=n, device_bytes=device_bytes).fits and cfg.rollout.prompts_per_step % n == 0), None)
        more = f"trainer.world_size={fewest} (and launch that many ranks)" if fewest else "more GPUs"
        raise ConfigError(f"this run does not fit: {found.summary()}; use {more}, trainer.zero_stage=3, "
                          "trainer.offload_optimizer=true, trainer.gradient_checkpointing=true or a smaller "
                          "trainer.micro_batch_size or trainer.micro_batch_tokens (rlvrlab config show --memory "
                          "itemises it)")
    return found
