"""The Countdown verifier: does the response combine the given numbers into the target?

Rules (the same ones `rlvrlab.data.countdown.solutions` enumerates):

- The response, stripped, is either ``expr`` or ``expr = target`` (one ``=``; the right side must then be the
  target written as an integer).
- ``expr`` uses only non-negative integer literals written with ASCII digits, the binary operators
  ``+ - * /``, unary minus and parentheses. No ``**``, ``//``, ``%``, names, calls, floats or anything else.
- Each given number may be used **at most once** (a number given twice may be used twice); not every number
  has to be used. A literal that is not among the given numbers fails.
- The value, computed exactly with `fractions.Fraction` (so ``7/2*2`` is 7), must equal the target.
  Division by zero fails.

The expression is parsed with `ast` and walked by hand: nothing is ever evaluated by Python. Inputs longer than
`MAX_RESPONSE_CHARS` characters or nested deeper than `MAX_DEPTH` are refused before they are walked. Any
malformed response or reference answer scores 0.0; `countdown` never raises and returns a `Verdict`.
"""

from __future__ import annotations

import ast
from collections import Counter
from fractions import Fraction

from rlvrlab.rewards.base import Verdict

MAX_RESPONSE_CHARS = 200
MAX_DEPTH = 50
_ALLOWED_CHARS = frozenset("0123456789+-*/() \t\n\r=")
_EXPR_CHARS = _ALLOWED_CHARS - {"="}


class _Reject(Exception):
    """The response breaks a rule; it scores 0.0."""


def parse_answer(answer: str) -> tuple[tuple[int, ...], int]:
    """"target=22;numbers=3,5,7" -> ((3, 5, 7), 22). Raises ValueError when malformed."""
    fields = {}
    for part in answer.split(";"):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"malformed countdown answer {answer!r}")
        fields[key.strip()] = value.strip()
    if set(fields) != {"target", "numbers"}:
        raise ValueError(f"malformed countdown answer {answer!r}")
    numbers = tuple(int(x) for x in fields["numbers"].split(","))
    return numbers, int(fields["target"])


def format_answer(numbers: tuple[int, ...] | list[int], target: int) -> str:
    """((3, 5, 7), 22) -> "target=22;numbers=3,5,7" (the inverse of `parse_answer`)."""
    return f"target={target};numbers={','.join(str(n) for n in numbers)}"


def parse_expression(text: str) -> ast.expr:
    """The checked AST of an arithmetic expression (see the module rules); raises ValueError when refused."""
    if len(text) > MAX_RESPONSE_CHARS or not set(text) <= _EXPR_CHARS or not text.strip():
        raise ValueError("not an arithmetic expression")
    # Parentheses nesting is bounded by the length cap, far below the parser's own limit; checked anyway.
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth > MAX_DEPTH:
            raise ValueError("nested too deeply")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ValueError("not an arithmetic expression") from e
    # Iterative walk: node types and depth, before anything recursive touches the tree.
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        if d > MAX_DEPTH:
            raise ValueError("nested too deeply")
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            stack.append((node.left, d + 1))
            stack.append((node.right, d + 1))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            stack.append((node.operand, d + 1))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            pass
        else:
            raise ValueError(f"{type(node).__name__} is not allowed")
    return tree


def literals(tree: ast.expr) -> list[int]:
    """The integer literals of a checked expression, left to right."""
    out = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Constant):
            out.append(node.value)
        elif isinstance(node, ast.BinOp):
            stack.append(node.right)
            stack.append(node.left)
        elif isinstance(node, ast.UnaryOp):
            stack.append(node.operand)
    return out


def evaluate(tree: ast.expr) -> Fraction:
    """The exact value of a checked expression; ZeroDivisionError on division by zero."""
    if isinstance(tree, ast.Constant):
        return Fraction(tree.value)
    if isinstance(tree, ast.UnaryOp):
        return -evaluate(tree.operand)
    assert isinstance(tree, ast.BinOp)
    left, right = evaluate(tree.left), evaluate(tree.right)
    if isinstance(tree.op, ast.Add):
        return left + right
    if isinstance(tree.op, ast.Sub):
        return left - right
    if isinstance(tree.op, ast.Mult):
        return left * right
    return left / right  # Fraction raises ZeroDivisionError


def countdown(response: str, answer: str) -> Verdict:
    """Does `response` reach the target of `answer` ("target=22;numbers=3,5,7") under the module's rules?

    score 1.0 / reason "correct" when it does. reason "no_answer" when the response is not an arithmetic
    expression (or ``expr = n``) at all, "wrong" when it is one that fails a rule (wrong value, a number not
    given or reused, a wrong stated result, division by zero), "error" when `answer` is malformed. answer: the
    value the expression reaches as text ("22", "7/2"; None on division by zero); form: its canonical equation
    (`rlvrlab.data.countdown.canonical`, the same for reorderings and regroupings). Never raises.
    """
    try:
        numbers, target = parse_answer(answer)
    except Exception:  # noqa: BLE001 - malformed reference answer (or not a string): not the response's fault
        return Verdict(0.0, "error")
    try:
        text = response.strip()
        if len(text) > MAX_RESPONSE_CHARS or not set(text) <= _ALLOWED_CHARS:
            raise _Reject
        expr_text, eq, rhs = text.partition("=")
        tree = parse_expression(expr_text)
    except Exception:  # noqa: BLE001 - not an expression: refused characters, too long or deep, syntax, a non-string
        return Verdict(0.0, "no_answer")
    from rlvrlab.data.countdown import (
        canonical,  # here: rlvrlab.data.countdown imports this module
    )

    form = canonical(expr_text)
    try:
        value = evaluate(tree)
    except (ZeroDivisionError, RecursionError):
        return Verdict(0.0, "wrong", None, form)
    answer_text = str(value)
    rhs = rhs.strip()
    stated_ok = not eq or (rhs.isascii() and rhs.isdigit() and int(rhs) == target)
    numbers_ok = not (Counter(literals(tree)) - Counter(numbers))  # no literal not given or used too often
    correct = stated_ok and numbers_ok and value == target
    return Verdict(float(correct), "correct" if correct else "wrong", answer_text, form)


def same_answer(a: str, b: str) -> bool:
    """Two reached values ("22", "44/2") are the same number."""
    try:
        return Fraction(a) == Fraction(b)
    except (ValueError, ZeroDivisionError, TypeError):
        return a == b
