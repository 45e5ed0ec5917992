"""Advantage estimators: (AdvantageInputs, scalar knobs) -> AdvantageOutput.

Group statistics are computed in float64 and cast back to the rewards' dtype, so a group whose rewards are all
exactly equal gets exactly zero advantage (deliberate difference D1 from verl, which computes in float32); a response
with no sibling gets 0 from every estimator whose only baseline is the group (D2). Both, and which estimators keep
verl's value: docs/algorithms.md.

Every estimator is registered once, with its traits, in ADVANTAGES at the bottom of this module."""

from __future__ import annotations

import math

import torch

from .masked import group_count, group_index, group_sum, masked_whiten
from .registry import Estimator
from .types import AdvantageInputs, AdvantageOutput, CorrectSetStats


def _scores64(inp: AdvantageInputs) -> torch.Tensor:
    return inp.token_rewards.to(torch.float64).sum(dim=-1)  # [B]


def _broadcast(per_seq: torch.Tensor, inp: AdvantageInputs) -> AdvantageOutput:
    """[B] float64 -> [B, T] in the rewards' dtype, zero outside the mask."""
    adv = per_seq.to(inp.token_rewards.dtype).unsqueeze(-1) * inp.mask.to(inp.token_rewards.dtype)
    return AdvantageOutput(advantages=adv, returns=adv)


def _exact_if_constant(baseline: torch.Tensor, scores: torch.Tensor, gidx: torch.Tensor) -> torch.Tensor:
    """[G] group baselines, replaced by the common value in groups whose rewards are all exactly equal.

    A float mean of 3 x 0.7 is 0.7000000000000001; verl's float32 GRPO turns such rounding into A = 0.056.
    """
    low = torch.full_like(baseline, math.inf).scatter_reduce(0, gidx, scores, "amin")
    high = torch.full_like(baseline, -math.inf).scatter_reduce(0, gidx, scores, "amax")
    return torch.where(low == high, low, baseline)


def _group_mean_std(scores: torch.Tensor, gidx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, unbiased group std (0 for singletons) and group size, all [B] float64."""
    count = group_count(gidx)  # [G]
    mean = _exact_if_constant(group_sum(scores, gidx) / count, scores, gidx)  # [G]
    dev = scores - mean[gidx]  # [B]
    var = group_sum(dev**2, gidx) / (count - 1).clamp(min=1)  # [G]; singleton: 0 / 1
    return mean[gidx], var.sqrt()[gidx], count[gidx]


def grpo(inp: AdvantageInputs, *, adv_eps: float) -> AdvantageOutput:
    """GRPO (Shao et al. 2024, eq. 3): A_i = (r_i - mean_g) / (std_g + eps), std unbiased."""
    scores = _scores64(inp)
    mean, std, _ = _group_mean_std(scores, group_index(inp.group_ids))
    return _broadcast((scores - mean) / (std + adv_eps), inp)


def dr_grpo(inp: AdvantageInputs) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025, §3.2): A_i = r_i - mean_g, no std normalisation."""
    scores = _scores64(inp)
    mean, _, _ = _group_mean_std(scores, group_index(inp.group_ids))
    return _broadcast(scores - mean, inp)


def rloo(inp: AdvantageInputs) -> AdvantageOutput:
    """RLOO (Ahmadian et al. 2024): r_i minus the mean of the other K-1 responses = K/(K-1)(r_i - mean_g)."""
    scores = _scores64(inp)
    mean, _, count = _group_mean_std(scores, group_index(inp.group_ids))
    return _broadcast(count / (count - 1).clamp(min=1) * (scores - mean), inp)


def opo(inp: AdvantageInputs) -> AdvantageOutput:
    """OPO (Hao et al. 2025): baseline = length-weighted group mean sum(n_j r_j) / sum(n_j)."""
    scores = _scores64(inp)
    gidx = group_index(inp.group_ids)
    lengths = inp.mask.to(torch.float64).sum(dim=-1)  # [B]
    baseline = group_sum(lengths * scores, gidx) / group_sum(lengths, gidx).clamp(min=1)  # [G]
    baseline = _exact_if_constant(baseline, scores, gidx)
    return _broadcast(scores - baseline[gidx], inp)


def gpg(inp: AdvantageInputs) -> AdvantageOutput:
    """GPG (Chu et al. 2025): A_i = alpha (r_i - mean_g), alpha = B / max(1, #{r != 0 in the batch})."""
    scores = _scores64(inp)
    mean, _, _ = _group_mean_std(scores, group_index(inp.group_ids))
    alpha = scores.shape[0] / max(1, int(torch.count_nonzero(scores).item()))
    return _broadcast(alpha * (scores - mean), inp)


def binary_sign(inp: AdvantageInputs) -> AdvantageOutput:
    """A = +1 for a correct response (reward > 0), -1 otherwise, no baseline: the +-1 rewards of
    positive/negative sample reinforcement and W-REINFORCE (Zhu et al. 2025, arXiv 2506.01347)."""
    scores = _scores64(inp)
    return _broadcast(torch.where(scores > 0, 1.0, -1.0).to(torch.float64), inp)


def _verl_group_zscore(scores: torch.Tensor, gidx: torch.Tensor, adv_eps: float, norm_by_std: bool) -> torch.Tensor:
    """verl's GRPO with its singleton convention (mean 0, std 1); only used before batch whitening."""
    mean, std, count = _group_mean_std(scores, gidx)
    singleton = count == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)
    return (scores - mean) / (std + adv_eps) if norm_by_std else scores - mean


