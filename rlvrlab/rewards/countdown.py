"""The Countdown verifier: does the response combine the given numbers into the target?

Rules (the same ones `solutions` enumerates):

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
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

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


def _int(node: ast.Constant) -> int:
    """The value of an integer literal (parse_expression admits no other constant)."""
    value = node.value
    assert type(value) is int
    return value


def literals(tree: ast.expr) -> list[int]:
    """The integer literals of a checked expression, left to right."""
    out = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Constant):
            out.append(_int(node))
        elif isinstance(node, ast.BinOp):
            stack.append(node.right)
            stack.append(node.left)
        elif isinstance(node, ast.UnaryOp):
            stack.append(node.operand)
    return out


def evaluate(tree: ast.expr) -> Fraction:
    """The exact value of a checked expression; ZeroDivisionError on division by zero."""
    if isinstance(tree, ast.Constant):
        return Fraction(_int(tree))
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
def all_expressions(numbers: tuple[int, ...]) -> dict[str, Fraction]:
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
    table = all_expressions(tuple(sorted(int(x) for x in numbers)))
    return sorted((text for text, value in table.items() if value == target), key=_sort_key)


def canonical(expression: str) -> str | None:
    """The canonical form of an expression (e.g. a model's response), or None when it is not one."""
    try:
        tree = parse_expression(expression)
    except ValueError:
        return None

    def walk(node: ast.expr) -> Node:
        if isinstance(node, ast.Constant):
            return _num(_int(node))
        if isinstance(node, ast.UnaryOp):
            return negate(walk(node.operand))
        assert isinstance(node, ast.BinOp)
        op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}[type(node.op)]
        return combine(op, walk(node.left), walk(node.right))

    return fmt(walk(tree))


def countdown(response: str, answer: str) -> Verdict:
    """Does `response` reach the target of `answer` ("target=22;numbers=3,5,7") under the module's rules?

    score 1.0 / reason "correct" when it does. reason "no_answer" when the response is not an arithmetic
    expression (or ``expr = n``) at all, "wrong" when it is one that fails a rule (wrong value, a number not
    given or reused, a wrong stated result, division by zero), "error" when `answer` is malformed. answer: the
    value the expression reaches as text ("22", "7/2"; None on division by zero); form: its canonical equation
    (`canonical`, the same for reorderings and regroupings). Never raises.
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
