"""Countdown (the TinyZero task), sized for a tiny model: reach a target from three small numbers.

A problem gives `NUM_NUMBERS` numbers drawn from `NUMBER_RANGE` and a target; a correct response is an
arithmetic expression with + - * / and parentheses that uses each given number **at most once** (not
necessarily all of them) and equals the target exactly (rational arithmetic: 7/2*2 is 7). The verifier
`rlvrlab.rewards.countdown.countdown` applies the same rules.

Prompt:  "3 5 7 -> 22:"            (the numbers, then the target; the response follows directly)
Answer:  "target=22;numbers=3,5,7"
Id:      "countdown-<index>"

Distinct correct answers. Two expressions count as the same solution when they differ only by the order of
the operands of + and * or by regrouping (associativity), e.g. 3*5+7, 7+5*3 and (5*3)+7; `canonical` maps
each to one string ("3*5+7": compound terms first, numbers ascending, minimal parentheses). `solutions`
lists one canonical string per distinct solution. Targets are chosen among the values that have at least
`MIN_SOLUTIONS` distinct solutions, so every generated problem has several, and no target equals one of the
numbers (no one-literal answers).
"""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

from rlvrlab.data.problems import Problem
from rlvrlab.rewards.countdown import format_answer, parse_answer, parse_expression

NUM_NUMBERS = 3
NUMBER_RANGE = (2, 9)  # inclusive; drawn independently (repeats happen); no 1, so no x*1 "variants"
TARGET_RANGE = (2, 60)  # inclusive
MIN_SOLUTIONS = 2

# Canonical expression nodes (hashable, comparable through their formatted text):
#   ("n", value)                          an integer literal
#   ("s", positive_terms, negative_terms)  a flattened sum: terms are "n" or "p" nodes, each tuple sorted
#   ("p", numerator, denominator)          a flattened product: factors are "n" or "s" nodes, each tuple sorted
Node = tuple


def _num(value: int) -> Node:
    return ("n", value)


def fmt(node: Node) -> str:
    """The canonical text of a node: minimal parentheses, no spaces."""
    kind = node[0]
    if kind == "n":
        return str(node[1])
    if kind == "s":
        pos, neg = node[1], node[2]
        return "+".join(fmt(t) for t in pos) + "".join("-" + fmt(t) for t in neg)
    num, den = node[1], node[2]

    def factor(f: Node) -> str:
        return f"({fmt(f)})" if f[0] == "s" else fmt(f)

    return "*".join(factor(f) for f in num) + "".join("/" + factor(f) for f in den)


def _sum_key(node: Node) -> tuple:
    return (1, node[1], "") if node[0] == "n" else (0, 0, fmt(node))  # compound terms first, numbers ascending


def _prod_key(node: Node) -> tuple:
    return (0, node[1], "") if node[0] == "n" else (1, 0, fmt(node))  # numbers ascending first, then sums


def _make_sum(pos: Sequence[Node], neg: Sequence[Node]) -> Node:
    if len(pos) == 1 and not neg:
        return pos[0]
    return ("s", tuple(sorted(pos, key=_sum_key)), tuple(sorted(neg, key=_sum_key)))


def _make_prod(num: Sequence[Node], den: Sequence[Node]) -> Node:
    if len(num) == 1 and not den:
        return num[0]
    return ("p", tuple(sorted(num, key=_prod_key)), tuple(sorted(den, key=_prod_key)))


def _terms(node: Node) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    return (node[1], node[2]) if node[0] == "s" else ((node,), ())


def _factors(node: Node) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    return (node[1], node[2]) if node[0] == "p" else ((node,), ())


def combine(op: str, a: Node, b: Node) -> Node:
    """The canonical node of `a op b` (op one of + - * /)."""
    if op in "+-":
        (ap, an), (bp, bn) = _terms(a), _terms(b)
        return _make_sum(ap + bp, an + bn) if op == "+" else _make_sum(ap + bn, an + bp)
    (an_, ad), (bn_, bd) = _factors(a), _factors(b)
    return _make_prod(an_ + bn_, ad + bd) if op == "*" else _make_prod(an_ + bd, ad + bn_)


def negate(a: Node) -> Node:
    pos, neg = _terms(a)
    return _make_sum(neg, pos)


def _apply(op: str, x: Fraction, y: Fraction) -> Fraction | None:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    return None if y == 0 else x / y


@lru_cache(maxsize=4096)
def _all_expressions(numbers: tuple[int, ...]) -> dict[str, Fraction]:
    """Every distinct (canonical) expression over a sub-multiset of `numbers`, with its value."""
    n = len(numbers)
    memo: dict[int, dict[str, tuple[Node, Fraction]]] = {}

    def exprs(mask: int) -> dict[str, tuple[Node, Fraction]]:
        if mask in memo:
            return memo[mask]
        out: dict[str, tuple[Node, Fraction]] = {}
        bits = [i for i in range(n) if mask >> i & 1]
        if len(bits) == 1:
            node = _num(numbers[bits[0]])
            out[fmt(node)] = (node, Fraction(numbers[bits[0]]))
        else:
            sub = (mask - 1) & mask
            while sub:  # every non-empty proper sub-mask as the left operand
                for a, va in exprs(sub).values():
                    for b, vb in exprs(mask ^ sub).values():
                        for op in "+-*/":
                            value = _apply(op, va, vb)
                            if value is None:
                                continue
                            node = combine(op, a, b)
                            out.setdefault(fmt(node), (node, value))
                sub = (sub - 1) & mask
        memo[mask] = out
        return out

    result: dict[str, Fraction] = {}
    for mask in range(1, 1 << n):
        for text, (_, value) in exprs(mask).items():
            result.setdefault(text, value)
    return result


def _sort_key(text: str) -> tuple[int, str]:
    return (len(text), text)


def solutions(numbers: Sequence[int], target: int) -> list[str]:
    """All distinct correct expressions (one canonical string each, shortest first) for the problem."""
    table = _all_expressions(tuple(sorted(int(x) for x in numbers)))
    return sorted((text for text, value in table.items() if value == target), key=_sort_key)


def problem_solutions(problem: Problem) -> list[str]:
    """`solutions` for a Countdown problem, read from its answer."""
    numbers, target = parse_answer(problem.answer)
    return solutions(numbers, target)


def canonical(expression: str) -> str | None:
    """The canonical form of an expression (e.g. a model's response), or None when it is not one."""
    try:
        tree = parse_expression(expression)
    except ValueError:
        return None

    def walk(node: ast.expr) -> Node:
        if isinstance(node, ast.Constant):
            return _num(node.value)
        if isinstance(node, ast.UnaryOp):
            return negate(walk(node.operand))
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}[type(node.op)]
        return combine(op, walk(node.left), walk(node.right))

    return fmt(walk(tree))


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
        for value in _all_expressions(tuple(sorted(numbers))).values():
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


__all__ = [
    "MIN_SOLUTIONS",
    "NUMBER_RANGE",
    "NUM_NUMBERS",
    "TARGET_RANGE",
    "canonical",
    "format_prompt",
    "make_problems",
    "problem_solutions",
    "solutions",
]
