"""The toy tier: a tabular softmax policy over M fixed candidate responses per problem (UCPO paper, §3.5).

Each of P problems has its own logit vector over the M responses, of which `num_correct` are correct. The
policy is written as a one-token "causal LM" so that the trainer's log-prob code, the algorithm functions and
the loop are exactly those of the transformer tiers:

    input_ids = [problem index, response index]      logits at position 0 = table[problem]   # [B, 2, M]

Skewed start: within each problem the correct responses' logits are spaced evenly from +skew/2 down to
-skew/2 and the incorrect ones sit at 0, so one correct answer starts far more likely than the others; this
is the setting in which GRPO collapses onto it and UCPO should not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlvrlab.data.problems import Problem
from rlvrlab.data.toy import correct_indices


class ToyPolicy(nn.Module):
    """logits: [P, M], one row per problem."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = nn.Parameter(logits.clone().float())

    @classmethod
    def initial(cls, problems: list[Problem], *, num_responses: int, init: str, skew: float) -> ToyPolicy:
        table = torch.zeros(len(problems), num_responses)  # [P, M]
        if init == "skewed":
            for row, problem in enumerate(problems):
                correct = correct_indices(problem)
                spread = torch.linspace(skew / 2, -skew / 2, len(correct)) if len(correct) > 1 else torch.zeros(1)
                table[row, correct] = spread
        return cls(table)

    def forward(self, input_ids: torch.Tensor, attention_mask=None, position_ids=None,  # noqa: ARG002
                logits_to_keep: int = 0):
        """The HF causal-LM call the trainer makes; logits_to_keep = k > 0 keeps the last k positions."""
        rows = self.logits[input_ids[:, 0]]  # [B, M]: the problem index is the one prompt token
        width = logits_to_keep or input_ids.shape[1]
        logits = rows.unsqueeze(1).expand(-1, width, -1)  # [B, L or k, M]
        return _Output(logits)


class _Output:
    def __init__(self, logits: torch.Tensor):
        self.logits = logits


TOY_KS = (1, 4, 16, 64)  # the ks of the exact pass@k the toy tier logs every step
COVERAGE_DRAWS = 64  # coverage: the share of the correct set seen at least once in this many samples


@dataclass(frozen=True)
class ToyDiagnostics:
    """Exact (not sampled) collapse measures of the toy policy, each a mean over problems (UCPO paper §3.2).

    With p the policy over the M responses of a problem, C its correct set, Z = p(C) and q = p restricted to C
    and renormalised: correct_mass = Z (= pass@1); uniformity = H(q) / log|C| (1 = uniform over C);
    correct_entropy = H(q) in nats; max_q = max_i q_i; coverage = mean over i in C of 1 - (1 - p_i)^64, the
    expected share of the correct set seen in 64 samples; pass_at[k] = 1 - (1 - Z)^k, the exact pass@k."""

    correct_mass: float
    uniformity: float
    correct_entropy: float
    max_q: float
    coverage: float
    pass_at: dict[int, float]


def correct_members(problems: list[Problem], num_responses: int) -> torch.Tensor:
    """[P, M] bool: response i of problem row is correct (rows in the order of `problems`)."""
    if not problems:
        raise ValueError("toy diagnostics need at least one problem")
    cells = [(row, i) for row, problem in enumerate(problems) for i in correct_indices(problem)]
    members = torch.zeros(len(problems), num_responses, dtype=torch.bool)
    members[tuple(torch.tensor(cells).T)] = True
    return members


def diagnostics(policy: ToyPolicy, problems: list[Problem], *, members: torch.Tensor | None = None) -> ToyDiagnostics:
    """ToyDiagnostics of `policy`; rows of the table are problems in the order of `problems` (the training set).
    Problems with a single correct response count in every mean but uniformity (undefined there). `members`:
    correct_members(problems, M), when the caller keeps it between calls (the loop does: it never changes)."""
    if members is None:
        members = correct_members(problems, policy.logits.shape[1])
    with torch.no_grad():  # all problems at once: p is 0 outside C, so every sum below runs over C only
        p = torch.log_softmax(policy.logits.double(), dim=-1).exp() * members  # [P, M]
        mass = p.sum(-1)  # Z
        q = p / mass.unsqueeze(-1)
        entropy = -(q * q.clamp_min(1e-300).log()).sum(-1)
        sizes = members.sum(-1)
        covered = (1 - (1 - p) ** COVERAGE_DRAWS).sum(-1) / sizes
        # (Z, H(q), max q, coverage, |C|) per problem, as numpy in one conversion
        z_, h_, max_q_, coverage_, n_ = torch.stack([mass, entropy, q.amax(-1), covered, sizes.double()]).numpy()
    several = n_ > 1
    uniformity = h_[several] / np.log(n_[several])
    z, h, max_q, coverage = (float(np.mean(column)) for column in (z_, h_, max_q_, coverage_))
    pass_at = {k: float(np.mean(1 - (1 - z_) ** k)) for k in TOY_KS}
    return ToyDiagnostics(correct_mass=z, uniformity=float(np.mean(uniformity)) if uniformity.size else float("nan"),
                          correct_entropy=h, max_q=max_q, coverage=coverage, pass_at=pass_at)
