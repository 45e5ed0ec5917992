"""Hand-worked numbers and properties of the algorithm library (complements the reference vectors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlvrlab import algorithms as A
from rlvrlab.algorithms import advantages as adv_fns, losses as loss_fns


def outcome_batch(rewards: list[float], lengths: list[int], groups: list, T: int = 6, seed: int = 0):
    """Rewards on each response's last token, right padding, random behaviour log-probs."""
    gen = torch.Generator().manual_seed(seed)
    B = len(rewards)
    mask = torch.zeros(B, T)
    token_rewards = torch.zeros(B, T, dtype=torch.float64)
    for i, (r, n) in enumerate(zip(rewards, lengths)):
        mask[i, :n] = 1
        token_rewards[i, n - 1] = r
    old_logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    return A.AdvantageInputs(token_rewards, mask.double(), groups, old_logp)


def per_seq(out: A.AdvantageOutput) -> torch.Tensor:
    return out.advantages[:, 0]


# ----------------------------------------------------------------- advantages, hand-worked


def test_grpo_hand_worked() -> None:
    # rewards [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3); A = +-0.5 / 0.57735 = +-0.866025
    inp = outcome_batch([1, 0, 0, 1], [2, 3, 1, 4], ["g"] * 4)
    expected = torch.tensor([1, -1, -1, 1], dtype=torch.float64) * 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(per_seq(adv_fns.grpo(inp, adv_eps=1e-6)), expected)
    # advantages live on response tokens only
    assert float(adv_fns.grpo(inp, adv_eps=1e-6).advantages[2, 1:].abs().sum()) == 0.0


def test_dr_grpo_and_rloo_hand_worked() -> None:
    inp = outcome_batch([1, 0, 0], [1, 1, 1], ["g"] * 3)
    torch.testing.assert_close(per_seq(adv_fns.dr_grpo(inp)), torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=torch.float64))
    # RLOO: r_i minus the mean of the other two
    torch.testing.assert_close(per_seq(adv_fns.rloo(inp)), torch.tensor([1.0, -0.5, -0.5], dtype=torch.float64))


# ----------------------------------------------------------------- every registered estimator, by its traits

ESTIMATORS = sorted(A.ADVANTAGES)
LOSSES = sorted(A.POLICY_LOSSES)


def bound(entry: A.Estimator | A.PolicyLoss):
    """The registered function with the schema's default knobs, bound as the trainer binds them."""
    from rlvrlab.config.schema import AlgorithmConfig

    return A.bind(entry.fn, AlgorithmConfig())


def trait_batch(groups: list | None = None, rewards: list | None = None) -> A.AdvantageInputs:
    """Two interleaved groups of 4 (passk's default K is 4), binary rewards, lengths 1-6."""
    rewards = rewards or [1, 0, 0, 0, 0, 1, 1, 0]
    return outcome_batch(rewards, [3, 2, 4, 1, 5, 2, 6, 3], groups or ["a", "b"] * 4, seed=5)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_every_estimator_is_finite_and_zero_outside_the_mask(name: str) -> None:
    inp = trait_batch()
    out = bound(A.ADVANTAGES[name])(inp)
    assert out.advantages.shape == inp.mask.shape and out.advantages.dtype == inp.token_rewards.dtype
    assert bool(torch.isfinite(out.advantages).all())
    assert bool((out.advantages[inp.mask == 0] == 0).all())


@pytest.mark.parametrize("name", ESTIMATORS)
def test_every_estimator_ignores_row_order(name: str) -> None:
    inp = trait_batch()
    perm = [5, 0, 3, 1, 7, 4, 6, 2]
    shuffled = A.AdvantageInputs(inp.token_rewards[perm], inp.mask[perm], [inp.group_ids[i] for i in perm],
                                 inp.old_logp[perm])
    fn = bound(A.ADVANTAGES[name])
    torch.testing.assert_close(fn(shuffled).advantages, fn(inp).advantages[perm])


@pytest.mark.parametrize("name", ESTIMATORS)
def test_per_group_trait_matches_whether_the_grouping_matters(name: str) -> None:
    """per_group: merging the two groups into one changes the advantages; otherwise group ids are never read."""
    entry, inp = A.ADVANTAGES[name], trait_batch()
    fn = bound(entry)
    merged = fn(trait_batch(groups=["all"] * 8)).advantages
    if entry.per_group:
        assert not torch.equal(fn(inp).advantages, merged)
    else:
        torch.testing.assert_close(fn(inp).advantages, merged, rtol=0, atol=0)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_per_group_trait_matches_zero_signal_from_constant_groups(name: str) -> None:
    """A batch whose every group is constant (all right, all wrong) carries no relative reward signal: every
    per-group estimator gives exactly 0 (D1) unless it declares constant_group_signal (it reads more than the
    rewards); the others (no group baseline) do not."""
    entry = A.ADVANTAGES[name]
    out = bound(entry)(trait_batch(rewards=[1, 0] * 4)).advantages
    assert bool((out == 0).all()) == (entry.per_group and not entry.constant_group_signal)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_reads_old_logp_trait_matches_the_function(name: str) -> None:
    """reads_old_logp: without behaviour log-probs the estimator refuses; otherwise it never looks at them."""
    entry, inp = A.ADVANTAGES[name], trait_batch()
    fn = bound(entry)
    without = A.AdvantageInputs(inp.token_rewards, inp.mask, inp.group_ids, None)
    if entry.reads_old_logp:
        with pytest.raises(ValueError, match="old_logp"):
            fn(without)
        other = A.AdvantageInputs(inp.token_rewards, inp.mask, inp.group_ids, inp.old_logp * 2)
        assert not torch.equal(fn(other).advantages, fn(inp).advantages)
    else:
        torch.testing.assert_close(fn(without).advantages, fn(inp).advantages, rtol=0, atol=0)


def test_passk_hand_worked() -> None:
    # n = 4, c = 1, K = 2: rho = 1 - C(3,2)/C(4,2) = 0.5, sigma = 0.5;
    # correct (1 - rho)/sigma = 1; wrong (1 - rho - C(2,1)/C(3,1))/sigma = -1/3
    inp = outcome_batch([1, 0, 0, 0], [1, 1, 1, 1], ["g"] * 4)
    out = per_seq(adv_fns.passk(inp, passk_k=2, adv_eps=0.0))
    torch.testing.assert_close(out, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3], dtype=torch.float64))
    assert abs(float(out.sum())) < 1e-12  # zero-sum within the group
    with pytest.raises(ValueError, match="binary"):
        adv_fns.passk(outcome_batch([0.5, 0, 1, 0], [1] * 4, ["g"] * 4), passk_k=2, adv_eps=1e-6)
    with pytest.raises(ValueError, match="exceeds"):
        adv_fns.passk(inp, passk_k=5, adv_eps=1e-6)


def test_fgrpo_scales_each_group_by_its_failure_rate() -> None:
    inp = outcome_batch([1, 0, 0, 0], [1] * 4, ["g"] * 4)
    grpo = per_seq(adv_fns.grpo(inp, adv_eps=1e-6))
    torch.testing.assert_close(per_seq(adv_fns.fgrpo(inp, adv_eps=1e-6, fgrpo_gamma=0.5)), grpo * (1 - 1 / 4) ** 0.5)


