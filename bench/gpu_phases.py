"""Training steps with the memory of each phase measured, next to rlvrlab.config.memory's estimate.

    torchrun --nproc_per_node N bench/gpu_phases.py [override ...]     # bench/gpu_smoke.sh: every rank
    python bench/gpu_phases.py [--record FILE] [override ...]         # bench/device_check.sh: one process
    python bench/gpu_phases.py --build-model DIR SHAPE [override ...] # a random model of SHAPE (r1-1.5b, small)
    python bench/gpu_phases.py --compare FILE                         # the runs recorded in FILE, side by side

Builds the run as `rlvrlab train` does (rlvrlab.train.setup.build: device and process group first, then the engines)
and runs cfg.steps steps of the loop's own train_step, logging the same metrics to the run's tracker (none with
tracking.backend=none). The real engines are wrapped by decorators that only mark phase boundaries:

    rollout  generate() (vLLM awake: its pool is device memory outside PyTorch's allocator)
    logp     from the engine's sleep() to the update's first forward (the trainer's separate log-prob pass)
    update   from the first forward that records a graph to sync_weights() (the optimizer step included)
    sync     sync_weights() (vLLM's weights woken, the trainer's weights copied in)

On a GPU the peak of a phase is PyTorch's max_memory_allocated() and max_memory_reserved() since the last boundary,
and the device's use: the reserved peak plus the memory held outside PyTorch (device used - PyTorch reserved, read at
the boundary: vLLM's pool, the CUDA context, NCCL). On a CPU it is the process's peak resident set (VmHWM, reset at
each boundary through /proc/self/clear_refs) above its resident set before the run was built. Each phase is printed
beside the estimate of the phase that holds it (on a CPU the estimate without a GPU's fixed overheads and with the
CPU's optimizer step: rlvrlab.config.memory.estimate(on_gpu=False)): rollout and sync beside the rollout phase
(trainer state + engine), logp and update beside the larger of the update phase (trainer state + one micro-batch's
activations, logits and entropy) and the optimizer step phase (trainer state + the step's temporaries), the hf
engine's weights staying in both; the log-prob pass keeps no activations, so that bounds it from above.

--build-model writes a randomly initialised Qwen2ForCausalLM of SHAPE's config.json values and a byte-level BPE
tokenizer with exactly the model's vocabulary (every byte, then byte pairs, then byte pair + byte; Qwen's special
tokens at their ids) to DIR, on the GPU when there is one: the model's shape without the hub. Its last line is the
override rollout.max_prompt_tokens=N, N the longest training prompt of the composed config's dataset under that
tokenizer, so that the estimate's rows are as long as the run's.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

GIB, MIB = 2**30, 2**20

# deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B's config.json: the values that set its shape and its numerics
R1_1_5B = dict(
    hidden_size=1536, num_hidden_layers=28, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
    vocab_size=151_936, tie_word_embeddings=False, rope_theta=10_000.0, max_position_embeddings=131_072,
    rms_norm_eps=1e-6, hidden_act="silu", attention_dropout=0.0, bos_token_id=151_643, eos_token_id=151_643,
    use_sliding_window=False, torch_dtype="bfloat16",
)
# the same family at small dims for a CPU: GQA 6:1, untied embeddings, MLP 5.8x hidden as R1-1.5B; 0.76M parameters
SMALL = dict(
    R1_1_5B, hidden_size=96, num_hidden_layers=2, intermediate_size=560, num_attention_heads=6, num_key_value_heads=1,
    vocab_size=2048, bos_token_id=2045, eos_token_id=2045, torch_dtype="float32",
)
SHAPES = {"r1-1.5b": R1_1_5B, "small": SMALL}
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen's ids 151643-151645; a smaller vocabulary's last 3

# phase -> the estimate's phase that holds it (see the module docstring)
PHASES = {"rollout": "rollout", "logp": "update/step", "update": "update/step", "sync": "rollout"}


def build_model(folder: Path, shape: str, overrides: list[str]) -> None:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from rlvrlab import components
    from rlvrlab.config import compose
    from rlvrlab.data import load_split
    from rlvrlab.policy.tiny import CHAT_TEMPLATE

    if shape not in SHAPES:
        sys.exit(f"shape {shape!r} is unknown; give one of {', '.join(SHAPES)}")
    values = dict(SHAPES[shape])
    dtype = components.torch_dtype(values.pop("torch_dtype"))
    config = Qwen2Config(**values)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tic = time.perf_counter()
    with device:  # initialised where it will train: 1.8B parameters take seconds on a GPU, a minute on a CPU
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_byte_pair_tokenizer(config.vocab_size),
                                        eos_token=SPECIAL[0], pad_token=SPECIAL[0],
                                        additional_special_tokens=list(SPECIAL[1:]))
    tokenizer.padding_side = "left"
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    print(f"model: {shape}, {params / 1e9:.3f}B parameters, {dtype}, built on {device} in "
          f"{time.perf_counter() - tic:.0f} s -> {folder}", file=sys.stderr, flush=True)

    cfg = compose(None, [*overrides, "model.tier=real", f"model.path={folder}"])
    prompt_ids = components.prompt_renderer(cfg.dataset, components.load_tokenizer(folder))
    print(f"rollout.max_prompt_tokens={max(len(prompt_ids(p)) for p in load_split(cfg.dataset, cfg.model))}")


def _byte_pair_tokenizer(vocab_size: int):
    """A byte-level BPE of exactly vocab_size ids: the 256 byte symbols, then byte pairs, then byte pair + byte, in
    order, with SPECIAL at Qwen's ids 151643-151645 (or the last three ids of a smaller vocabulary). Every text
    encodes and decodes losslessly; ids are what a tokenizer of the model's vocabulary gives, not Qwen's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    special_at = min(151_643, vocab_size - len(SPECIAL))
    if special_at < len(alphabet):
        raise ValueError(f"a vocabulary of {vocab_size} cannot hold the {len(alphabet)} byte symbols and "
                         f"{len(SPECIAL)} special tokens")
    symbols, merges = list(alphabet), []
    pairs = ((a, b) for a in alphabet for b in alphabet)
    triples = ((a + b, c) for a in alphabet for b in alphabet for c in alphabet)
    for left, right in itertools.chain(pairs, triples):  # lazily: only as many as the vocabulary holds
        if len(symbols) == vocab_size - len(SPECIAL):
            break
        symbols.append(left + right)
        merges.append((left, right))
    symbols[special_at:special_at] = SPECIAL
    core = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=merges))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL))
    return core


