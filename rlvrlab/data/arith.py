"""Arithmetic questions for small pretrained chat models: integer answers graded by the `math` verifier from the
response's last \\boxed{} (experiments/datasets/arith.yaml asks for the box in its system prompt).

Levels (`make_problems(..., level=L)`, LEVELS):
  1  "What is 3 + 5?"                                    two 1-digit numbers, + or - (non-negative result)
  2  "What is 23 + 58?"                                  two 2-digit numbers, + or -
  3  "What is 23 + 58 - 17?"                             three 2-digit numbers
  4  "What is 7 * 8 + 15?"                               a 1-digit product plus or minus a 2-digit number
  5  "Tom has 12 apples. He buys 3 bags with 5 apples each. How many apples does he have now?"   two steps

The tiny tier warm-starts on the boxed answer alone ("\\boxed{81}"), which the math verifier's boxed extraction
reads; a pretrained chat model learns the format from the dataset's few-shot examples instead.

Level 1 has only ~130 distinct questions: beyond that, questions repeat (with distinct ids).
Id: "arith<level>-<index>". Problems depend only on the seed (DATA_SEED in rlvrlab.data), like the other tasks.
"""

from __future__ import annotations

import random

from rlvrlab.data.problems import DatasetSection, ModelSection, Problem, Task

LEVELS = {1: "two 1-digit numbers, + or -", 2: "two 2-digit numbers, + or -", 3: "three 2-digit numbers",
          4: "a 1-digit product plus or minus a 2-digit number", 5: "a two-step word problem"}
NAMES = ("Tom", "Ana", "Li", "Sara", "Omar", "Mia", "Ken", "Zoe")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies")


def _plus_or_minus(rng: random.Random, low: int, high: int) -> tuple[str, int]:
    """a + b or a - b (larger first, so the result is >= 0) with a, b uniform in [low, high]."""
    a, b = rng.randint(low, high), rng.randint(low, high)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", a - b


def _question(rng: random.Random, level: int) -> tuple[str, int]:
    if level == 1:
        return _plus_or_minus(rng, 1, 9)
    level -= 1  # the 2-digit levels below
    if level == 1:
        return _plus_or_minus(rng, 10, 99)
    if level == 2:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
        if a + b > c and rng.random() < 0.5:
            return f"What is {a} + {b} - {c}?", a + b - c
        return f"What is {a} + {b} + {c}?", a + b + c
    if level == 3:
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(10, 60)
        if a * b > c and rng.random() < 0.5:
            return f"What is {a} * {b} - {c}?", a * b - c
        return f"What is {a} * {b} + {c}?", a * b + c
    if level == 4:
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        have, bags, each = rng.randint(2, 20), rng.randint(2, 6), rng.randint(2, 9)
        return (f"{name} has {have} {item}. {name} buys {bags} bags with {each} {item} each. "
                f"How many {item} does {name} have now?", have + bags * each)
    raise ValueError(f"arith level must be 1-5, not {level + 1}")


def make_problems(count: int, *, seed: int, level: int) -> list[Problem]:
    rng = random.Random(f"arith-{level}-{seed}")
    problems: list[Problem] = []
    seen: set[str] = set()
    misses = 0
    while len(problems) < count:
        question, answer = _question(rng, level)
        if question in seen and misses < 10_000:  # distinct questions while the space allows (level 1 has ~130)
            misses += 1
            continue
        seen.add(question)
        problems.append(Problem(id=f"arith{level}-{len(problems)}", prompt=question, answer=str(answer)))
    return problems


def boxed_answer(problem: Problem) -> list[str]:
    """The one correct response the tiny tier warm-starts on: the answer in \\boxed{}."""
    return [f"\\boxed{{{problem.answer}}}"]


def _problems(dataset: DatasetSection, model: ModelSection, seed: int) -> list[Problem]:
    return make_problems(dataset.num_problems, seed=seed, level=dataset.level)


TASK = Task("arith", _problems, verifier="math", solutions=boxed_answer, warm_start=boxed_answer, levels=LEVELS)
