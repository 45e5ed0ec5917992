"""The bookkeeping of vLLM's sleep mode (GPU only: it needs CUDA's cuMem), for a rollout engine that shares its
process and device with the trainer (docs/training.md, around vLLM's sleep mode).

- What is asleep: level 1 releases the memory tagged "weights" and "kv_cache"; the engine wakes by tag, so nothing
  awake is re-mapped: the sync after an update wakes the weights, the next generate the KV cache.
- One sleep-mode engine per process: vLLM's cuMem allocator is a process-wide singleton.
- The process memory cap: vLLM >= 0.34's extensible KV cache caps PyTorch's caching allocator for the whole process
  after warm-up and sleep() leaves the cap on, which would starve the update. The engine turns the feature off
  where vLLM has it (rlvrlab.rollout.vllm_args) unless rollout.vllm_extensible_kv_cache=true; whatever set a cap, a
  sleeping engine lifts it to 1.0 and puts it back before its KV cache is mapped again (`ProcessMemoryCap`):
  lifting, not refusing, because with the knob on the cap is vLLM's design.

Nothing here imports vllm; tests/rollout/test_vllm_sleep.py and test_vllm_engine_args.py run it on CPU."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from rlvrlab.errors import RlvrlabError

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


class ProcessMemoryCap:
    """The per-process memory fraction of the trainer's CUDA device (torch.cuda.set_per_process_memory_fraction),
    lifted to 1.0 while a sleep-mode engine sleeps and put back before its KV cache is mapped again.

    vLLM >= 0.34's extensible KV cache sets that fraction after warm-up so that PyTorch's allocator leaves room for
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
                               "generate: its weights are gone (the trainer's weights_rewritten_before_next_generate "
                               "must hold)")

    def wake(self, tags: Iterable[str] | None) -> tuple[str, ...]:
        """The tags vLLM's wake_up is to re-map now (tags_to_wake), counted awake from here; the cap is put back
        first when the KV cache is among them."""
        todo = tags_to_wake(self.asleep, tags)
        if "kv_cache" in todo and self.cap is not None:
            self.cap.restore()
        self.asleep = self.asleep - set(todo)
        return todo