# The estimators that D2 (docs/algorithms.md) names: the group is their only baseline. A documented list, not a
# trait (the registry-wide tests above cover every estimator); the passk variants refuse singletons instead.
D2_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "opo", "gpg", "ucpo", "fgrpo")


@pytest.mark.parametrize("name", D2_ESTIMATORS)
def test_singletons_and_constant_groups_get_zero(name: str) -> None:
    inp = outcome_batch([0.7, 0.7, 0.7, 1.0], [1, 2, 3, 2], ["c", "c", "c", "solo"])
    assert A.ADVANTAGES[name].per_group
    assert bool((bound(A.ADVANTAGES[name])(inp).advantages == 0).all())


def test_entropy_advantage_bonus_hand_worked() -> None:
    adv = torch.tensor([[1.0, -1.0, 0.1]])
    entropy = torch.tensor([[2.0, 0.5, 1.0]])
    # min(0.4 H, |A|/2): [min(0.8, 0.5), min(0.2, 0.5), min(0.4, 0.05)]
    out = A.entropy_advantage_bonus(adv, entropy, ent_adv_alpha=0.4, ent_adv_kappa=2.0)
    torch.testing.assert_close(out, torch.tensor([[1.5, -0.8, 0.15]]))


# ----------------------------------------------------------------- UCPO properties


@pytest.fixture
def ucpo_batch() -> A.AdvantageInputs:
    rewards = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1]
    lengths = [3, 5, 2, 6, 4, 1, 5, 3, 2, 4, 6, 1]
    groups = ["a", "b", "a", "b", "a", "b", "a", "b", "c", "c", "c", "c"]
    return outcome_batch(rewards, lengths, groups, seed=3)


def test_ucpo_tau_zero_is_grpo(ucpo_batch: A.AdvantageInputs) -> None:
    torch.testing.assert_close(
        adv_fns.ucpo(ucpo_batch, tau=0.0, alpha=0.0, adv_eps=1e-8).advantages,
        adv_fns.grpo(ucpo_batch, adv_eps=1e-8).advantages,
        rtol=0,
        atol=1e-15,
    )


@pytest.mark.parametrize("tau", [0.0, 0.2, 0.5, 1.0])
def test_ucpo_preserves_group_sums_and_bounds_weights(ucpo_batch: A.AdvantageInputs, tau: float) -> None:
    ucpo = per_seq(adv_fns.ucpo(ucpo_batch, tau=tau, alpha=0.0, adv_eps=1e-8))
    grpo = per_seq(adv_fns.grpo(ucpo_batch, adv_eps=1e-8))
    scores = ucpo_batch.token_rewards.sum(-1)
    for g in set(ucpo_batch.group_ids):
        rows = torch.tensor([i for i, x in enumerate(ucpo_batch.group_ids) if x == g])
        correct = rows[scores[rows] > 0]
        # binary rewards: the positive mass and the (zero) group sum are exactly GRPO's
        torch.testing.assert_close(ucpo[correct].sum(), grpo[correct].sum())
        torch.testing.assert_close(ucpo[rows].sum(), torch.zeros((), dtype=torch.float64), atol=1e-12, rtol=0)
        weights = ucpo[correct] / grpo[correct]  # w_i = (1 - tau) + tau n_c t_i
        assert bool((weights >= 1 - tau - 1e-12).all())
        torch.testing.assert_close(weights.mean(), torch.ones((), dtype=torch.float64))


def test_ucpo_upweights_the_least_likely_correct_response() -> None:
    inp = outcome_batch([1, 1, 1, 0], [2, 2, 2, 2], ["g"] * 4)
    old = torch.tensor([[-0.1, -0.1, 0, 0, 0, 0], [-1.0, -1.0, 0, 0, 0, 0], [-3.0, -3.0, 0, 0, 0, 0], [-1, -1, 0, 0, 0, 0]])
    inp = A.AdvantageInputs(inp.token_rewards, inp.mask, inp.group_ids, old.double())
    a = per_seq(adv_fns.ucpo(inp, tau=0.2, alpha=0.0, adv_eps=1e-8))[:3]
    assert float(a[2]) > float(a[1]) > float(a[0]) > 0  # rarer correct answer, larger push


def test_ucpo_alpha_penalises_only_surprising_errors() -> None:
    inp = outcome_batch([1, 0, 0, 0], [2, 2, 2, 2], ["g"] * 4)
    # incorrect set: two equally probable errors and one improbable one (p ~ [0.494, 0.494, 0.011])
    old = torch.tensor([[-1.0, -1.0, 0, 0, 0, 0], [-0.2, -0.2, 0, 0, 0, 0], [-0.2, -0.2, 0, 0, 0, 0], [-4.0, -4.0, 0, 0, 0, 0]])
    inp = A.AdvantageInputs(inp.token_rewards, inp.mask, inp.group_ids, old.double())
    base = per_seq(adv_fns.ucpo(inp, tau=0.2, alpha=0.0, adv_eps=1e-8))
    sharp = per_seq(adv_fns.ucpo(inp, tau=0.2, alpha=0.5, adv_eps=1e-8))
    assert float(sharp[3]) < float(base[3])  # the improbable error is pushed down
    torch.testing.assert_close(sharp[1:3], base[1:3])  # probable errors untouched
    torch.testing.assert_close(sharp[0], base[0])


def test_correct_set_stats_uniform_and_collapsed() -> None:
    inp = outcome_batch([1, 1, 1, 0], [2, 2, 2, 2], ["g"] * 4)
    uniform = A.AdvantageInputs(inp.token_rewards, inp.mask, inp.group_ids, torch.full((4, 6), -1.0, dtype=torch.float64))
    stats = A.correct_set_stats(uniform)
    torch.testing.assert_close(stats.correct_entropy, torch.tensor([math.log(3)], dtype=torch.float64))
    torch.testing.assert_close(stats.correct_max_q, torch.tensor([1 / 3], dtype=torch.float64))
    assert stats.incorrect_entropy.numel() == 0  # only one incorrect response


def test_the_group_layout_is_built_once_and_reading_it_changes_nothing() -> None:
    """AdvantageInputs.groups and .mean_token_logp are built on first read and shared: UCPO's estimator and the
    correct-set statistics on the same inputs give what each gives on fresh inputs, in any order and when repeated;
    inputs made by dataclasses.replace (the loop's, once the update gave old_logp) build their own."""
    import dataclasses

    gen = torch.Generator().manual_seed(4)
    rewards = (torch.rand(24, generator=gen) > 0.4).double().tolist()
    inp = outcome_batch(rewards, torch.randint(1, 6, (24,), generator=gen).tolist(), [f"p{i % 5}" for i in range(24)])

    def fresh():
        return dataclasses.replace(inp)

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b)))

    want_adv = adv_fns.ucpo(fresh(), tau=0.5, alpha=0.3, adv_eps=1e-6).advantages
    want_stats = A.correct_set_stats(fresh())
    shared = fresh()
    assert same(A.correct_set_stats(shared), want_stats)
    for _ in range(2):
        assert torch.equal(adv_fns.ucpo(shared, tau=0.5, alpha=0.3, adv_eps=1e-6).advantages, want_adv)
        assert same(A.correct_set_stats(shared), want_stats)
    assert shared.groups is shared.groups and shared.mean_token_logp is shared.mean_token_logp
    other = dataclasses.replace(shared, old_logp=shared.old_logp * 2)
    assert other.groups is not shared.groups
    assert torch.equal(other.mean_token_logp, shared.mean_token_logp * 2)


