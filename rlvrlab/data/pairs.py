"""The pairs task: an enumerable many-answer task for the tiny tier (rules in rlvrlab.rewards.pairs).

Prompt:  "8 3 0 5 9 2 7 4:"   (eight distinct digits in a random order)
Answer:  "digits=8,3,0,5,9,2,7,4"   (level 2: "...;only=preferred", one correct answer per prompt)
Correct: "a b" with a < b two of the digits and a + b odd: 15 or 16 per prompt (3, 4 or 5 odd digits among 8).

The warm start (rlvrlab.policy.tiny) fine-tunes on `warm_start_targets`: a mixture chosen so that RL starts in the
regime UCPO's claim is about. About 40% of the mass is on correct pairs, skewed by a fixed ranking (the correct
pairs in ascending order get weights 32, 16, 8, 4, 2, 1, 1, ...: the first, the "preferred" pair, about 44% of
the correct mass); the other 60% is spread evenly over the pairs of the prompt's digits whose sum is even.
Rewards stay mixed for many steps, and the correct set starts skewed.
"""

from __future__ import annotations

import random

from rlvrlab.data.problems import DatasetSection, ModelSection, Problem, Task
from rlvrlab.rewards.pairs import ONLY_PREFERRED, correct_answers, parse_truth

NUM_DIGITS = 8
LEVELS = {1: "every ascending pair with an odd sum is correct",
          2: "only the preferred pair is correct: the one-answer control"}
# warm-start mixture, as copies in the target list (uniform sampling over the list gives these weights)
TOP_COPIES = 32  # copies of the first correct pair; each next one gets half, at least one
CORRECT_SHARE = 0.4  # of all mass


def format_prompt(digits: tuple[int, ...]) -> str:
    return " ".join(str(d) for d in digits) + ":"


def make_problems(num_problems: int, seed: int, level: int = 1) -> list[Problem]:
    """`num_problems` distinct prompts (digit lists), the same for the same seed at every level."""
    if level not in LEVELS:
        raise ValueError(f"pairs level must be one of {sorted(LEVELS)}, not {level}")
    rng = random.Random(f"pairs-{seed}")
    seen: set[tuple[int, ...]] = set()
    problems: list[Problem] = []
    while len(problems) < num_problems:
        digits = tuple(rng.sample(range(10), NUM_DIGITS))
        if digits in seen:
            continue
        seen.add(digits)
        answer = "digits=" + ",".join(map(str, digits)) + (f";{ONLY_PREFERRED}" if level == 2 else "")
        problems.append(Problem(id=f"pairs-{len(problems)}", prompt=format_prompt(digits), answer=answer))
    return problems


def warm_start_targets(problem: Problem) -> list[str]:
    """The warm start's targets for one prompt, as a list sampled uniformly (repeats are weights): the correct
    pairs with halving copies in ascending order and the even-sum pairs evenly, in the shares above (level 1's
    correct set at every level, so that the control starts from the same model)."""
    digits, _ = parse_truth(problem.answer.split(";")[0])
    correct = correct_answers("digits=" + ",".join(map(str, digits)))
    copies = [max(1, TOP_COPIES >> j) for j in range(len(correct))]
    wrong = [f"{a} {b}" for a in sorted(digits) for b in sorted(digits) if a < b and (a + b) % 2 == 0]
    wrong_copies = round(sum(copies) * (1 - CORRECT_SHARE) / CORRECT_SHARE / len(wrong))
    return [c for c, n in zip(correct, copies) for _ in range(n)] + [w for w in wrong for _ in range(wrong_copies)]


def correct_responses(problem: Problem) -> list[str]:
    """Every correct response to this problem, in ascending order (rlvrlab.rewards.pairs.correct_answers)."""
    return correct_answers(problem.answer)


def _problems(dataset: DatasetSection, model: ModelSection, seed: int) -> list[Problem]:
    return make_problems(dataset.num_problems, seed, level=dataset.level)


TASK = Task("pairs", _problems, verifier="pairs", solutions=correct_responses, warm_start=warm_start_targets,
            levels=LEVELS, answer_space=correct_responses)