def _whitened(per_seq: torch.Tensor, inp: AdvantageInputs) -> AdvantageOutput:
    """[B] float64 on every response token, whitened over the batch's tokens: [B, T] in the rewards' dtype."""
    mask = inp.mask.to(torch.float64)
    adv = (masked_whiten(per_seq.unsqueeze(-1) * mask, mask) * mask).to(inp.token_rewards.dtype)
    return AdvantageOutput(advantages=adv, returns=adv)


def reinforce_pp_baseline(inp: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++-baseline (Hu et al. 2025): r - mean_g on every token, then whitened over the batch."""
    scores = _scores64(inp)
    return _whitened(_verl_group_zscore(scores, group_index(inp.group_ids), 0.0, norm_by_std=False), inp)


def gdpo(inp: AdvantageInputs, *, adv_eps: float) -> AdvantageOutput:
    """GDPO (Liu et al. 2026) with one reward: GRPO advantage, then whitened over the batch."""
    scores = _scores64(inp)
    return _whitened(_verl_group_zscore(scores, group_index(inp.group_ids), adv_eps, norm_by_std=True), inp)


def reinforce_pp(inp: AdvantageInputs, *, gamma: float) -> AdvantageOutput:
    """REINFORCE++ (Hu et al. 2025): discounted reward-to-go per token, whitened over the batch; no groups.

    At mask-0 tokens inside a response (tool observations) the running return is carried across
    unchanged and the stored return is 0, as in current verl (legacy verl reset it there).
    """
    rewards = inp.token_rewards.to(torch.float64)  # [B, T]
    valid = inp.mask.bool()
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=torch.float64, device=rewards.device)  # [B]
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid[:, t], running, torch.zeros_like(running))
    mask = inp.mask.to(torch.float64)
    adv = masked_whiten(returns, mask) * mask
    dtype = inp.token_rewards.dtype
    return AdvantageOutput(advantages=adv.to(dtype), returns=returns.to(dtype))


def _top2_gap(scores: torch.Tensor, gidx: torch.Tensor, adv_eps: float, norm_by_std: bool) -> torch.Tensor:
    """Pass@k GRPO (Chen et al. 2025, arXiv 2503.19595): only each group's arg-max gets r_max - r_2nd."""
    adv = torch.zeros_like(scores)
    _, std, _ = _group_mean_std(scores, gidx)
    for g in range(int(gidx.max().item()) + 1):
        rows = torch.nonzero(gidx == g).flatten()
        if rows.numel() < 2:
            raise ValueError(f"pass@k advantage needs at least 2 responses per group; group {g} has {rows.numel()}")
        top, order = torch.topk(scores[rows], 2)
        gap = top[0] - top[1]
        adv[rows[order[0]]] = gap / (std[rows[0]] + adv_eps) if norm_by_std else gap
    return adv


def grpo_passk(inp: AdvantageInputs, *, adv_eps: float) -> AdvantageOutput:
    """Pass@k GRPO, std-normalised: the best response of a group gets (r_max - r_2nd)/(std_g + eps)."""
    return _broadcast(_top2_gap(_scores64(inp), group_index(inp.group_ids), adv_eps, norm_by_std=True), inp)


def dr_grpo_passk(inp: AdvantageInputs) -> AdvantageOutput:
    """Pass@k GRPO without std normalisation: the best response gets r_max - r_2nd."""
    return _broadcast(_top2_gap(_scores64(inp), group_index(inp.group_ids), 0.0, norm_by_std=False), inp)


def passk(inp: AdvantageInputs, *, passk_k: int, adv_eps: float) -> AdvantageOutput:
    """Pass@K training (Chen et al. 2025, analytic form; docs/references.md, "UCPO code" §6) for binary rewards.

    With n responses and c correct: rho = 1 - C(n-c,K)/C(n,K), sigma = sqrt(rho(1-rho));
    correct: (1-rho)/(sigma+eps); wrong: (1 - rho - C(n-c-1,K-1)/C(n-1,K-1))/(sigma+eps).
    rlvrlab refuses non-binary rewards (the UCPO repo silently leaves them as raw rewards).
    """
    scores = _scores64(inp)
    if not bool(((scores == 0) | (scores == 1)).all()):
        raise ValueError("passk advantage needs binary rewards in {0, 1}")
    gidx = group_index(inp.group_ids)
    adv = torch.zeros_like(scores)
    for g in range(int(gidx.max().item()) + 1):
        rows = torch.nonzero(gidx == g).flatten()
        n, c = rows.numel(), int(scores[rows].sum().item())
        if passk_k > n:
            raise ValueError(f"passk_k={passk_k} exceeds the group size {n}")
        rho = 1.0 - math.comb(n - c, passk_k) / math.comb(n, passk_k)
        sigma = math.sqrt(rho * (1.0 - rho))
        correct = (1.0 - rho) / (sigma + adv_eps)
        # an all-correct group has no wrong response (and C(-1, K-1) is undefined)
        wrong = (1.0 - rho - math.comb(n - c - 1, passk_k - 1) / math.comb(n - 1, passk_k - 1)) / (sigma + adv_eps) \
            if c < n else 0.0
        values = torch.tensor([wrong, correct], dtype=torch.float64)
        adv[rows] = values[(scores[rows] > 0).long()]
    return _broadcast(adv, inp)


def fgrpo(inp: AdvantageInputs, *, adv_eps: float, fgrpo_gamma: float) -> AdvantageOutput:
    """F-GRPO (UCPO paper baseline): GRPO advantage scaled per group by (1 - c/N)^gamma, c = #correct."""
    scores = _scores64(inp)
    gidx = group_index(inp.group_ids)
    mean, std, count = _group_mean_std(scores, gidx)
    num_correct = group_sum((scores > 0).to(torch.float64), gidx)[gidx]  # [B]
    scale = (1.0 - num_correct / count) ** fgrpo_gamma
    return _broadcast(scale * (scores - mean) / (std + adv_eps), inp)


def ucpo(inp: AdvantageInputs, *, tau: float, alpha: float, adv_eps: float) -> AdvantageOutput:
    """UCPO (Lochab et al. 2026; the UCPO repo's ``iq`` estimator, docs/references.md, "UCPO code" §1).

    GRPO advantage A0 (eps = adv_eps, unbiased std, singletons 0). In each group with >= 2 correct
    responses (reward > 0): q = softmax over the correct set of the mean token log-prob under pi_old,
    t = normalised 1/max(q, 1e-6), weight w_i = (1 - tau) + tau * n_c * t_i (mean 1 over the set), and
    A_i = A_base * w_i with A_base = A0 of the group's first correct row in batch order. With alpha > 0,
    groups with >= 2 incorrect responses get A_j -= max(0, alpha * (-log p_j - H(p))), p = softmax over
    the incorrect set. tau = 0 is GRPO with the same eps.
    """
    if inp.old_logp is None:
        raise ValueError("ucpo needs old_logp (behaviour log-probs) to compute q")
    layout = inp.groups  # every group at once: [G, n], each row its group's rows in batch order
    scores, index, correct = layout.scores, layout.index, layout.correct
    mean, std, _ = _group_mean_std(scores, layout.gidx)
    adv = (scores - mean) / (std + adv_eps)  # [B] A0
    mu = inp.mean_token_logp  # [B]
    mu_g, adv_g = mu[index], adv[index]  # adv_g: A0, read before any row is rewritten
    wrong = layout.valid & ~correct
    n_c = correct.sum(-1, keepdim=True)  # [G, 1]
    weighted = correct & (n_c >= 2)
    if bool(weighted.any()):
        q = torch.softmax(mu_g.masked_fill(~correct, float("-inf")), dim=-1).clamp(min=1e-6)
        inverse = torch.where(correct, 1.0 / q, torch.zeros((), dtype=q.dtype))
        weight = (1.0 - tau) + tau * n_c.to(q.dtype) * (inverse / inverse.sum(-1, keepdim=True))
        base = adv_g.gather(1, correct.to(torch.int8).argmax(-1, keepdim=True))  # A0 of the first correct row
        adv[index[weighted]] = (base * weight)[weighted]
    if alpha > 0:
        penalised = wrong & (wrong.sum(-1, keepdim=True) >= 2)
        if bool(penalised.any()):
            logp_wrong = torch.log_softmax(mu_g.masked_fill(~wrong, float("-inf")), dim=-1)
            entropy = -torch.where(wrong, logp_wrong.exp() * logp_wrong, torch.zeros((), dtype=mu.dtype)).sum(
                -1, keepdim=True)
            penalty = (alpha * (-logp_wrong - entropy)).clamp(min=0)
            adv[index[penalised]] = (adv_g - penalty)[penalised]
    return _broadcast(adv, inp)


def ucpo_objective_weights(correct: torch.Tensor, seq_logp: torch.Tensor, *, tau: float, z: float) -> torch.Tensor:
    """Per-response weights w(y) whose expectation under pi gives the gradient of UCPO's objective (docs/algorithms.md,
    "UCPO's two readings"): J = log Z - tau * KL(u || q), Z = pi(C), q = pi(. | C), u uniform over C,

        grad J = E_{y ~ pi}[ w(y) grad log pi(y) ],   w(y) = 1[y in C] / Z * ((1 - tau) + tau * u(y) / q(y)).

    correct: [K] bool over K distinct responses; seq_logp: [K] their log-probs (sequence log pi, up to a common
    constant: only q = softmax over the correct ones is used); z: the probability mass of the correct set.
    Returns [K] float64 (0 for incorrect responses and when nothing is correct)."""
    correct = correct.bool()
    w = torch.zeros(correct.shape, dtype=torch.float64)
    k = int(correct.sum())
    if k == 0 or z <= 0:
        return w
    q = torch.softmax(seq_logp.to(torch.float64)[correct], dim=0)
    w[correct] = ((1.0 - tau) + tau / (k * q)) / z
    return w


def ucpo_objective(inp: AdvantageInputs, *, tau: float) -> AdvantageOutput:
    """UCPO as its objective reads (Lochab et al. 2026, "log Z - tau KL(u || q)"), not as its released code scales
    GRPO's advantage (`ucpo`): per group, Z is estimated by the fraction of correct rows, the correct set C by the
    group's distinct correct responses (`response_keys`), q by the softmax of their sequence log-probs under pi_old;
    each row gets w(y) of `ucpo_objective_weights`, minus the group mean of w (a baseline). An all-correct group
    still pushes toward uniform (w differs between its responses unless q is uniform); tau = 0 is REINFORCE on
    log pass@1. Rows of one response share its weight."""
    if inp.old_logp is None:
        raise ValueError("ucpo_objective needs old_logp (behaviour log-probs) to compute q")
    scores = _scores64(inp)
    gidx = group_index(inp.group_ids)
    m = inp.mask.to(torch.float64)
    seq_logp = (torch.where(inp.mask.bool(), inp.old_logp.to(torch.float64), torch.zeros((), dtype=torch.float64))
                * m).sum(-1)  # [B] log pi(y) of each response under pi_old
    keys = list(inp.response_keys) if inp.response_keys is not None else list(range(len(scores)))
    adv = torch.zeros_like(scores)
    for g in range(int(gidx.max().item()) + 1):
        rows = torch.nonzero(gidx == g).flatten().tolist()
        distinct: dict = {}
        for r in rows:
            distinct.setdefault(keys[r], r)
        firsts = list(distinct.values())
        z = float((scores[rows] > 0).double().mean())
        w_distinct = ucpo_objective_weights(scores[firsts] > 0, seq_logp[firsts], tau=tau, z=z)
        weight_of = {key: w_distinct[i] for i, key in enumerate(distinct)}
        w = torch.stack([weight_of[keys[r]] for r in rows])
        adv[rows] = w - w.mean()
    return _broadcast(adv, inp)


def entropy_advantage_bonus(
    adv: torch.Tensor, entropy: torch.Tensor, *, ent_adv_alpha: float, ent_adv_kappa: float
) -> torch.Tensor:
    """Ent-Adv (Cheng et al. 2025, UCPO paper baseline): A_t + min(alpha * H_t, |A_t| / kappa), H detached.

    adv, entropy: [B, T]. As in the UCPO repo, the bonus is added to negative advantages too.
    """
    return adv + torch.minimum(ent_adv_alpha * entropy.detach(), adv.abs() / ent_adv_kappa)


def correct_set_stats(inp: AdvantageInputs) -> CorrectSetStats:
    """UCPO's diagnostics of how a group's probability mass spreads over its correct responses.

    Logged for every algorithm (not only UCPO), so collapse of GRPO onto one correct answer is visible.
    """
    if inp.old_logp is None:
        raise ValueError("correct-set statistics need old_logp")
    layout = inp.groups  # [G, n]: each group's rows, padded (UCPO's estimator built it for the same inputs)
    index = layout.index
    if index.numel() == 0:
        empty = torch.zeros(0, dtype=torch.float64)
        return CorrectSetStats(empty, empty, empty, empty, empty)
    mu = inp.mean_token_logp  # [B]
    # H and max of softmax(mu) over each group's correct (side 0) and incorrect (side 1) members, both sides in one
    # pass over [2, G, n]; kept for groups with >= 2 members on that side (in group order)
    members = torch.stack([layout.correct, layout.valid & ~layout.correct])  # [2, G, n]
    count = members.sum(-1)  # [2, G]
    keep = count >= 2
    logp = torch.log_softmax(mu[index].expand(2, -1, -1).masked_fill(~members, float("-inf")), dim=-1)
    p = logp.exp()
    entropy = -torch.where(members, p * logp, torch.zeros((), dtype=p.dtype)).sum(-1)  # [2, G]
    n = count.to(torch.float64)
    h_c, max_q, n_c = entropy[0][keep[0]], p[0].amax(-1)[keep[0]], n[0][keep[0]]
    h_i, n_i = entropy[1][keep[1]], n[1][keep[1]]
    return CorrectSetStats(h_c, max_q, n_c, h_i, n_i)


# The registry: name -> estimator and its traits (rlvrlab.algorithms.registry). per_group: the baseline is the
# prompt group, so a group of one response carries no signal; reads_old_logp: needs the behaviour log-probs.
ADVANTAGES: dict[str, Estimator] = {
    "grpo": Estimator(grpo, per_group=True, reads_old_logp=False),
    "dr_grpo": Estimator(dr_grpo, per_group=True, reads_old_logp=False),
    "rloo": Estimator(rloo, per_group=True, reads_old_logp=False),
    "opo": Estimator(opo, per_group=True, reads_old_logp=False),
    "gpg": Estimator(gpg, per_group=True, reads_old_logp=False),
    "reinforce_pp": Estimator(reinforce_pp, per_group=False, reads_old_logp=False),
    "reinforce_pp_baseline": Estimator(reinforce_pp_baseline, per_group=True, reads_old_logp=False),
    "gdpo": Estimator(gdpo, per_group=True, reads_old_logp=False),
    "grpo_passk": Estimator(grpo_passk, per_group=True, reads_old_logp=False),
    "dr_grpo_passk": Estimator(dr_grpo_passk, per_group=True, reads_old_logp=False),
    "passk": Estimator(passk, per_group=True, reads_old_logp=False),
    "fgrpo": Estimator(fgrpo, per_group=True, reads_old_logp=False),
    "ucpo": Estimator(ucpo, per_group=True, reads_old_logp=True),
    "ucpo_objective": Estimator(ucpo_objective, per_group=True, reads_old_logp=True, constant_group_signal=True),
    "binary_sign": Estimator(binary_sign, per_group=False, reads_old_logp=False),
}