# ----------------------------------------------------------------- losses, hand-worked


def loss_inputs(logp, old_logp, adv, mask=None) -> A.LossInputs:
    logp = torch.tensor(logp, dtype=torch.float64).requires_grad_(True)
    old = torch.tensor(old_logp, dtype=torch.float64)
    adv = torch.tensor(adv, dtype=torch.float64)
    mask = torch.ones_like(adv) if mask is None else torch.tensor(mask, dtype=torch.float64)
    return A.LossInputs(logp, old, adv, mask)


def grad(out: A.LossOutput, x: A.LossInputs) -> torch.Tensor:
    return torch.autograd.grad(out.loss, x.logp)[0]


def test_clip_loss_hand_worked() -> None:
    # token 0: A=+1, rho=e^0.1=1.105 inside [0.8, 1.28] -> loss -1.105, grad -1.105
    # token 1: A=+1, rho=e^0.5=1.649 > 1.28 -> loss -1.28, grad 0 (upper clip)
    # token 2: A=-1, rho=e^-0.5=0.607 < 0.8 -> loss 0.8, grad 0 (lower clip)
    # token 3: A=-1, rho=e^1.5=4.48 > c=3 -> loss min(4.48, 3) = 3, grad 0 (dual clip)
    x = loss_inputs([[0.1, 0.5, -0.5, 1.5]], [[0, 0, 0, 0]], [[1, 1, -1, -1]])
    out = loss_fns.clip_loss(x, A.Aggregation("token-sum"), eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    torch.testing.assert_close(out.per_token.detach(), torch.tensor([[-math.exp(0.1), -1.28, 0.8, 3.0]], dtype=torch.float64))
    torch.testing.assert_close(grad(out, x), torch.tensor([[-math.exp(0.1), 0, 0, 0]], dtype=torch.float64))
    assert (out.stats.clip_frac_upper, out.stats.clip_frac_lower, out.stats.dual_clip_frac) == (0.25, 0.25, 0.25)
    # without the dual clip, the A<0 token with rho=4.48 keeps its (large) gradient
    free = loss_fns.clip_loss(x, A.Aggregation("token-sum"), eps_low=0.2, eps_high=0.28, dual_clip_c=None)
    torch.testing.assert_close(grad(free, x)[0, 3], torch.tensor(math.exp(1.5), dtype=torch.float64))


def test_clip_loss_rejects_a_dual_clip_bound_at_or_below_one() -> None:
    x = loss_inputs([[0.0]], [[0.0]], [[-1.0]])
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        loss_fns.clip_loss(x, A.Aggregation(), eps_low=0.2, eps_high=0.2, dual_clip_c=1.0)


def test_clip_loss_on_policy_ratio_is_exactly_one() -> None:
    x = loss_inputs([[-0.3, -2.0, -0.7]], [[-0.3, -2.0, -0.7]], [[1.0, -0.5, 2.0]])
    out = loss_fns.clip_loss(x, A.Aggregation("token-mean"), eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)
    assert out.stats.ratio_mean == 1.0 and out.stats.ratio_max == 1.0 and out.stats.clip_frac == 0.0
    torch.testing.assert_close(grad(out, x), -x.adv / 3)  # plain policy gradient on-policy


def test_cap_matches_the_up_paper_example() -> None:
    # UP paper after eq. 11: pi_old = 0.01, eps_high = 0.28 -> bound 0.0128, budget 0.0028
    x = loss_inputs([[math.log(0.01)]], [[math.log(0.01)]], [[1.0]])
    out = loss_fns.clip_loss(x, A.Aggregation(), eps_low=0.2, eps_high=0.28, dual_clip_c=None)
    assert out.stats.cap_pos_mean == pytest.approx(0.0028, abs=1e-12)
    up = A.with_unbounded_positive(loss_fns.clip_loss)(x, A.Aggregation(), eps_low=0.2, eps_high=0.28, dual_clip_c=None)
    assert up.stats.cap_pos_mean == pytest.approx(0.99, abs=1e-12)  # only pi <= 1 bounds UP


def test_up_positive_branch_gradient_is_minus_a_and_never_clipped() -> None:
    # ratios up to e^10 on positive tokens: DAPO cuts them, UP keeps gradient -A exactly (sum aggregation)
    x = loss_inputs([[0.0, 5.0, 10.0, -3.0]], [[0.0, 0.0, 0.0, 0.0]], [[0.5, 2.0, 1.0, 3.0]])
    up = A.with_unbounded_positive(loss_fns.clip_loss)(
        x, A.Aggregation("token-sum"), eps_low=0.2, eps_high=0.28, dual_clip_c=3.0
    )
    torch.testing.assert_close(grad(up, x), -x.adv)
    torch.testing.assert_close(up.per_token.detach(), -x.adv)  # value -A as well
    assert up.stats.clip_frac_upper == 0.0


def test_up_negative_branch_equals_dapo() -> None:
    gen = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(4, 7, generator=gen).double() * 2, -torch.rand(4, 7, generator=gen).double() * 2
    adv = torch.randn(4, 7, generator=gen).double()
    mask = (torch.rand(4, 7, generator=gen) > 0.2).double()
    knobs = {"eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": None}
    agg = A.Aggregation("token-sum")
    x_up = A.LossInputs(logp.clone().requires_grad_(True), old, adv, mask)
    x_dapo = A.LossInputs(logp.clone().requires_grad_(True), old, adv, mask)
    up = A.with_unbounded_positive(loss_fns.clip_loss)(x_up, agg, **knobs)
    dapo = loss_fns.clip_loss(x_dapo, agg, **knobs)
    neg = (adv <= 0) & mask.bool()
    torch.testing.assert_close(up.per_token.detach()[neg], dapo.per_token.detach()[neg])
    torch.testing.assert_close(grad(up, x_up)[neg], grad(dapo, x_dapo)[neg])
    assert up.stats.clip_frac_lower == dapo.stats.clip_frac_lower


def test_up_gspo_positive_sequences_get_length_normalised_reinforce() -> None:
    # UP paper eq. 16: A_i > 0 -> gradient A_i / |o_i| per token with seq-mean-token-mean over G sequences
    x = loss_inputs([[-1.0, 3.0, 0.0], [0.5, 0.5, 0.5]], [[0.0, 0.0, 0.0]] * 2, [[2.0] * 3, [-1.0] * 3], [[1, 1, 0], [1, 1, 1]])
    up = A.with_unbounded_positive(loss_fns.gspo_loss)(x, A.Aggregation("seq-mean-token-mean"), eps_low=0.2, eps_high=0.2)
    g = grad(up, x)
    torch.testing.assert_close(g[0], torch.tensor([-2.0 / 2 / 2, -2.0 / 2 / 2, 0.0], dtype=torch.float64))
    # the negative sequence keeps GSPO: s = e^0.5 > 1 + eps is not clipped for A < 0, grad -A s / (n G)
    torch.testing.assert_close(g[1], torch.full((3,), math.exp(0.5) / 3 / 2, dtype=torch.float64))


def test_gspo_gradient_is_sequence_ratio_over_length() -> None:
    x = loss_inputs([[0.1, -0.1, 0.05, 0.0]], [[0.0, 0.0, 0.0, 0.0]], [[1.0] * 4], [[1, 1, 1, 0]])
    out = loss_fns.gspo_loss(x, A.Aggregation("seq-mean-token-mean"), eps_low=0.2, eps_high=0.28)
    s = math.exp((0.1 - 0.1 + 0.05) / 3)
    torch.testing.assert_close(grad(out, x), torch.tensor([[-s / 3] * 3 + [0.0]], dtype=torch.float64))


def test_offpolicy_reinforce_is_unclipped_on_both_signs() -> None:
    x = loss_inputs([[2.0, -2.0]], [[0.0, 0.0]], [[1.0, -1.0]])
    out = A.POLICY_LOSSES["reinforce"].fn(x, A.Aggregation("token-sum"))
    torch.testing.assert_close(grad(out, x), torch.tensor([[-math.exp(2.0), math.exp(-2.0)]], dtype=torch.float64))


def test_w_reinforce_down_weights_positive_samples() -> None:
    x = loss_inputs([[-1.0, -2.0]], [[-1.0, -2.0]], [[1.0, -1.0]])
    out = A.POLICY_LOSSES["w_reinforce"].fn(x, A.Aggregation("token-sum"), w_reinforce_lambda=0.1)
    torch.testing.assert_close(grad(out, x), torch.tensor([[-0.1, 1.0]], dtype=torch.float64))


def test_sapo_gate_gives_plain_gradient_on_policy() -> None:
    x = loss_inputs([[-0.5, -1.0]], [[-0.5, -1.0]], [[1.0, -2.0]])
    out = A.POLICY_LOSSES["sapo"].fn(x, A.Aggregation("token-sum"), sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    torch.testing.assert_close(grad(out, x), -x.adv)


def test_kl_cov_penalises_top_covariance_tokens_only() -> None:
    x = loss_inputs([[-0.1, -3.0, -0.2, -2.5]], [[-0.3, -2.0, -0.2, -2.5]], [[2.0, -1.0, 0.1, -0.1]])
    out = A.POLICY_LOSSES["kl_cov"].fn(x, A.Aggregation("token-sum"), cov_ratio=0.25, kl_cov_coef=1.0)
    plain = -x.adv * torch.exp(x.logp.detach() - x.old_logp)
    # covariance (A - mean A)(logp - mean logp) is largest for token 0: it alone pays |delta| = 0.2
    torch.testing.assert_close(out.per_token.detach(), plain + torch.tensor([[0.2, 0, 0, 0]], dtype=torch.float64))


def test_clip_cov_zeroes_a_seeded_random_candidate() -> None:
    x = loss_inputs([[0.0, 2.0, -3.0, 1.5, -2.0, 0.0]], [[0.0] * 6], [[3.0, 3.0, -3.0, -3.0, 0.0, 0.5]])
    torch.manual_seed(0)
    out = A.POLICY_LOSSES["clip_cov"].fn(
        x, A.Aggregation("token-sum"), eps_low=10.0, eps_high=10.0, cov_ratio=0.1, clip_cov_lb=1.0, clip_cov_ub=20.0
    )
    assert out.stats.masked_frac == pytest.approx(1 / 6)
    zeroed = out.per_token.detach() == 0
    assert int(zeroed.sum()) == 2  # the chosen token and token 4 (A = 0)


# ----------------------------------------------------------------- aggregation equivalences


def random_loss_batch(B: int = 8, T: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 2
    old = logp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(B, 1, generator=gen, dtype=torch.float64).expand(B, T).clone()
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).double()
    return logp, old, adv, mask


def loss_variants() -> list:
    """Every registered loss, and UP on top of every up_compatible one."""
    out = [pytest.param(name, False, id=name) for name in LOSSES]
    return out + [pytest.param(name, True, id=f"up_{name}") for name in LOSSES if A.POLICY_LOSSES[name].up_compatible]


def bound_loss(name: str, up: bool):
    from rlvrlab.config.schema import AlgorithmConfig

    fn = A.POLICY_LOSSES[name].fn
    return A.bind(A.with_unbounded_positive(fn) if up else fn, AlgorithmConfig(dual_clip_c=3.0))


@pytest.mark.parametrize("mode", sorted(A.AGGREGATIONS))
@pytest.mark.parametrize(("loss", "up"), loss_variants())
def test_micro_batch_accumulation_equals_full_batch(mode: str, loss: str, up: bool) -> None:
    """1 x 8 gradient accumulation with global denominators == one batch of 8."""
    if not A.POLICY_LOSSES[loss].micro_batch_exact:
        pytest.skip(f"{loss} picks tokens within each micro-batch (micro_batch_exact=False)")
    logp, old, adv, mask = random_loss_batch()
    fn = bound_loss(loss, up)
    full_logp = logp.clone().requires_grad_(True)
    full = fn(A.LossInputs(full_logp, old, adv, mask), A.Aggregation(mode))
    full.loss.backward()
    agg = A.Aggregation(mode, num_tokens=mask.sum(), num_seqs=(mask.sum(-1) > 0).sum(), num_rows=mask.shape[0],
                        loss_scale_factor=mask.shape[1])
    micro_logp = logp.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(logp.shape[0]):
        out = fn(A.LossInputs(micro_logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1]), agg)
        out.loss.backward()
        total = total + out.loss.detach()
    torch.testing.assert_close(total, full.loss.detach())
    torch.testing.assert_close(micro_logp.grad, full_logp.grad)


def test_aggregation_relations() -> None:
    logp, _, _, mask = random_loss_batch(seed=1)
    per_token = logp
    agg = {m: float(A.Aggregation(m)(per_token, mask)) for m in A.AGGREGATIONS}
    n_tok, n_seq, T = float(mask.sum()), float((mask.sum(-1) > 0).sum()), mask.shape[1]
    assert agg["token-sum"] == pytest.approx(agg["token-mean"] * n_tok)
    assert agg["seq-mean-token-sum"] == pytest.approx(agg["token-sum"] / n_seq)
    assert agg["seq-mean-token-sum-norm"] == pytest.approx(agg["seq-mean-token-sum"] / T)
    fixed = float(A.Aggregation("seq-mean-token-sum-norm", loss_scale_factor=100.0)(per_token, mask))
    assert fixed == pytest.approx(agg["seq-mean-token-sum"] / 100.0)
    equal_lengths = torch.ones_like(mask)
    assert float(A.Aggregation("token-mean")(per_token, equal_lengths)) == pytest.approx(
        float(A.Aggregation("seq-mean-token-mean")(per_token, equal_lengths))
    )
    dp = float(A.Aggregation("token-mean", num_tokens=2 * n_tok, dp_size=2)(per_token, mask))
    assert dp == pytest.approx(agg["token-mean"])  # half the tokens on this rank, gradients averaged over 2


# ----------------------------------------------------------------- KL and entropy


def test_kl_estimators_hand_worked() -> None:
    logp = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    # x = logp - ref = [0, -1]; k3 = e^{-x} + x - 1 = [0, e - 2]
    torch.testing.assert_close(A.KL_ESTIMATORS["k3"](logp, ref).detach(), torch.tensor([0.0, math.e - 2], dtype=torch.float64))
    st = A.KL_ESTIMATORS["k3+"](logp, ref)
    torch.testing.assert_close(st.detach(), A.KL_ESTIMATORS["k3"](logp, ref).detach())
    (g,) = torch.autograd.grad(st.sum(), logp)
    torch.testing.assert_close(g, torch.tensor([0.0, -1.0], dtype=torch.float64))  # k2's gradient x


def test_kl_loss_and_entropy_bonus_terms() -> None:
    logp = torch.tensor([[-1.0, -2.0, -9.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    # k1 on valid tokens: [0.5, -1.0], token-mean -0.25, times 0.1
    term = A.kl_loss(logp, ref, mask, A.Aggregation(), kl_coef=0.1, kl_estimator="k1")
    assert float(term) == pytest.approx(-0.025)
    entropy = torch.tensor([[1.0, 3.0, 100.0]], dtype=torch.float64)
    assert float(A.entropy_bonus(entropy, mask, A.Aggregation(), entropy_coef=0.01)) == pytest.approx(-0.02)


def test_entropy_of_uniform_logits() -> None:
    torch.testing.assert_close(A.entropy_from_logits(torch.zeros(2, 3, 5)), torch.full((2, 3), math.log(5)))


def test_registries_hold_documented_functions_with_their_traits() -> None:
    for registry in (A.ADVANTAGES, A.POLICY_LOSSES):
        for name, entry in registry.items():
            assert isinstance(entry, (A.Estimator, A.PolicyLoss)), name
            assert entry.fn.__doc__, f"{name} needs a docstring citing its source"
    for name, fn in A.AGGREGATIONS.items():
        assert fn.__doc__, f"{name} needs a docstring citing its source"
    with pytest.raises(TypeError):  # traits are required: a new entry must state them
        A.Estimator(adv_fns.grpo)  # type: ignore[call-arg]


def test_binary_sign_is_plus_minus_one() -> None:
    inp = outcome_batch([1, 0, 0.5], [1, 2, 1], ["a", "a", "b"])
    expected = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(per_seq(A.ADVANTAGES["binary_sign"].fn(inp)), expected)


def test_bind_algorithm_fixes_exactly_the_functions_knobs_from_the_config() -> None:
    from rlvrlab.config import compose

    cfg = compose(None, ["algorithm=up_dapo"]).algorithm
    algo = A.bind_algorithm(cfg)
    x = loss_inputs([[0.1, 0.5, -0.5]], [[0.0, 0.0, 0.0]], [[1.0, -1.0, -1.0]])
    direct = A.with_unbounded_positive(loss_fns.clip_loss)(x, A.Aggregation("token-mean"), eps_low=0.2, eps_high=0.28,
                                                           dual_clip_c=None)
    torch.testing.assert_close(algo.loss(x, A.Aggregation(cfg.agg)).loss, direct.loss)
    assert algo.entropy_bonus is None and algo.ent_adv is None  # coefficients 0: the terms are off
    ucpo = A.bind_algorithm(compose(None, ["algorithm=ucpo"]).algorithm)
    inp = outcome_batch([1, 0, 1, 1], [2, 3, 1, 2], ["g"] * 4)
    expected = adv_fns.ucpo(inp, tau=0.2, alpha=0.0, adv_eps=1e-8).advantages
    torch.testing.assert_close(ucpo.advantage(inp).advantages, expected)
    assert ucpo.estimator.reads_old_logp


@pytest.mark.parametrize(("loss", "up"), loss_variants())
def test_every_loss_is_finite_with_no_gradient_on_padding(loss: str, up: bool) -> None:
    logp, old, adv, mask = random_loss_batch(seed=2)
    x = A.LossInputs(logp.clone().requires_grad_(True), old, adv, mask)
    out = bound_loss(loss, up)(x, A.Aggregation("token-mean"))
    (g,) = torch.autograd.grad(out.loss, x.logp)
    assert out.loss.shape == () and math.isfinite(float(out.loss.detach()))
    assert out.per_token.shape == mask.shape and bool(torch.isfinite(g).all())
    assert bool((g[mask == 0] == 0).all())


@pytest.mark.parametrize("loss", [name for name in LOSSES if A.POLICY_LOSSES[name].clips_ratio])
def test_clips_ratio_trait_matches_the_function(loss: str) -> None:
    """clips_ratio: eps_low and eps_high are knobs; ratios inside both bounds leave the loss as it is, a ratio
    beyond 1 + eps_high on an A > 0 token is clipped (counted in clip_frac_upper, and eps_high changes the loss)."""
    from rlvrlab.config.schema import AlgorithmConfig

    entry = A.POLICY_LOSSES[loss]
    assert {"eps_low", "eps_high"} <= set(entry.knobs)

    def run(logp: list, eps_high: float) -> A.LossOutput:
        torch.manual_seed(0)  # clip_cov draws tokens
        fn = A.bind(entry.fn, AlgorithmConfig(eps_low=0.2, eps_high=eps_high))
        return fn(loss_inputs([logp], [[0.0] * len(logp)], [[1.0, 1.0, -1.0]]), A.Aggregation("token-sum"))

    inside = [0.05, -0.05, 0.1]
    assert torch.equal(run(inside, 0.2).loss.detach(), run(inside, 0.5).loss.detach())
    beyond = [1.0, 1.0, 1.0]  # rho = e for all tokens: beyond 1 + 0.2 and 1 + 0.5 alike
    assert run(beyond, 0.2).stats.clip_frac_upper > 0
    assert not torch.equal(run(beyond, 0.2).loss.detach(), run(beyond, 0.5).loss.detach())


@pytest.mark.parametrize("loss", [name for name in LOSSES if A.POLICY_LOSSES[name].up_compatible])
def test_up_compatible_losses_have_a_clipped_positive_branch_that_up_replaces(loss: str) -> None:
    """On an A > 0 token beyond the upper clip the base loss caps the gradient at some other value than -A;
    UP gives exactly -A there and leaves the A <= 0 tokens to the base loss."""
    from rlvrlab.config.schema import AlgorithmConfig

    fn = A.POLICY_LOSSES[loss].fn
    cfg = AlgorithmConfig(eps_low=0.2, eps_high=0.2)
    x = loss_inputs([[2.0, 2.0, -0.1]], [[0.0, 0.0, 0.0]], [[1.0, 2.0, -1.0]])
    base = A.bind(fn, cfg)(x, A.Aggregation("token-sum"))
    up = A.bind(A.with_unbounded_positive(fn), cfg)(x, A.Aggregation("token-sum"))
    assert not torch.allclose(grad(base, x)[0, :2], -x.adv[0, :2])
    torch.testing.assert_close(grad(up, x)[0, :2], -x.adv[0, :2])
    torch.testing.assert_close(up.per_token.detach()[0, 2], base.per_token.detach()[0, 2])


# ------------------------------------------------------------------------- UCPO's objective reading (exact)
def _ucpo_objective_value(logits: torch.Tensor, correct: torch.Tensor, tau: float) -> torch.Tensor:
    """J = log Z - tau * KL(u || q) over a whole toy table row: Z = pi(C), q = pi(. | C), u uniform on C."""
    logpi = torch.log_softmax(logits, dim=-1)
    log_z = torch.logsumexp(logpi[correct], dim=0)
    log_q = logpi[correct] - log_z
    k = int(correct.sum())
    kl = (-math.log(k) - log_q).mean()  # sum_u u (log u - log q), u = 1/k
    return log_z - tau * kl


@pytest.mark.parametrize("tau", [0.0, 0.2, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ucpo_objective_weights_give_the_exact_gradient_of_its_objective(tau: float, seed: int) -> None:
    """On a toy table row (every response listed, no sampling): E_pi[(w - b) grad log pi] equals autograd's
    gradient of log Z - tau KL(u || q), for any baseline b."""
    from rlvrlab.policy.toy import ToyPolicy

    gen = torch.Generator().manual_seed(seed)
    M = 12
    correct = torch.zeros(M, dtype=torch.bool)
    correct[torch.randperm(M, generator=gen)[:5]] = True
    table = ToyPolicy(torch.randn(1, M, generator=gen, dtype=torch.float64) * 2).logits.detach().double()[0]

    logits = table.clone().requires_grad_(True)
    (exact,) = torch.autograd.grad(_ucpo_objective_value(logits, correct, tau), logits)

    logits = table.clone().requires_grad_(True)
    logpi = torch.log_softmax(logits, dim=-1)
    pi = logpi.exp().detach()
    z = float(pi[correct].sum())
    w = adv_fns.ucpo_objective_weights(correct, logpi.detach(), tau=tau, z=z)
    for baseline in (0.0, float((pi * w).sum()), 3.7):
        (surrogate,) = torch.autograd.grad((pi * (w - baseline) * logpi).sum(), logits, retain_graph=True)
        assert torch.allclose(surrogate, exact, atol=1e-6, rtol=0), (baseline, surrogate, exact)


def test_ucpo_objective_keeps_pushing_an_all_correct_group_toward_uniform() -> None:
    """`ucpo` (the released code) gives an all-correct group 0; the objective's reading does not, unless q is
    uniform, and it raises the less likely correct responses."""
    inp = outcome_batch([1, 1, 1, 1], [2, 2, 2, 2], ["g"] * 4, T=2)
    logp = torch.tensor([[-0.1, -0.1], [-1.0, -1.0], [-2.0, -2.0], [-3.0, -3.0]], dtype=torch.float64)
    inp = A.AdvantageInputs(inp.token_rewards, inp.mask, inp.group_ids, logp)
    assert torch.all(per_seq(adv_fns.ucpo(inp, tau=0.2, alpha=0.0, adv_eps=1e-8)) == 0)
    objective = per_seq(adv_fns.ucpo_objective(inp, tau=0.2))
    assert objective.abs().sum() > 0 and abs(float(objective.sum())) < 1e-12
    assert torch.all(objective.diff() > 0)  # less likely under pi_old -> larger advantage
    uniform = A.AdvantageInputs(inp.token_rewards, inp.mask, inp.group_ids, torch.full_like(logp, -1.0))
    assert torch.all(per_seq(adv_fns.ucpo_objective(uniform, tau=0.2)) == 0)


def test_ucpo_objective_hand_worked_with_a_repeated_response() -> None:
    """One group of 4: rows 0 and 1 are the same correct response (log pi -1), row 2 another correct one (log pi
    -2), row 3 wrong. Z = 3/4; q over the two distinct correct responses = softmax(-1, -2); with tau = 0.5,
    w = (1/Z) (0.5 + 0.5 / (2 q)) on correct rows, 0 on the wrong one; advantage w - mean(w)."""
    inp = outcome_batch([1, 1, 1, 0], [1, 1, 1, 1], ["g"] * 4, T=1)
    logp = torch.tensor([[-1.0], [-1.0], [-2.0], [-0.5]], dtype=torch.float64)
    inp = A.AdvantageInputs(inp.token_rewards, inp.mask, inp.group_ids, logp,
                            response_keys=["a", "a", "b", "c"])
    q_a = math.exp(-1) / (math.exp(-1) + math.exp(-2))
    w_a, w_b = (0.5 + 0.25 / q_a) / 0.75, (0.5 + 0.25 / (1 - q_a)) / 0.75
    w = torch.tensor([w_a, w_a, w_b, 0.0], dtype=torch.float64)
    assert torch.allclose(per_seq(adv_fns.ucpo_objective(inp, tau=0.5)), w - w.mean(), atol=1e-12)


# --------------------------------------------------------------------- diagnostics by the sign of the advantage
def test_sign_split_hand_worked() -> None:
    """Two A > 0 tokens with ratios e^0.5 and e^-0.1, one A < 0 token with ratio e^-0.4 (below 1 - 0.2: clipped),
    one padding token. DAPO clip (0.2, 0.28): the A > 0 token at e^0.5 > 1.28 is clipped."""
    logp = torch.tensor([[0.5, -0.1, -0.4, 9.0]], dtype=torch.float64)
    x = A.LossInputs(logp, torch.zeros_like(logp), torch.tensor([[1.0, 2.0, -1.0, 5.0]], dtype=torch.float64),
                     torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64))
    agg = A.Aggregation("token-mean", num_tokens=3.0, num_seqs=1.0, num_rows=1.0)
    stats = loss_fns.sign_split(loss_fns.clip_loss(x, agg, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0).stats, x)
    assert stats.ratio_mean_pos == pytest.approx((math.exp(0.5) + math.exp(-0.1)) / 2)
    assert stats.ratio_max_pos == pytest.approx(math.exp(0.5))
    assert stats.approx_kl_pos == pytest.approx(-0.2) and stats.approx_kl_neg == pytest.approx(0.4)
    assert stats.ratio_max_neg == pytest.approx(math.exp(-0.4))
    assert stats.clip_frac_pos == pytest.approx(0.5) and stats.clip_frac_neg == pytest.approx(1.0)
    up = A.bind_algorithm(types_ns(loss="clip", unbounded_positive=True)).loss(x, agg).stats
    assert up.clip_frac_pos == 0.0 and up.ratio_max_pos == pytest.approx(math.exp(0.5))  # UP never clips A > 0


def test_cispo_clip_shares_by_sign_count_its_truncated_tokens() -> None:
    """CISPO truncates the weight of tokens of both signs at both bounds (verl counts them all in pg_clipfrac), so
    its by-sign shares come from the tokens themselves. A > 0 ratios e^-0.1, e^0.1, e^-0.5 (below 1 - 0.2); A < 0
    ratios e^0.4, e^0.5 (above 1 + 0.28); one padding token. CISPO: upper 2/5, lower 1/5; A > 0 side 1 of 3 clipped,
    A <= 0 side 2 of 2 (deriving them from the fractions, as for the sign-restricted losses, gave 2/3 and 1/2).
    UP on CISPO: the A > 0 tokens leave every count; the A < 0 tokens clipped at the upper bound stay there."""
    logp = torch.tensor([[-0.1, 0.1, -0.5, 0.4, 0.5, 9.0]], dtype=torch.float64)
    x = A.LossInputs(logp, torch.zeros_like(logp),
                     torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, 5.0]], dtype=torch.float64),
                     torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64))
    agg = A.Aggregation("token-mean", num_tokens=5.0, num_seqs=1.0, num_rows=1.0)
    cispo = A.bind_algorithm(types_ns(loss="cispo", eps_low=0.2, eps_high=0.28)).loss(x, agg).stats
    assert (cispo.clip_frac_upper, cispo.clip_frac_lower) == (pytest.approx(0.4), pytest.approx(0.2))
    assert cispo.clip_frac_pos == pytest.approx(1 / 3) and cispo.clip_frac_neg == pytest.approx(1.0)
    up = A.bind_algorithm(types_ns(loss="cispo", eps_low=0.2, eps_high=0.28, unbounded_positive=True)).loss(x, agg)
    assert (up.stats.clip_frac_upper, up.stats.clip_frac_lower) == (pytest.approx(0.4), 0.0)
    assert up.stats.clip_frac_pos == 0.0 and up.stats.clip_frac_neg == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["random", "no A > 0 token", "no response token", "padding logp -inf"])
