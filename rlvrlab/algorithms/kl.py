"""KL estimators (Schulman 2020, "Approximating KL divergence") and token entropy.

x = logp - ref_logp. k1 = x; abs = |x|; k2 = x^2 / 2; k3 = e^y - y - 1 with y = clamp(-x, +-20), the
result clamped to [-10, 10] as verl does (a clamped token has zero gradient). A trailing ``+`` keeps the
estimator's value but takes k2's gradient (straight-through; unbiased gradient of KL).
"""

from __future__ import annotations

import torch

from .aggregation import Aggregation


def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def kl_abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp).abs()


def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp).square()


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    y = torch.clamp(ref_logp - logp, min=-20, max=20)
    return torch.clamp(torch.exp(y) - y - 1, min=-10, max=10)


def straight_through(estimator):
    """Value of ``estimator``, gradient of k2."""

    def st(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        grad_path = k2(logp, ref_logp)
        return grad_path - grad_path.detach() + estimator(logp, ref_logp).detach()

    st.__name__ = f"{estimator.__name__}_straight_through"
    return st


KL_ESTIMATORS = {
    "k1": k1,
    "kl": k1,
    "abs": kl_abs,
    "k2": k2,
    "mse": k2,
    "k3": k3,
    "low_var_kl": k3,
    "k1+": straight_through(k1),
    "abs+": straight_through(kl_abs),
    "k3+": straight_through(k3),
    "low_var_kl+": straight_through(k3),
    "k2+": k2,
    "mse+": k2,
}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits -> [B, T] entropy H = logsumexp(z) - sum softmax(z) z."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def kl_loss(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, agg: Aggregation, *, kl_coef: float,
    kl_estimator: str,
) -> torch.Tensor:
    """KL-to-reference loss term kl_coef * agg(KL_t), added to the policy loss (verl's use_kl_loss)."""
    return kl_coef * agg(KL_ESTIMATORS[kl_estimator](logp, ref_logp), mask)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, agg: Aggregation, *, entropy_coef: float) -> torch.Tensor:
    """Ent-Reg term -entropy_coef * agg(H_t), added to the policy loss (maximises token entropy)."""
    return -entropy_coef * agg(entropy, mask)
