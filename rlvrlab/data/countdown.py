"""Countdown (the TinyZero task), sized for a tiny model: reach a target from three small numbers.

A problem gives `NUM_NUMBERS` numbers drawn from `NUMBER_RANGE` and a target; a correct response is an
arithmetic expression with + - * / and parentheses that uses each given number **at most once** (not
necessarily all of them) and equals the target exactly (rational arithmetic: 7/2*2 is 7). The verifier
`rlvrlab.rewards.countdown.countdown` applies the same rules.

Prompt:  "3 5 7 -> 22:"            (the numbers, then the target; the response follows directly)
Answer:  "target=22;numbers=3,5,7"
Id:      "countdown-<index>"

Distinct correct answers. Two expressions count as the same solution when they differ only by the order of
the operands of + and * or by regrouping (associativity), e.g. 3*5+7, 7+5*3 and (5*3)+7; the expression
algebra in `rlvrlab.rewards.countdown` maps each to one string (`canonical`: "3*5+7", compound terms first,
numbers ascending, minimal parentheses), and its `solutions` lists one canonical string per distinct solution.
Targets are chosen among the values that have at least `MIN_SOLUTIONS` distinct solutions, so every generated
problem has several, and no target equals one of the numbers (no one-literal answers).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rlvrlab.data.problems import DatasetSection, ModelSection, Problem, Task
from rlvrlab.rewards.countdown import all_expressions, format_answer, parse_answer, solutions

NUM_NUMBERS = 3
NUMBER_RANGE = (2, 9)  # inclusive; drawn independently (repeats happen); no 1, so no x*1 "variants"
TARGET_RANGE = (2, 60)  # inclusive
MIN_SOLUTIONS = 2


def problem_solutions(problem: Problem) -> list[str]:
    """`solutions` for a Countdown problem, read from its answer."""
    numbers, target = parse_answer(problem.answer)
    return solutions(numbers, target)


def format_prompt(numbers: Sequence[int], target: int) -> str:
    return f"{' '.join(str(x) for x in numbers)} -> {target}:"


def make_problems(num_problems: int, seed: int) -> list[Problem]:
    """`num_problems` distinct Countdown problems, the same for the same seed."""
    rng = random.Random(seed)
    lo, hi = NUMBER_RANGE
    tlo, thi = TARGET_RANGE
    seen: set[tuple[tuple[int, ...], int]] = set()
    problems: list[Problem] = []
    attempts = 0
    while len(problems) < num_problems:
        attempts += 1
        if attempts > 100 * num_problems + 1000:
            raise ValueError(f"cannot generate {num_problems} distinct countdown problems")
        numbers = tuple(rng.randint(lo, hi) for _ in range(NUM_NUMBERS))
        counts: dict[int, int] = {}
        for value in all_expressions(tuple(sorted(numbers))).values():
            if value.denominator == 1 and tlo <= value <= thi and int(value) not in numbers:
                counts[int(value)] = counts.get(int(value), 0) + 1
        targets = sorted(t for t, c in counts.items() if c >= MIN_SOLUTIONS)
        if not targets:
            continue
        target = rng.choice(targets)
        if (numbers, target) in seen:
            continue
        seen.add((numbers, target))
        problems.append(
            Problem(
                id=f"countdown-{len(problems)}",
                prompt=format_prompt(numbers, target),
                answer=format_answer(numbers, target),
            )
        )
    return problems


def _problems(dataset: DatasetSection, model: ModelSection, seed: int) -> list[Problem]:
    return make_problems(dataset.num_problems, seed)


# The warm start fine-tunes on every distinct solution (one canonical string each), sampled uniformly.
TASK = Task("countdown", _problems, verifier="countdown", solutions=problem_solutions, warm_start=problem_solutions)