@pytest.mark.parametrize(("eps_high", "dual_clip_c"), [(0.28, None), (0.28, 3.0), (math.inf, None)])
def test_clip_diagnostics_in_one_pass_equal_each_diagnostic_on_its_own(dtype, case, eps_high, dual_clip_c) -> None:
    """clip_loss computes its diagnostics in one stacked reduction (losses._clip_diagnostics): the same numbers as
    the one-at-a-time helpers the other losses use (_token_means, _ratio_stats, _cap_pos), including None and the
    defaults where a set of tokens is empty, and not fooled by padding holding -inf log-probs."""
    logp, old, adv, mask = (t.to(dtype) for t in random_loss_batch(B=12, T=5, seed=3))
    old = logp + (old - logp) * 3  # ratios past every bound
    if case == "no A > 0 token":
        adv = -adv.abs()
    if case == "no response token":
        mask = torch.zeros_like(mask)
    if case == "padding logp -inf":
        logp, old = logp.masked_fill(mask == 0, -math.inf), old.masked_fill(mask == 0, -math.inf)
    x = A.LossInputs(logp, old, adv, mask)
    stats = loss_fns.clip_loss(x, A.Aggregation("token-mean"), eps_low=0.2, eps_high=eps_high,
                               dual_clip_c=dual_clip_c).stats
    delta = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(delta)
    flags = {"clip_frac_upper": (adv > 0) & (ratio > 1.0 + eps_high), "clip_frac_lower": (adv < 0) & (ratio < 0.8)}
    if dual_clip_c is not None:
        unbounded = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.0 + eps_high))
        flags["dual_clip_frac"] = (unbounded > -adv * dual_clip_c) & (adv < 0)
    expected = {**loss_fns._token_means(mask, approx_kl=-delta, **flags), **loss_fns._ratio_stats(ratio, mask),
                "cap_pos_mean": loss_fns._cap_pos(x, eps_high)}
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    for name, value in expected.items():
        got = getattr(stats, name)
        assert (got is None) == (value is None), name
        assert value is None or got == pytest.approx(value, rel=tolerance, abs=tolerance), name
    assert (case == "no A > 0 token") == (stats.cap_pos_mean is None) or case == "no response token"
    if case == "no response token":
        assert (stats.ratio_mean, stats.ratio_max, stats.approx_kl, stats.cap_pos_mean) == (1.0, 1.0, 0.0, None)


