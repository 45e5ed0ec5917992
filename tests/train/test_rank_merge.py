"""rlvrlab.train.stats.merge_ranks: two ranks' shares of a step merge into the statistics of both, by hand-worked
numbers; one share gives that rank's own values."""

import dataclasses

import pytest

from rlvrlab.algorithms import LossStats
from rlvrlab.train import step_stats
from rlvrlab.train.stats import RankShare, Timings, merge_ranks, per_step_token_mean


def _shares() -> tuple[RankShare, RankShare]:
    """Rank a: 4 rows of 10 tokens in 2 groups; rank b: 4 rows of 30 tokens in 2 groups; 2 optimizer steps each."""
    a = RankShare(rows=4, groups=2, tokens=10.0, reward=2.0, correct=2.0, solved=1.0, signal=1.0, truncated=1.0,
                  gap=1.0, gap_max=0.5, mismatch_kl=0.2, mismatch_kl_k1=-0.1, correct_sets=1, correct_entropy=0.6,
                  correct_max_q=0.7, losses=[0.2, 0.4], entropies=[(1.0, 6.0), (2.0, 4.0)], kls=[(0.1, 6.0), (0.3, 4.0)],
                  loss_items=[(LossStats(clip_frac_upper=0.1, ratio_mean=1.0, ratio_max=1.5, ratio_mean_pos=0.9,
                                         ratio_mean_neg=1.05), {"tokens": 10.0, "pos": 4.0, "neg": 6.0})],
                  generate_seconds=2.0, filled_groups=1,
                  timings=Timings(generate=2.0, verify=0.5, logp=1.0, update=3.0, sync=0.1, step=6.0))
    b = RankShare(rows=4, groups=2, tokens=30.0, reward=1.0, correct=1.0, solved=1.0, signal=2.0, truncated=0.0,
                  gap=3.0, gap_max=0.25, mismatch_kl=0.6, mismatch_kl_k1=0.3, correct_sets=0, correct_entropy=0.0,
                  correct_max_q=0.0, losses=[0.0, 0.2], entropies=[(0.5, 2.0), (1.0, 12.0)], kls=[(0.5, 2.0), (0.0, 12.0)],
                  loss_items=[(LossStats(clip_frac_upper=0.3, ratio_mean=1.1, ratio_max=1.2, ratio_mean_neg=1.1),
                               {"tokens": 30.0, "pos": 0.0, "neg": 30.0})],
                  generate_seconds=4.0, filled_groups=2,
                  timings=Timings(generate=4.0, verify=0.25, logp=1.5, update=2.5, sync=0.2, step=7.0))
    return a, b


def test_two_ranks_merge_into_the_statistics_of_both():
    merged = merge_ranks(list(_shares()))
    want = {
        "reward": 3 / 8, "accuracy": 3 / 8, "solved_groups": 2 / 4, "signal_groups": 3 / 4,
        "response_length": 40 / 8, "overlong_frac": 1 / 8,  # over the 8 rows, the 4 groups, the 40 tokens
        "logp_gap_max": 0.5, "logp_gap_mean": 4 / 40, "mismatch_kl": 0.8 / 40, "mismatch_kl_k1": 0.2 / 40,
        "correct_entropy": 0.6, "correct_max_q": 0.7,  # rank a's one correct set; rank b has none
        "policy_loss": (0.3 + 0.1) / 2,  # the mean of the ranks' losses (each scaled by the number of ranks)
        # step 1: (1.0 x 6 + 0.5 x 2) / 8 = 0.875; step 2: (2.0 x 4 + 1.0 x 12) / 16 = 1.25
        "entropy": (0.875 + 1.25) / 2,
        # step 1: (0.1 x 6 + 0.5 x 2) / 8 = 0.2; step 2: (0.3 x 4 + 0 x 12) / 16 = 0.075
        "kl_ref": (0.2 + 0.075) / 2,
        "tokens_per_s": 40 / 4.0,  # both ranks' tokens in the slower rank's generation seconds
        "filled_groups": 3.0,
    }
    for name, value in want.items():
        assert merged[name] == pytest.approx(value, rel=1e-12), name
    assert merged["timings"] == Timings(generate=4.0, verify=0.5, logp=1.5, update=3.0, sync=0.2, step=7.0)
    loss = merged["loss"]
    assert loss.clip_frac_upper == pytest.approx((0.1 * 10 + 0.3 * 30) / 40)  # over both ranks' 40 loss tokens
    assert loss.ratio_mean == pytest.approx((1.0 * 10 + 1.1 * 30) / 40)
    assert loss.ratio_max == 1.5
    assert loss.ratio_mean_pos == pytest.approx(0.9)  # rank a's 4 A > 0 tokens only
    assert loss.ratio_mean_neg == pytest.approx((1.05 * 6 + 1.1 * 30) / 36)  # 6 + 30 A <= 0 tokens
    assert loss.ratio_max_pos is None and loss.cap_pos_mean is None  # no rank has one


def test_one_share_gives_that_ranks_own_values():
    a, _ = _shares()
    own = merge_ranks([a])
    assert own["reward"] == 0.5 and own["response_length"] == 2.5 and own["tokens_per_s"] == 5.0
    assert own["entropy"] == 1.5 and own["kl_ref"] == pytest.approx(0.2)  # the plain means over its steps
    assert own["policy_loss"] == pytest.approx(0.3) and own["timings"] == a.timings
    assert own["loss"].clip_frac_upper == 0.1 and own["loss"].ratio_max == 1.5


def test_without_a_reference_or_correct_sets_those_are_none():
    a, b = (dataclasses.replace(s, kls=[], correct_sets=0, correct_entropy=0.0, correct_max_q=0.0) for s in _shares())
    merged = merge_ranks([a, b])
    assert merged["kl_ref"] is None and merged["correct_entropy"] is None and merged["correct_max_q"] is None


def test_per_step_token_means():
    """A step without tokens on any rank counts 0 (a token mean over none); ranks must take the same steps."""
    assert per_step_token_mean([[(2.0, 3.0), (0.0, 0.0)], [(4.0, 1.0), (0.0, 0.0)]]) == pytest.approx((10 / 4) / 2)
    with pytest.raises(ValueError):
        per_step_token_mean([[(1.0, 1.0)], [(1.0, 1.0), (2.0, 1.0)]])


def test_heldout_metrics_over_ranks(monkeypatch):
    """eval/ values are averaged, time/eval is the slowest rank's; one process: the metrics as they are."""
    one = {"eval/heldout/reward": 0.5, "time/eval": 2.0}
    assert step_stats.heldout_over_ranks(one) is one
    other = {"eval/heldout/reward": 0.25, "time/eval": 3.0}
    monkeypatch.setattr(step_stats, "all_gather_objects", lambda value, what: [value, other])
    assert step_stats.heldout_over_ranks(one) == {"eval/heldout/reward": 0.375, "time/eval": 3.0}
