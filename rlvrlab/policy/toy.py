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

import math

import numpy as np
import torch
from torch import nn

from rlvrlab.data.problems import Problem


def response_text(index: int) -> str:
    return f"r{index}"


def make_problems(num_problems: int, *, num_responses: int, num_correct: int, seed: int) -> list[Problem]:
    """P toy problems; problem i's correct set is `num_correct` responses drawn from the seed."""
    rng = np.random.default_rng([seed, 7])
    problems = []
    for i in range(num_problems):
        correct = rng.choice(num_responses, size=num_correct, replace=False)
        problems.append(Problem(id=f"toy-{i}", prompt=str(i), answer="|".join(response_text(int(j)) for j in correct)))
    return problems


def correct_indices(problem: Problem) -> list[int]:
    return [int(token[1:]) for token in problem.answer.split("|")]


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

    def forward(self, input_ids: torch.Tensor, attention_mask=None, position_ids=None):  # noqa: ARG002
        rows = self.logits[input_ids[:, 0]]  # [B, M]: the problem index is the one prompt token
        logits = rows.unsqueeze(1).expand(-1, input_ids.shape[1], -1)  # [B, L, M]
        return _Output(logits)


class _Output:
    def __init__(self, logits: torch.Tensor):
        self.logits = logits


def diagnostics(policy: ToyPolicy, problems: list[Problem]) -> tuple[float, float]:
    """Exact (not sampled) mean over problems of the correct-set mass Z and of H(q)/log|C| (1 = uniform).

    Rows of the table are problems in the order of `problems` (the full training set).
    """
    with torch.no_grad():
        logp = torch.log_softmax(policy.logits.double(), dim=-1)  # [P, M]
        masses, entropies = [], []
        for row, problem in enumerate(problems):
            correct = correct_indices(problem)
            z = logp[row, correct].exp().sum()
            masses.append(float(z))
            if len(correct) > 1:
                logq = torch.log_softmax(logp[row, correct], dim=0)
                entropies.append(float(-(logq.exp() * logq).sum()) / math.log(len(correct)))
    return float(np.mean(masses)), float(np.mean(entropies)) if entropies else float("nan")
