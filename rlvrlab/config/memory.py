"""Per-GPU memory of a run, estimated before anything is loaded: the update (weights, gradients, AdamW states by
ZeRO stage and world size, activations from the batch shape and the model's shape), the optimizer step, the rollout
engine (vLLM's share of the device, or the hf engine's copy and KV cache) and the fixed overheads of a CUDA process.

Sources of the formulas (docs/scaling.md, "Memory estimate", lists the assumptions and the measured tolerance):
- weights, gradients and optimizer states by ZeRO stage: Rajbhandari et al. 2020, "ZeRO", §5 (mixed precision:
  2 + 2 + 12 bytes per parameter, stage 1 partitions the 12, stage 2 also the gradients, stage 3 also the weights);
  fp32 training keeps 4 + 4 + 8, plus the fp32 partition DeepSpeed's ZeRO-1/2 clones from the weights
  (deepspeed/runtime/zero/stage_1_and_2.py, single_partition_of_fp32_groups). DeepSpeed's bucket sizes are its
  defaults (DS_BUCKET_ELEMENTS).
- activations of a decoder layer: the tensors a Llama/Qwen layer of transformers keeps for backward (two RMSNorms,
  q/k/v and RoPE, attention output, o_proj input, SwiGLU's four intermediate tensors), with SDPA attention (no
  seq x seq matrix; Korthikanti et al. 2022, "Reducing Activation Recomputation", Table 2, without the 5as/h term).
  Gradient checkpointing keeps one hidden state per layer and recomputes one layer at a time.
- logits: the response positions only (`logits_to_keep`); at the pass's peak three fp32 [positions, vocab] tensors
  (rlvrlab.train.logprobs.logp_and_entropy, measured: tests/services/qwen_shape_memory.py --long, docs/scaling.md):
  in the forward the lm_head output (its fp32 copy in bf16, its division by the temperature), log_softmax's
  contiguous copy of it (fp32 rows sliced from the lm_head output) and the log-softmax; at backward's start the
  log-softmax kept for backward, its incoming gradient and its own gradient. The token entropy: a logged one is
  computed ENTROPY_CHUNK_ELEMENTS logits at a time, two fp32 temporaries of a piece beside two of the three (what
  they add over the third is counted); one in the loss keeps its softmax and the logits for backward and its
  backward holds five more [positions, vocab] fp32 tensors at its peak (measured: 8 such tensors, 3 without it).
- a tied embedding's gradient: autograd sums the lm_head's and the embedding's contributions at the end of
  backward, two vocab x hidden tensors beside the gradient (measured at Qwen2.5-0.5B's shape).
- the optimizer step: torch's AdamW on CUDA (multi-tensor) takes the square root of every second moment it steps
  at once (torch/optim/adam.py, _multi_tensor_adam); ZeRO-1 flattens, and bf16 gradients are cast to, an fp32
  gradient partition first (stage_1_and_2.py, step). On the CPU (on_gpu=False) AdamW loops over its tensors, two
  temporaries of the largest at a time (_single_tensor_adam).
- vLLM: gpu_memory_utilization is the share of the whole device vLLM may take (weights, activations, KV cache);
  it sleeps (level 1: KV freed, weights offloaded) while the trainer updates. vLLM >= 0.34's extensible KV cache
  (rollout.vllm_extensible_kv_cache) caps PyTorch's allocator for the whole process at about device - KV cache -
  VLLM_CAP_MARGIN after warm-up, and its sleep() leaves the cap; rlvrlab lifts it while the engine sleeps and puts
  it back before the KV cache is mapped again (rlvrlab.rollout.vllm_sleep.ProcessMemoryCap), so the cap binds in
  the rollout phase: everything there but the KV cache and the allocations outside PyTorch's allocator must fit.
- fixed overheads per GPU (CUDA context, cuBLAS workspaces, NCCL, vLLM's CUDA graphs): the constants below, from
  the figures docs/scaling.md cites.

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
MIB = 2**20
DS_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size and allgather_bucket_size (set explicitly)
DS_MAX_LIVE_PARAMETERS = 1_000_000_000  # DeepSpeed's default stage3_max_live_parameters
TINY_VOCAB_BOUND = 320  # rlvrlab.policy.tiny.VOCAB_SIZE: the tiny tokenizer's vocabulary is at most this
# logits (positions x vocabulary) per piece of a logged token entropy (rlvrlab.train.logprobs): its two fp32
# temporaries stay under 2 x 128 MiB whatever the batch
ENTROPY_CHUNK_ELEMENTS = 2**25
# Fixed overheads of one GPU's process (sources and measured figures: docs/scaling.md, "Memory estimate"). The
# first two lie outside PyTorch's caching allocator, the last two inside it (what a per-process cap limits).
CUDA_CONTEXT_BYTES = 512 * MIB  # the CUDA context, kernels loaded lazily (CUDA >= 11.7): ~300-400 MB at start
NCCL_BYTES = GIB  # one NCCL communicator's buffers and channels among the ranks (world_size > 1)
CUBLAS_WORKSPACE_BYTES = 64 * MIB  # PyTorch's cuBLAS workspaces on Hopper: 32 MiB per handle and stream, two streams
CUDA_GRAPHS_BYTES = GIB  # vLLM's captured CUDA graphs (rollout.engine=vllm), kept while it sleeps
VLLM_CAP_MARGIN = GIB // 2  # vLLM >= 0.34's extensible KV cache: PyTorch's cap is device - KV cache - this


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

    @property
    def largest_tensor(self) -> int:
        """Elements of the largest weight: the embedding (vocab x hidden) in any model of a real vocabulary."""
        return max(self.vocab * self.hidden, self.intermediate * self.hidden, self.heads * self.head_dim * self.hidden)


LORA_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_params(arch: Architecture, r: int, targets: list[str]) -> int:
    """Weights of model.lora's adapters (A: r x in, B: out x r per adapted linear layer); "all-linear" adapts all
    seven of each decoder layer (not the output head). Names outside them (another architecture's) count as all."""
    q, kv, h, i = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.hidden, arch.intermediate
    sizes = dict(q_proj=h + q, k_proj=h + kv, v_proj=h + kv, o_proj=q + h, gate_proj=h + i, up_proj=h + i,
                 down_proj=i + h)
    known = [name for name in targets if name in sizes]
    chosen = known if known and len(known) == len(targets) else list(LORA_LAYERS)
    return r * arch.layers * sum(sizes[name] for name in chosen)


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
    """Bytes per GPU of one rank in each phase of a step: the update (forward and backward of one micro-batch), the
    optimizer step and the rollout, each on top of the trainer's resident state and the fixed overheads."""

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
    entropy: int  # the token entropy's temporaries (logged) or its tensors for backward (an entropy term)
    tied_gradient: int  # a tied embedding's two gradient contributions, summed at the end of backward
    optimizer_step: int  # AdamW's temporaries and ZeRO's fp32 gradient partition during the step
    engine: int  # vLLM's share of the device, or the hf engine's weights and KV cache
    engine_asleep_in_update: bool  # vLLM sleeps during the update and the step; the hf engine's weights stay
    overhead: int  # the fixed overheads (CUDA context, NCCL, cuBLAS workspaces, vLLM's CUDA graphs); 0 on the CPU
    overhead_outside_allocator: int  # their part outside PyTorch's caching allocator (CUDA context, NCCL)
    cap: int | None  # vLLM's cap on PyTorch's allocator in the rollout phase (extensible KV cache; lifted asleep)
    kv_cache: int  # the KV cache's bytes inside the engine's share, at their largest (outside the cap)

    @property
    def resident(self) -> int:
        """What the trainer keeps on the GPU between steps."""
        return self.weights + self.master_weights + self.gradients + self.optimizer + self.buffers + self.reference

    @property
    def _awake_engine(self) -> int:
        return 0 if self.engine_asleep_in_update else self.engine

    @property
    def update(self) -> int:
        """The pass's peak: one micro-batch's activations, logits and entropy alive with every gradient (the earlier
        micro-batches' of an accumulation; a step of one micro-batch has none yet, and the sum errs high by them), or
        at backward's end the tied embedding's gradient sum, whichever is larger."""
        batch = max(self.activations + self.logits + self.entropy, self.tied_gradient)
        return self.overhead + self.resident + batch + self._awake_engine

    @property
    def step(self) -> int:
        return self.overhead + self.resident + self.optimizer_step + self._awake_engine

    @property
    def rollout(self) -> int:
        return self.overhead + self.resident + self.engine

    @property
    def trainer(self) -> int:
        """The trainer's own peak (update or step) without the rollout engine and the fixed overheads: what a
        CPU process of the same run holds (tests/services/qwen_shape_memory.py measures it)."""
        return max(self.update, self.step) - self._awake_engine - self.overhead

    @property
    def under_cap(self) -> int:
        """What the rollout phase asks of PyTorch's caching allocator besides the KV cache (everything but the CUDA
        context and NCCL): what vLLM's cap limits. The update and the step run with the cap lifted (the engine
        sleeps), so they are held to the device only."""
        return self.rollout - self.kv_cache - self.overhead_outside_allocator

    @property
    def peak(self) -> int:
        return max(self.update, self.step, self.rollout)

    @property
    def fits_device(self) -> bool:
        return self.peak <= self.device_bytes

    @property
    def fits_cap(self) -> bool:
        return self.cap is None or self.under_cap <= self.cap

    @property
    def fits(self) -> bool:
        return self.fits_device and self.fits_cap

    def rows(self) -> list[tuple[str, float]]:
        """(name, GiB) of each part and phase, for `rlvrlab config show --memory`."""
        parts = [("weights", self.weights), ("fp32 master weights", self.master_weights),
                 ("gradients", self.gradients), ("AdamW states", self.optimizer), ("DeepSpeed buffers", self.buffers),
                 ("reference model", self.reference), ("activations (one micro-batch)", self.activations),
                 ("logits (one micro-batch)", self.logits), ("token entropy (one micro-batch)", self.entropy),
                 ("tied embedding's gradient sum", self.tied_gradient), ("optimizer step temporaries",
                 self.optimizer_step), ("rollout engine", self.engine),
                 ("CUDA context/NCCL/cuBLAS/graphs", self.overhead), ("update phase", self.update),
                 ("optimizer step phase", self.step), ("rollout phase", self.rollout), ("peak", self.peak)]
        if self.cap is not None:
            parts += [("rollout under vLLM's cap", self.under_cap), ("vLLM's cap (extensible KV)", self.cap)]
        return [(name, value / GIB) for name, value in [*parts, ("device", self.device_bytes)]]

    def summary(self) -> str:
        cap = f"; {self.under_cap / GIB:.1f} under vLLM's cap of {self.cap / GIB:.1f}" if self.cap is not None else ""
        return (f"~{self.peak / GIB:.1f} GiB per GPU at {self.world_size} GPU(s) (update {self.update / GIB:.1f}, "
                f"step {self.step / GIB:.1f}, rollout {self.rollout / GIB:.1f}) of {self.device_bytes / GIB:.0f} GiB"
                f"{cap}")


def sequence_tokens(cfg: RunConfig) -> int:
    """The longest row a run trains on or vLLM holds: the longest prompt allowed plus max_new_tokens (vLLM's
    max_model_len)."""
    return cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens


def micro_batch_rows(cfg: RunConfig, world_size: int) -> int:
    """Rows of one micro-batch: trainer.micro_batch_size, at most one mini-batch of this rank's rows (as
    rlvrlab.components.update_engine gives DeepSpeed)."""
    rows_per_mini = cfg.rollout.prompts_per_step // world_size * cfg.rollout.group_size // cfg.trainer.mini_batches
    return max(1, min(cfg.trainer.micro_batch_size, rows_per_mini))


def update_parts(cfg: RunConfig, arch: Architecture, world_size: int, *, on_gpu: bool = True,
                 trainable: int | None = None) -> dict[str, int]:
    """Bytes per rank of the trainer's state, of one micro-batch's forward and backward and of the optimizer step
    (see the module docstring for the sources). on_gpu=False: the step as torch's AdamW runs it on the CPU.
    trainable: the parameters the optimizer trains (default all, arch.params); gradients, AdamW states, fp32 masters,
    DeepSpeed's buckets and the step's temporaries are of these only, the weights of all (frozen ones in
    model.dtype)."""
    t, n, psi = cfg.trainer, world_size, arch.params
    # LoRA (rlvrlab.policy.lora): the adapters are the only trained weights (gradients, masters, AdamW states), the
    # frozen base stays in the weights, and the KL reference is the base with the adapters off (no copy)
    lora = cfg.model.lora
    adapters = lora_params(arch, lora.r, list(lora.target_modules)) if lora.r > 0 else 0
    trained = (adapters if lora.r > 0 else psi) if trainable is None else trainable
    bf16 = cfg.model.dtype == "bfloat16"
    deepspeed = t.engine == "deepspeed"
    stage = t.zero_stage if deepspeed else 0
    param_bytes = 2 if bf16 else 4
    grad_bytes = 4 if (not bf16 or t.grad_accum_fp32) else 2
    share = {k: (1 / n if stage >= k else 1.0) for k in (1, 2, 3)}
    offload = deepspeed and t.offload_optimizer
    weights = int((psi + adapters) * param_bytes * share[3])
    # fp32 masters: bf16's, and the fp32 partition ZeRO-1/2 clones even from fp32 weights (ZeRO-3 steps fp32 weights
    # in place)
    master = 0 if offload or not (bf16 or stage in (1, 2)) else int(trained * 4 * share[1])
    optimizer = 0 if offload else int(trained * 8 * share[1])
    gradients = int(trained * grad_bytes * share[2])
    buffers = 0
    if deepspeed and stage in (1, 2):
        buffers = 2 * min(DS_BUCKET_ELEMENTS, trained) * grad_bytes  # reduce and all-gather buckets
    elif deepspeed and stage == 3:
        buffers = min(DS_MAX_LIVE_PARAMETERS, psi) * param_bytes + min(DS_BUCKET_ELEMENTS, trained) * grad_bytes
    reference = psi * param_bytes if cfg.algorithm.kl_coef > 0 and lora.r == 0 else 0
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
    # three fp32 [positions, vocab] tensors at the peak, in any dtype and at any temperature (module docstring).
    # Measured on the CPU (tests/services/qwen_shape_memory.py --long, 2 rows x 256+768 tokens, vocabulary 151,936):
    # 3.0 such tensors above the activations in the forward and at backward's start. It counted 4 in fp32 and 4.5 in
    # bf16 (the lm_head output, an fp32 copy, a division by the temperature, the log-softmax and its gradient), which
    # no pass holds at once: the estimate was 1.19x the measured peak (1.24x with gradient checkpointing), now 1.01x
    logits = positions * arch.vocab * 3 * 4
    if cfg.algorithm.entropy_coef > 0:  # in the loss: softmax and logits kept, five fp32 tensors in its backward
        entropy = positions * arch.vocab * 5 * 4
    else:  # logged: softmax and softmax x logits of one piece at a time (rlvrlab.train.logprobs), beside two of the
        # logits' three tensors: what they add over the third
        piece = min(positions * arch.vocab, max(1, ENTROPY_CHUNK_ELEMENTS // arch.vocab) * arch.vocab)
        entropy = max(0, 2 * 4 * piece - 4 * positions * arch.vocab)
    tied_gradient = 2 * arch.vocab * arch.hidden * param_bytes if arch.tied and trained == psi else 0
    stepped = int(trained * share[1])  # elements AdamW steps on this rank: its fp32 partition, or every trained weight
    optimizer_step = 0
    if not offload:
        flat = bf16 or stage >= 1  # DeepSpeed steps flat fp32 partitions; plain fp32 weights are stepped as they are
        largest = arch.largest_tensor if trained == psi else min(arch.largest_tensor, trained)
        optimizer_step = 4 * stepped if on_gpu else 2 * 4 * (stepped if flat else largest)
        if deepspeed and (stage == 1 or (stage == 2 and grad_bytes == 2)):
            optimizer_step += 4 * stepped  # ZeRO-1's flattened, or bf16's fp32-cast, gradient partition
    return dict(weights=weights, master_weights=master, gradients=gradients, optimizer=optimizer, buffers=buffers,
                reference=reference, activations=activations, logits=logits, entropy=entropy,
                tied_gradient=tied_gradient, optimizer_step=optimizer_step)


def vllm_kv_cache(cfg: RunConfig, arch: Architecture, device_bytes: int) -> int:
    """vLLM's KV cache at its largest: gpu_memory_utilization's share less its weights (its profiled activations
    and graphs counted as cache, so the cap below errs low); 0 for other engines."""
    r = cfg.rollout
    if r.engine != "vllm":
        return 0
    return max(0, int(r.vllm_gpu_memory_utilization * device_bytes) - arch.params * _dtype_bytes(cfg))


def vllm_cap(cfg: RunConfig, arch: Architecture, device_bytes: int) -> int | None:
    """vLLM >= 0.34's cap on PyTorch's allocator with its extensible KV cache on (rollout.vllm_extensible_kv_cache):
    device - KV cache - VLLM_CAP_MARGIN while the engine is awake (rlvrlab lifts it while the engine sleeps). None
    when there is no such cap."""
    r = cfg.rollout
    if r.engine != "vllm" or not r.vllm_extensible_kv_cache:
        return None
    return device_bytes - vllm_kv_cache(cfg, arch, device_bytes) - VLLM_CAP_MARGIN


def _dtype_bytes(cfg: RunConfig) -> int:
    return 2 if cfg.model.dtype == "bfloat16" else 4


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


def estimate(cfg: RunConfig, arch: Architecture, *, world_size: int, device_bytes: int,
             on_gpu: bool = True, trainable: int | None = None) -> MemoryEstimate:
    """Per-GPU memory of `cfg` on `world_size` ranks of `device_bytes` each. on_gpu=False: the same run's memory in
    a CPU process, without the fixed GPU overheads and with the CPU's optimizer step. trainable: as update_parts."""
    parts = update_parts(cfg, arch, world_size, on_gpu=on_gpu, trainable=trainable)
    vllm = cfg.rollout.engine == "vllm"
    outside = (CUDA_CONTEXT_BYTES + (NCCL_BYTES if world_size > 1 else 0)) if on_gpu else 0
    inside = (CUBLAS_WORKSPACE_BYTES + (CUDA_GRAPHS_BYTES if vllm else 0)) if on_gpu else 0
    return MemoryEstimate(world_size=world_size, device_bytes=device_bytes, **parts,
                          engine=engine_bytes(cfg, arch, world_size, device_bytes), engine_asleep_in_update=vllm,
                          overhead=outside + inside, overhead_outside_allocator=outside,
                          cap=vllm_cap(cfg, arch, device_bytes), kv_cache=vllm_kv_cache(cfg, arch, device_bytes))


def planned_world_size(cfg: RunConfig) -> int:
    """The GPUs a run is planned for: trainer.world_size, or 1 when it is not stated."""
    return cfg.trainer.world_size or 1


def check_fits(cfg: RunConfig, arch: Architecture, *, world_size: int, device_bytes: int) -> MemoryEstimate:
    """The estimate, or a one-line ConfigError when it does not fit the devices or vLLM's cap. In the rollout phase
    the cap is the device less the KV cache and VLLM_CAP_MARGIN, which the CUDA context outside PyTorch's allocator
    already takes, so a run that fits the device fits the cap: the cap is shown, and checked all the same."""
    found = estimate(cfg, arch, world_size=world_size, device_bytes=device_bytes)
    if not found.fits:
        fewest = next((n for n in (2, 4, 8, 16, 32, 64) if n > world_size and estimate(
            cfg, arch, world_size=n, device_bytes=device_bytes).fits and cfg.rollout.prompts_per_step % n == 0), None)
        more = f"trainer.world_size={fewest} (and launch that many ranks)" if fewest else "more GPUs"
        knob = ", rollout.vllm_extensible_kv_cache=false" if found.cap is not None else ""
        raise ConfigError(f"this run does not fit: {found.summary()}; use {more}, trainer.zero_stage=3, "
                          "trainer.offload_optimizer=true, trainer.gradient_checkpointing=true or a smaller "
                          f"trainer.micro_batch_size or trainer.micro_batch_tokens{knob} (rlvrlab config show "
                          "--memory itemises it)")
    return found


# ------------------------------------------------------------------------------------------------- the toy tier
# Bytes per cell of the toy table (dataset.num_problems x model.toy_num_responses), on the CPU: the float32 logits,
# their gradient, AdamW's two states, the rollout engine's and the reference's copies and the initial table (4 each),
# the correct-set mask (1) and the float64 temporaries of the exact diagnostics every logged step (8 x 8). It errs
# high: the point is to refuse a table that cannot exist (1e11 responses asked for terabytes), not to tune one.
TOY_TABLE_BYTES_PER_CELL = 4 * 7 + 1 + 8 * 8
# Bytes per cell of one step's sampling (rollout.prompts_per_step x model.toy_num_responses): the prompts' rows
# in float64, their log-softmax, probabilities and the log-softmax as a Python list (rlvrlab.rollout.toy_engine)
TOY_SAMPLING_BYTES_PER_CELL = 8 * 3 + 32
TOY_BYTES_PER_RESPONSE = 512  # a sampled response's records (Generation, its row of the batch), per row per step


def toy_bytes(cfg: RunConfig) -> int:
    """What the toy tier holds in memory at its peak (see the constants above): its table, a step's sampling and
    its sampled responses, and one micro-batch's logits in the update (float32 log-softmax and its gradient)."""
    m, r = cfg.model, cfg.rollout
    rows = r.prompts_per_step * r.group_size
    micro = max(1, min(cfg.trainer.micro_batch_size, rows))
    return (cfg.dataset.num_problems * m.toy_num_responses * TOY_TABLE_BYTES_PER_CELL
            + r.prompts_per_step * m.toy_num_responses * TOY_SAMPLING_BYTES_PER_CELL
            + rows * TOY_BYTES_PER_RESPONSE + micro * 2 * m.toy_num_responses * 4 * 4)


def machine_memory_bytes() -> int | None:
    """This machine's memory, or a smaller cgroup (container) limit on this process; None where neither is known."""
    import os

    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        total = None
    try:
        limit_text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        limit = int(limit_text) if limit_text.isdigit() else None
    except (OSError, ValueError):
        limit = None
    known = [value for value in (total, limit) if value]
    return min(known) if known else None


def check_toy_fits(cfg: RunConfig, available: int | None = None) -> int:
    """toy_bytes(cfg), or a one-line ConfigError when it exceeds `available` (default: machine_memory_bytes())."""
    need = toy_bytes(cfg)
    available = machine_memory_bytes() if available is None else available
    if available is not None and need > available:
        m, r = cfg.model, cfg.rollout
        raise ConfigError(f"the toy tier needs ~{need / GIB:,.1f} GiB for its table (dataset.num_problems="
                          f"{cfg.dataset.num_problems} x model.toy_num_responses={m.toy_num_responses}) and a step of "
                          f"rollout.prompts_per_step={r.prompts_per_step} x rollout.group_size={r.group_size}, more "
                          f"than this machine's {available / GIB:.1f} GiB of memory; lower one of them")
    return need


def comment_lines(cfg) -> str:
    """The estimate as YAML comments below `rlvrlab config show --memory`'s config, or why there is none."""
    if cfg.model.tier == "toy":
        return (f"# memory (toy tier, this machine's memory): ~{toy_bytes(cfg) / MIB:,.1f} MiB for its table "
                "and a step's batch\n")
    arch = architecture(cfg)
    if arch is None:
        return "# memory: no estimate (model.path has no config.json here and model.architecture is not given)\n"
    found = estimate(cfg, arch, world_size=planned_world_size(cfg),
                     device_bytes=int(cfg.trainer.device_memory_gib * GIB))
    rows = "".join(f"#   {name:<31} {gib:9.2f} GiB\n" for name, gib in found.rows())
    return f"# memory per GPU ({arch.params / 1e9:.3f}B parameters): {found.summary()}\n{rows}"