@pytest.mark.parametrize(("loss", "up"), loss_variants())
def test_clip_shares_by_sign_add_up_to_the_losss_clip_counts(loss: str, up: bool) -> None:
    """Every loss, with and without UP: the clipped tokens of each sign add up to those the loss counts,
    clip_frac_pos * n_pos + clip_frac_neg * n_neg = (upper + lower + dual) * n, and each share is in [0, 1]."""
    logp, old, adv, mask = random_loss_batch(B=16, T=6, seed=11)
    old = logp + (old - logp) * 3  # ratios well past every clip bound
    adv = torch.cat([adv[:2].abs(), -adv[2:].abs()])  # few A > 0 tokens: a share over them is quick to exceed 1
    adv[3] = 0.0  # A = 0 rows count on the A <= 0 side
    x = A.LossInputs(logp, old, adv, mask)
    stats = loss_fns.with_sign_split(bound_loss(loss, up))(x, A.Aggregation("token-mean")).stats
    valid = mask.bool()
    n_pos, n_neg, n = float((valid & (adv > 0)).sum()), float((valid & (adv <= 0)).sum()), float(valid.sum())
    assert n_pos and n_neg
    assert 0.0 <= stats.clip_frac_pos <= 1.0 and 0.0 <= stats.clip_frac_neg <= 1.0
    counted = (stats.clip_frac_upper + stats.clip_frac_lower + stats.dual_clip_frac) * n
    assert stats.clip_frac_pos * n_pos + stats.clip_frac_neg * n_neg == pytest.approx(counted, abs=1e-9)