class CudaMeter:
    """Peaks since the last reset: PyTorch's allocated and reserved bytes, and the device's use (reserved peak plus
    what is held outside PyTorch's allocator)."""

    columns = ("allocated", "reserved", "device")
    unit, unit_name = GIB, "GiB"

    def __init__(self) -> None:
        import torch

        self.cuda = torch.cuda
        self.total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory

    def read(self) -> dict[str, float]:
        free, total = self.cuda.mem_get_info()
        outside = (total - free) - self.cuda.memory_reserved()
        reserved = self.cuda.max_memory_reserved()
        return {"allocated": self.cuda.max_memory_allocated(), "reserved": reserved, "device": reserved + outside}

    def reset(self) -> None:
        self.cuda.reset_peak_memory_stats()

    def describe(self) -> str:
        props = self.cuda.get_device_properties(self.cuda.current_device())
        return f"{props.name}, {props.total_memory / GIB:.1f} GiB"


class HostMeter:
    """The process's peak resident set since the last reset (Linux: VmHWM of /proc/self/status, reset to VmRSS by "5"
    into /proc/self/clear_refs), above its resident set when the meter was made, less the file-backed pages mapped
    since (RssFile: libraries the run paged in, not tensors; as tests/services/memory_check.py measures)."""

    columns = ("rss",)
    unit, unit_name = MIB, "MiB"

    def __init__(self) -> None:
        self.total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.reset()
        self.baseline, self.baseline_file = self._kib("VmRSS"), self._kib("RssFile")

    @staticmethod
    def _kib(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise RuntimeError(f"/proc/self/status has no {field}")

    def read(self) -> dict[str, float]:
        paged_in = max(0, self._kib("RssFile") - self.baseline_file)
        return {"rss": (self._kib("VmHWM") - self.baseline - paged_in) * 1024}

    def reset(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")

    def describe(self) -> str:
        return f"CPU, {self.total / GIB:.1f} GiB"


def measure(overrides: list[str], record: Path | None) -> None:
    import torch

    from rlvrlab.config import compose, memory
    from rlvrlab.train.loop import TrainState, train_step
    from rlvrlab.train.metrics import step_metrics
    from rlvrlab.train.setup import build

    cfg = compose(None, overrides)
    cuda = torch.cuda.is_available()
    if not cuda:
        if cfg.trainer.engine == "deepspeed":  # imported before the baseline: its import is not the run's memory
            import deepspeed  # noqa: F401
        import transformers.modeling_utils  # noqa: F401
    meter = CudaMeter() if cuda else HostMeter()
    tic = time.perf_counter()
    run = build(cfg)
    built = time.perf_counter() - tic
    peaks: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(meter.columns, 0.0))
    current = {"phase": "setup"}

    def boundary(next_phase: str) -> None:
        for column, value in meter.read().items():
            peaks[current["phase"]][column] = max(peaks[current["phase"]][column], value)
        meter.reset()
        current["phase"] = next_phase

    rollout, update = run.rollout, run.update
    generate, sleep, sync = rollout.generate, rollout.sleep, rollout.sync_weights

    def generate_marked(*args, **kwargs):
        boundary("rollout")
        out = generate(*args, **kwargs)
        boundary("after rollout")
        return out

    def sleep_marked(*args, **kwargs):
        sleep(*args, **kwargs)
        boundary("logp")

    def first_graph_forward(module, args):  # the log-prob pass runs without grad; the update's forwards with it
        if torch.is_grad_enabled() and current["phase"] != "update":
            boundary("update")

    def sync_marked(weights):
        boundary("sync")
        sync(weights)
        boundary("idle")

    rollout.generate, rollout.sleep, rollout.sync_weights = generate_marked, sleep_marked, sync_marked
    hook = update.module.register_forward_pre_hook(first_graph_forward)

    state, steps_tic = TrainState(), time.perf_counter()
    for step in range(cfg.steps):
        tic = time.perf_counter()
        stats, _ = train_step(run, state, step)
        state.step = step + 1
        run.tracker.log_metrics(step, step_metrics(stats))
        print(f"rank {run.rank} step {step}: {time.perf_counter() - tic:.1f} s, reward {stats.reward:.3f}, response "
              f"length {stats.response_length:.0f}, logp gap max {stats.logp_gap_max:.2e}", flush=True)
    seconds = time.perf_counter() - steps_tic
    hook.remove()
    run.tracker.finish("FINISHED")

    arch = memory.architecture(cfg)
    estimate = memory.estimate(cfg, arch, world_size=run.world_size, device_bytes=meter.total, on_gpu=cuda) \
        if arch else None
    expected = {"rollout": estimate.rollout, "update/step": max(estimate.update, estimate.step)} if estimate else {}
    u, t = meter.unit, cfg.trainer
    print(f"rank {run.rank} ({meter.describe()}): peak memory per phase ({meter.unit_name}), "
          f"{cfg.model.dtype}, {t.engine}{f' ZeRO-{t.zero_stage}' if t.engine == 'deepspeed' else ''}, "
          f"{cfg.rollout.engine} engine, trainer.gradient_checkpointing={str(t.gradient_checkpointing).lower()}; "
          f"built in {built:.0f} s, {cfg.steps} steps in {seconds:.0f} s")
    print(f"  {'phase':<8}" + "".join(f"{c:>11}" for c in meter.columns) + f"{'estimate':>11}")
    for phase, held_by in PHASES.items():
        row = "".join(f"{peaks[phase][c] / u:11.3f}" for c in meter.columns)
        estimated = f"{expected[held_by] / u:11.3f}  estimate: {held_by} phase" if expected else "  (no estimate)"
        print(f"  {phase:<8}{row}{estimated}")
    if estimate is not None:
        print("  estimate itemised (GiB): " + json.dumps({name: round(gib, 3) for name, gib in estimate.rows()}))
    print("  " + _packages(), flush=True)
    if record is not None and run.rank == 0:
        with record.open("a") as out:
            out.write(json.dumps({"gradient_checkpointing": t.gradient_checkpointing, "unit": meter.unit_name,
                                  "peaks": {p: peaks[p] for p in PHASES}, "estimate": expected}) + "\n")
    run.rollout.close()
    run.verifier.close()
    run.update.close()


def _packages() -> str:
    """The versions of what the run imported that a stock GPU image may lack, and where each came from
    (DEVICE_CHECK_SITE: the folder bench/device_check.sh installed the uploaded wheels into)."""
    import importlib.metadata

    site = os.environ.get("DEVICE_CHECK_SITE")
    words = []
    for module, dist in (("torch", "torch"), ("transformers", "transformers"), ("deepspeed", "deepspeed"),
                         ("omegaconf", "omegaconf"), ("pydantic", "pydantic"), ("hjson", "hjson")):
        if module not in sys.modules:
            words.append(f"{module} not imported")
            continue
        where = getattr(sys.modules[module], "__file__", None) or ""
        origin = " (wheel folder)" if site and Path(where).resolve().is_relative_to(Path(site).resolve()) else ""
        words.append(f"{module} {importlib.metadata.version(dist)}{origin}")
    return "packages: " + ", ".join(words)


def compare(record: Path) -> None:
    """The recorded runs (one JSON line each) side by side: each phase's peaks and estimate per run."""
    runs = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    if not runs:
        sys.exit(f"{record} holds no recorded run")
    unit = {"GiB": GIB, "MiB": MIB}[runs[0]["unit"]]
    names = [f"gc={'on' if r['gradient_checkpointing'] else 'off'}" for r in runs]
    print(f"peak memory per phase ({runs[0]['unit']}), measured / estimate: " + " | ".join(names))
    for phase, held_by in PHASES.items():
        cells = []
        for r in runs:
            measured = "/".join(f"{v / unit:.3f}" for v in r["peaks"][phase].values())
            cells.append(f"{measured} / {r['estimate'][held_by] / unit:.3f}" if r["estimate"] else measured)
        print(f"  {phase:<8}" + " | ".join(cells))


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--build-model"]:
        build_model(Path(argv[1]), argv[2], argv[3:])
    elif argv[:1] == ["--compare"]:
        compare(Path(argv[1]))
    elif argv[:1] == ["--record"]:
        measure(argv[2:], Path(argv[1]))
    else:
        measure(argv, None)
