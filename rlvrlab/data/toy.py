"""Toy problems (UCPO paper, §3.5): P problems, each with M fixed candidate responses "r0".."r{M-1}" of which
`num_correct` are correct. The tabular policy over them lives in `rlvrlab.policy.toy`.

Prompt:  "<problem index>"        Answer: "r3|r7|r12" (the correct responses)     Id: "toy-<index>"
"""

from __future__ import annotations

import numpy as np

from rlvrlab.data.problems import DatasetSection, ModelSection, Problem, Task


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


def correct_responses(problem: Problem) -> list[str]:
    """The correct candidates' texts ("r3"), as the exact verifier reads them from the answer."""
    return [response_text(index) for index in correct_indices(problem)]


def _problems(dataset: DatasetSection, model: ModelSection, seed: int) -> list[Problem]:
    return make_problems(dataset.num_problems, num_responses=model.toy_num_responses,
                         num_correct=model.toy_num_correct, seed=seed)


# The toy policy's table is its own start (model.toy_init): there is no warm start.
TASK = Task("toy", _problems, verifier="exact", solutions=correct_responses, warm_start=None, toy=True)