@pytest.mark.parametrize(("loss", "up"), loss_variants())
def test_loss_stats_read_after_backward_equal_those_read_before(loss: str, up: bool) -> None:
    """LossOutput.stats may be computed on first read (the loop reads them only on steps that log, after backward):
    for every loss with and without UP, behind every wrapper the loop uses, reading them after backward gives the
    numbers read right away, and a second read gives the same object."""
    logp, old, adv, mask = random_loss_batch(B=12, T=5, seed=5)
    old = logp + (old - logp) * 3  # ratios past the clip bounds: every diagnostic is nonzero somewhere
    fn = loss_fns.with_rollout_correction(loss_fns.with_sign_split(bound_loss(loss, up)))
    outputs = []
    for read_first in (True, False):
        leaf = logp.clone().requires_grad_(True)
        torch.manual_seed(0)  # clip_cov draws its tokens from the global RNG
        out = fn(A.LossInputs(leaf, old, adv, mask), A.Aggregation("token-mean"))
        before = out.stats if read_first else None
        out.loss.backward()
        outputs.append(before if read_first else out.stats)
        assert out.stats is out.stats
    assert outputs[0] == outputs[1]

def types_ns(**overrides):
    from rlvrlab.config.schema import AlgorithmConfig

    cfg = AlgorithmConfig()
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def test_clipped_norm_follows_clip_grad_norm() -> None:
    from rlvrlab.update.base import clipped_norm

    params = [torch.nn.Parameter(torch.zeros(3))]
    params[0].grad = torch.tensor([3.0, 4.0, 0.0])
    before = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
    after = float(params[0].grad.norm())
    assert before == pytest.approx(5.0) and clipped_norm(before, 1.0) == pytest.approx(after, abs=1e-6)
    assert clipped_norm(0.5, 1.0) == pytest.approx(0.5, abs=1e-6) and clipped_norm(7.0, 0.0) == 7.0


