"""Per-problem evaluation statistics: pass@k, avg@n, maj@k and the diversity of correct answers.

All functions are pure and work on one problem's counts; benchmark scores are unweighted means over problems
(each estimator below is unbiased per problem, so the mean is unbiased for the benchmark). docs/evaluation.md
states the same definitions for users; `pass_at_k` and `maj_at_k` give the formulas and the vote and tie rules."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np


def _check_counts(n: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"need at least one sample per problem, got n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be between 1 and the number of samples n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct responses among n samples.

    pass@k = 1 - C(n-c, k) / C(n, k), in the numerically stable product form of OpenAI's human-eval:
    1.0 when n - c < k (every k-subset holds a correct response), else 1 - prod_{i=n-c+1}^{n} (1 - k/i).
    pass@1 = c/n exactly. Raises ValueError for k > n (the estimator is undefined; it is never clamped) or
    c outside [0, n].
    """
    _check_counts(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"c={c} correct responses must be between 0 and n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def avg_at_n(n: int, c: int) -> float:
    """avg@n = c / n: the mean score of the n samples (the pass@1 estimate)."""
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n and n >= 1, got n={n}, c={c}")
    return c / n


def _binom_pmf(x: np.ndarray | int, m: int, p: float) -> np.ndarray:
    from scipy.stats import binom

    return binom.pmf(x, m, p)


def maj_at_k(classes: Sequence[tuple[int, bool]], k: int, *, unanswered: int = 0) -> float:
    """Expected majority-vote accuracy of k of the n responses of one problem.

    classes: one (size, correct) pair per answer class: the responses whose final answers are equivalent
             (and whose verdicts agree, see rlvrlab.eval.run); `correct` says whether the class's answer is right.
    unanswered: responses without a final answer; they are drawn like the others but never vote.
    n = sum of the sizes + unanswered.

    Definition. Draw a subset S of k of the n responses uniformly at random (without replacement). Each class
    gets x_j votes, the number of its members in S. If no class has a vote, S scores 0. Otherwise the classes
    with the most votes form the tied set T, and S scores |T ∩ correct| / |T|: a tie is broken uniformly at
    random, which gives fractional credit. maj@k is the expectation of that score over all C(n, k) subsets.
    maj@1 = (number of correct responses) / n; maj@n is the plain majority vote over all n responses.

    Computation (exact up to float rounding, no sampling). Counting subsets with prescribed votes
    prod_j C(m_j, x_j) is the same, up to a constant, as drawing every class independently from
    Binomial(m_j, p) with p = k/n and conditioning on the total being k; the binomial form keeps every
    intermediate a probability (no overflow at large n). For each correct class j and each vote count
    t >= 1, a dynamic programme over the other classes tracks (votes used, classes tied at t) with every other
    class capped at t votes; the credit of those subsets is 1 / (1 + ties). Classes of equal size and
    correctness contribute equally and are computed once.
    """
    sizes = [int(m) for m, _ in classes]
    if any(m < 1 for m in sizes) or unanswered < 0:
        raise ValueError("answer classes need at least one member and unanswered must be >= 0")
    n = sum(sizes) + unanswered
    _check_counts(n, k)
    if not any(correct for _, correct in classes):
        return 0.0
    if k == 1:  # one response: it wins when it has an answer, and scores its class's correctness
        return sum(m for m, correct in classes if correct) / n
    if k == n:  # one subset: the plain vote
        top = max(sizes, default=0)
        tied = [correct for (m, correct) in classes if m == top]
        return sum(tied) / len(tied)

    p = k / n
    total = float(_binom_pmf(k, n, p))  # P(sum of the independent draws = k)
    kinds = Counter((int(m), bool(correct)) for m, correct in classes)
    # pmfs[m][x] = P(Binomial(m, p) = x), for every class size and the unanswered pool
    pmfs = {m: _binom_pmf(np.arange(m + 1), m, p) for m in {*sizes, unanswered}}
    score = 0.0
    for (m, correct), count in kinds.items():
        if not correct:
            continue
        others = kinds.copy()
        others[(m, correct)] -= 1
        other_sizes = [size for (size, _), times in others.items() for _ in range(times)]
        per_class = 0.0
        for t in range(1, min(m, k) + 1):
            per_class += pmfs[m][t] * _tied_credit(other_sizes, unanswered, k - t, t, pmfs)
        score += count * per_class
    return min(1.0, max(0.0, score / total))


def _tied_credit(other_sizes: list[int], unanswered: int, room: int, t: int, pmfs: dict[int, np.ndarray]) -> float:
    """E[1/(1+ties); others take exactly `room` votes, none more than t] under independent binomial draws.

    ties = the number of other classes with exactly t votes.
    """
    max_ties = min(room // t, sum(1 for m in other_sizes if m >= t))
    # w[s, r]: probability that the classes seen so far drew s votes in all, r of them exactly t
    w = np.zeros((room + 1, max_ties + 1))
    free = pmfs[unanswered][: room + 1]
    w[: len(free), 0] = free  # responses without an answer: any number of them
    for m in other_sizes:
        top = min(m, t, room)
        pmf = pmfs[m]
        new = np.zeros_like(w)
        for x in range(top + 1):
            if x == t:  # a tie with the class we credit
                if max_ties:
                    new[x:, 1:] += pmf[x] * w[: room + 1 - x, :-1]
            else:
                new[x:, :] += pmf[x] * w[: room + 1 - x, :]
        w = new
    return float(w[room] @ (1.0 / np.arange(1, max_ties + 2)))


def diversity_of_correct(forms: Sequence[str]) -> tuple[float | None, int, int]:
    """(distinct / correct, distinct, correct) for the solution forms of one problem's correct responses.

    forms: Verdict.form (or, where that is None, Verdict.answer) of each correct response. The ratio is 1.0
    when every correct response is a different solution and 1/c when all are the same one; it is None when no
    response is correct (there is nothing to be diverse about), so it never pulls a mean down.
    """
    correct = len(forms)
    distinct = len(set(forms))
    return (distinct / correct if correct else None), distinct, correct


def mean(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are not None; None when there are none."""
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return sum(kept) / len(kept) if kept else None


# Exact metrics of a task whose correct responses can all be listed (rlvrlab.data.answer_space): from the policy's
# probability p_c of every correct response c of one problem (C its correct set), with Z = sum_c p_c:
#   pass@k         1 - (1 - Z)^k                        (k independent samples; pass@1 = Z)
#   q              p_c / Z, the policy restricted to the correct set (UCPO paper §3.2)
#   H(q)           -sum_c q_c log q_c, in nats; uniformity H(q) / log|C| (1 = uniform, 0 = one answer; |C| >= 2)
#   max q          the share of the likeliest correct response
#   coverage@k     the expected share of C seen among k samples: mean_c 1 - (1 - p_c)^k
#   signal         P(a group of G samples has mixed rewards) = 1 - Z^G - (1 - Z)^G, for 0/1 rewards: the chance
#                  that a group-normalised estimator (GRPO, UCPO) gets any gradient from this problem
# The sampled estimators above converge to these as n grows (tests/algorithms/test_passk_exact.py).


def exact_problem_metrics(p_correct: Sequence[float] | np.ndarray, ks: Sequence[int],
                          group_size: int) -> dict[str, float]:
    """The exact metrics of one problem from the probabilities of its correct responses (see above). Uniformity is
    NaN for a one-answer problem, H(q), uniformity and max q are NaN when Z = 0."""
    p = np.clip(np.asarray(p_correct, dtype=np.float64), 0.0, 1.0)
    if p.ndim != 1 or p.size == 0:
        raise ValueError("exact metrics need the probabilities of at least one correct response")
    z = float(min(p.sum(), 1.0))
    out: dict[str, float] = {"pass_at_1": z}
    for k in ks:
        out[f"pass_at_{k}"] = 1.0 - (1.0 - z) ** k
        out[f"coverage_at_{k}"] = float(np.mean(1.0 - (1.0 - p) ** k))
    out["signal"] = 1.0 - z**group_size - (1.0 - z) ** group_size
    if z > 0:
        q = p / p.sum()
        nz = q[q > 0]
        entropy = float(-(nz * np.log(nz)).sum())
        out["correct_entropy"] = entropy
        out["uniformity"] = entropy / math.log(p.size) if p.size >= 2 else float("nan")
        out["max_q"] = float(q.max())
    else:
        out["correct_entropy"] = out["uniformity"] = out["max_q"] = float("nan")
    return out


def exact_metrics(p_correct: Sequence[Sequence[float] | np.ndarray], ks: Sequence[int],
                  group_size: int) -> dict[str, float]:
    """Unweighted means over problems of `exact_problem_metrics` (NaNs skipped: a one-answer problem has no
    uniformity); NaN where no problem defines a metric."""
    rows = [exact_problem_metrics(p, ks, group_size) for p in p_correct]
    if not rows:
        raise ValueError("exact metrics need at least one problem")
    out = {}
    for key in rows[0]:
        values = np.array([r[key] for r in rows], dtype=np.float64)
        finite = values[np.isfinite(values)]
        out[key] = float(finite.mean()) if finite.size else float("nan")
    return out


# pass@k and coverage@k as curves over k (docs/evaluation.md, "Curves over k"). For one problem with correct set C:
#   pass@k       P(at least one of k samples is correct)
#   coverage@k   the expected share of C among k samples, (1/|C|) Σ_c P(c is among the k samples): the same
#                definition as exact_problem_metrics' coverage_at_k, mean_c 1 - (1 - p_c)^k
# Exact (the policy's probability of every c is known, pairs): the closed forms above, for every k. Sampled (n
# samples, c correct, m_c of them equal to answer c): the without-replacement estimators 1 - C(n-c, k)/C(n, k)
# (Chen et al. 2021, eq. 1) and (1/|C|) Σ_c 1 - C(n-m_c, k)/C(n, k), each unbiased for its exact value because
# the count of any one answer among n independent samples is binomial. They need k <= n; a reported value needs
# n >= SAMPLES_PER_K · k: at k = n the estimate is the indicator 1[c > 0], one Bernoulli draw per problem, and
# close to n it is little more, so its per-problem spread says nothing about the problem's pass@k.
SAMPLES_PER_K = 4


def _missed(n: int, m: int, k_max: int) -> np.ndarray:
    """[k_max]: C(n-m, k) / C(n, k) for k = 1..k_max (k_max <= n), the probability that a k-subset of the n samples
    holds none of m marked ones, as the running product prod_{i<k} (n-m-i)/(n-i) (0 once n-m-i reaches 0)."""
    i = np.arange(k_max, dtype=np.float64)
    return np.cumprod(np.maximum(n - m - i, 0.0) / (n - i))


def reportable_ks(n: int | None, k_max: int) -> list[int]:
    """The ks in 1..k_max with a reported curve value: all of them for exact values (n None), else those with
    n >= SAMPLES_PER_K · k."""
    top = k_max if n is None else min(k_max, n // SAMPLES_PER_K)
    return list(range(1, top + 1))


def too_few_samples(n: int, k_max: int) -> str | None:
    """The one-line note for the ks that n samples per problem cannot report (None when every k <= k_max can)."""
    top = n // SAMPLES_PER_K
    if top >= k_max:
        return None
    left = f"k = {top + 1}..{k_max}" if top + 1 < k_max else f"k = {k_max}"
    return (f"pass@k and coverage@k for {left} left out: with n = {n} samples per problem a sampled estimate at k "
            f"needs n >= {SAMPLES_PER_K}k (closer to n it is one indicator per problem); raise --n to "
            f"{SAMPLES_PER_K * k_max} for k up to {k_max}")


def exact_curves(p_correct: Sequence[float] | np.ndarray, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """(pass@k, coverage@k) for k = 1..k_max of one problem from the policy's probability p_c of every correct
    response c: 1 - (1 - Z)^k with Z = Σ p_c, and mean_c 1 - (1 - p_c)^k (exact_problem_metrics at every k)."""
    p = np.clip(np.asarray(p_correct, dtype=np.float64), 0.0, 1.0)
    if p.ndim != 1 or p.size == 0:
        raise ValueError("exact curves need the probabilities of at least one correct response")
    k = np.arange(1, k_max + 1, dtype=np.float64)
    z = min(float(p.sum()), 1.0)
    return 1.0 - (1.0 - z) ** k, (1.0 - (1.0 - p[:, None]) ** k[None, :]).mean(axis=0)


def sampled_curves(n: int, c: int, form_counts: Sequence[int], correct_set: int | None,
                   k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """(pass@k, coverage@k) for k = 1..k_max of one problem from n samples: c correct, form_counts[j] of them equal
    to the j-th distinct correct answer, correct_set = |C| (None when the task cannot list C: coverage is NaN).
    NaN at every k with n < SAMPLES_PER_K · k (see above); pass@k equals pass_at_k(n, c, k) elsewhere."""
    if n < 1 or not 0 <= c <= n or sum(form_counts) > c:
        raise ValueError(f"need 0 <= sum(form_counts) <= c <= n and n >= 1, got n={n}, c={c}, "
                         f"forms={list(form_counts)}")
    if correct_set is not None and correct_set < len(form_counts):
        raise ValueError(f"{len(form_counts)} distinct correct answers do not fit a correct set of {correct_set}")
    top = min(k_max, n)
    passes = np.full(k_max, np.nan)
    coverage = np.full(k_max, np.nan)
    passes[:top] = 1.0 - _missed(n, c, top)
    if correct_set:
        found = sum((1.0 - _missed(n, m, top) for m in form_counts if m > 0), np.zeros(top))
        coverage[:top] = found / correct_set
    short = np.arange(1, k_max + 1) * SAMPLES_PER_K > n
    passes[short] = coverage[short] = np.nan
    return passes, coverage


def problem_interval(values: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, se, low, high) over problems of one run's per-problem values (NaNs left out): the Student-t
    interval mean ± t_{(1+level)/2, P-1} · sd/√P, whose only source of variation is which problems the benchmark
    drew (and each one's sampling noise); NaN se and bounds for fewer than 2 problems. Training seeds are a second
    source: over several seeds the crossed seeds × problems interval of `rlvrlab report` applies."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan, math.nan
    mu = float(x.mean())
    if x.size < 2:
        return mu, math.nan, math.nan, math.nan
    from scipy.special import stdtrit  # the t quantile without importing scipy.stats

    se = float(x.std(ddof=1) / math.sqrt(x.size))
    half = float(stdtrit(x.size - 1, 0.5 + level / 2)) * se
    return mu, se, mu - half, mu + half