# -------------------------------------------------------------- rollout-trainer mismatch correction, every loss
@pytest.mark.parametrize(("loss", "up"), loss_variants())
def test_rollout_correction_weights_every_token_of_every_loss(loss: str, up: bool) -> None:
    """with_rollout_correction: unit weights leave loss and gradient unchanged; weights w make the per-token loss
    w * l before the aggregation. Losses that aggregate their own sequence terms are refused by a config rule."""
    if A.POLICY_LOSSES[loss].aggregates_itself:
        pytest.skip(f"{loss} aggregates itself (config rule refuses algorithm.tis_level with it)")
    logp, old, adv, mask = random_loss_batch(seed=4)
    agg = A.Aggregation("token-mean")
    fn = loss_fns.with_rollout_correction(bound_loss(loss, up))
    base = bound_loss(loss, up)(A.LossInputs(logp.clone().requires_grad_(True), old, adv, mask), agg)
    x = A.LossInputs(logp.clone().requires_grad_(True), old, adv, mask, is_weights=torch.ones_like(mask))
    same = fn(x, agg)
    torch.testing.assert_close(same.loss, base.loss)
    w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(1), dtype=mask.dtype) * 2
    weighted = fn(A.LossInputs(logp, old, adv, mask, is_weights=w), agg)
    torch.testing.assert_close(weighted.per_token, base.per_token.detach() * w)
    torch.testing.assert_close(weighted.loss, agg(base.per_token.detach() * w, mask))


def test_the_config_refuses_rollout_correction_with_a_self_aggregating_loss() -> None:
    from rlvrlab.config import compose
    from rlvrlab.errors import RlvrlabError

    selfish = [name for name, entry in A.POLICY_LOSSES.items() if entry.aggregates_itself]
    assert selfish
    for name in selfish:
        with pytest.raises(RlvrlabError, match="aggregates its own"):
            compose(None, [f"algorithm.loss={name}", "algorithm.dual_clip_c=null", "algorithm.tis_level=token"])


def test_gspo_dual_clip_bounds_negative_sequences_hand_worked() -> None:
    """One A < 0 sequence of two tokens with log-ratios 2 and 2: s = e^2 > c = 3, so its loss -A s is capped at
    -A c = 3 (A = -1); with dual_clip_c None it stays e^2; an A > 0 sequence is untouched."""
    logp = torch.tensor([[2.0, 2.0], [0.1, 0.1]], dtype=torch.float64)
    x = A.LossInputs(logp, torch.zeros_like(logp), torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=torch.float64),
                     torch.ones(2, 2, dtype=torch.float64))
    agg = A.Aggregation("seq-mean-token-mean", num_seqs=2.0)
    capped = loss_fns.gspo_loss(x, agg, eps_low=3e-4, eps_high=4e-4, dual_clip_c=3.0)
    plain = loss_fns.gspo_loss(x, agg, eps_low=3e-4, eps_high=4e-4)
    assert capped.per_token[0].tolist() == pytest.approx([3.0, 3.0])
    assert plain.per_token[0].tolist() == pytest.approx([math.exp(2), math.exp(2)])
    assert capped.per_token[1].tolist() == plain.per_token[1].tolist()
    assert capped.stats.dual_clip_frac == pytest.approx(0.5)


def test_mismatch_kl_is_zero_for_equal_policies_and_k3_is_nonnegative() -> None:
    gen = torch.Generator().manual_seed(0)
    a = -torch.rand(4, 5, generator=gen) * 3
    mask = torch.ones(4, 5)
    assert A.mismatch_kl(a, a, mask) == (0.0, 0.0)
    k3, k1 = A.mismatch_kl(a, a + 0.1 * torch.randn(4, 5, generator=gen), mask)
    assert k3 > 0
    # k3 of a constant log-ratio d is exp(d) - 1 - d, k1 is -d
    assert A.mismatch_kl(a, a - 0.5, mask) == pytest.approx((math.expm1(0.5) - 0.5, -0.5))


# --------------------------------------------------------------------- groups laid out as rows (the batched estimators)
def test_padded_groups_hand_worked() -> None:
    """Ids b, a, b, c, a: groups in sorted-id order a (rows 1, 4), b (rows 0, 2), c (row 3, padded with itself)."""
    from rlvrlab.algorithms.masked import group_index, padded_groups

    index, valid = padded_groups(group_index(["b", "a", "b", "c", "a"]))
    assert index.tolist() == [[1, 4], [0, 2], [3, 3]]
    assert valid.tolist() == [[True, True], [True, True], [True, False]]
    empty, none_valid = padded_groups(torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0, 0) and none_valid.shape == (0, 0)


def test_group_index_numbers_string_ids_as_np_unique_does() -> None:
    """The trainer's string ids take a path of their own (sorted in Python); the numbering is np.unique's, which the
    other id types (ints, arrays, tensors) still go through: sorted by code point, digits, '@', accents, CJK."""
    import random

    from rlvrlab.algorithms.masked import group_index

    rng = random.Random(0)
    alphabet = ["p", "1", "10", "@", "é", "Z", "a", "_", "9", "\u4e2d", " "]
    for _ in range(500):
        pool = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) for _ in range(rng.randint(1, 12))]
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 70))]
        _, inverse = np.unique(np.asarray(ids), return_inverse=True)
        assert group_index(ids).tolist() == inverse.tolist(), ids
        assert group_index(ids).dtype == torch.long
    assert group_index([3, 1, 3]).tolist() == group_index(torch.tensor([3, 1, 3])).tolist() == [1, 0, 1]


def test_ucpo_on_interleaved_groups_equals_each_group_alone() -> None:
    """The batched UCPO (all groups at once, padded) gives each group exactly what it gets as a batch of its own,
    with groups interleaved in the batch, of different sizes, one all-wrong and one with a single correct row."""
    torch.manual_seed(0)
    sizes = {"p": 5, "q": 3, "r": 4, "s": 2}
    correct = {"p": [1, 0, 1, 1, 0], "q": [0, 0, 0], "r": [0, 1, 0, 0], "s": [1, 1]}
    rows = [(g, i) for i in range(5) for g in sizes if i < sizes[g]]  # interleaved: p q r s p q r s ...
    T = 4
    logp = -torch.rand(len(rows), T, dtype=torch.float64) * 2
    mask = torch.ones(len(rows), T)
    mask[::3, 2:] = 0

    def inputs(chosen: list[int]) -> A.AdvantageInputs:
        rewards = torch.zeros(len(chosen), T)
        for k, r in enumerate(chosen):
            g, i = rows[r]
            rewards[k, int(mask[r].sum()) - 1] = float(correct[g][i])
        return A.AdvantageInputs(rewards, mask[chosen], [rows[r][0] for r in chosen], old_logp=logp[chosen])

    everything = list(range(len(rows)))
    for tau, alpha in ((0.0, 0.0), (0.2, 0.0), (1.0, 0.5)):
        together = adv_fns.ucpo(inputs(everything), tau=tau, alpha=alpha, adv_eps=1e-6).advantages
        for g in sizes:
            mine = [r for r in everything if rows[r][0] == g]
            alone = adv_fns.ucpo(inputs(mine), tau=tau, alpha=alpha, adv_eps=1e-6).advantages
            assert torch.allclose(together[mine], alone, atol=1e-7, rtol=0), (g, tau, alpha)
