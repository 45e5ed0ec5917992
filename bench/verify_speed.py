"""Side by side in one run: math verifications per second in the main process (no isolation, no timeout), and
through the RewardPool with 1 worker and with all cores.

    .venv/bin/python bench/verify_speed.py [N] [TIMEOUT_S]      (N = 1000 responses, TIMEOUT_S = 5 by default)

The responses are generated (seeded): a mix of boxed correct, boxed wrong, unboxed "final answer is" and
fraction/decimal/sqrt forms, each against its own ground truth, all distinct so the cache never answers. Both
pools are warmed up on a few other items first (fork and import costs are excluded: workers start lazily,
once). Prints the rate of each and the speed-ups. In-process is what a trainer without the pool would do: no
per-item timeout, so one pathological response (sympy on a huge expression) can hang the whole step.
"""

from __future__ import annotations

import os
import random
import resource
import sys
import time

from rlvrlab.rewards.pool import RewardPool, default_workers


def responses(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    texts, truths = [], []
    for i in range(n):
        a, b = rng.randint(1, 999), rng.randint(2, 99)
        kind = i % 5
        wrong = rng.random() < 0.4
        if kind == 0:  # boxed integer
            truth, shown = str(a * 1000 + i), str(a * 1000 + i + wrong)
            text = f"We add the terms step by step.\n\nTherefore the answer is $\\boxed{{{shown}}}$."
        elif kind == 1:  # fraction vs decimal / \dfrac
            truth = f"\\frac{{{a}}}{{{b}}}"
            shown = f"\\dfrac{{{a + wrong}}}{{{b}}}" if rng.random() < 0.5 else f"{(a + wrong) / b:.6f}"
            text = f"<think>Divide {a} by {b}.</think> The result is \\boxed{{{shown}}}"
        elif kind == 2:  # unboxed, "final answer is"
            truth, shown = str(i), str(i + wrong)
            text = f"Counting the cases gives {i + 3} minus 3. The final answer is {shown}."
        elif kind == 3:  # sqrt forms
            truth = f"{a}\\sqrt{{{b * b * 2}}}"
            shown = f"{a * b}\\sqrt{{2}}" if not wrong else f"{a * b}\\sqrt{{3}}"
            text = f"Simplify the radical: $\\boxed{{{shown}}}$"
        else:  # an expression in x
            truth = f"{a}x^2 + {b}x + {i}"
            shown = f"{b}x + {a}x^2 + {i + wrong}"
            text = f"Collecting terms, \\boxed{{{shown}}}"
        texts.append(text)
        truths.append(truth)
    return texts, truths


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers count once reaped (at close)
    return usage.ru_utime + usage.ru_stime


def measure(workers: int, texts: list[str], truths: list[str], timeout_s: float) -> tuple[float, float, dict]:
    cpu = _children_cpu()
    with RewardPool("math", workers=workers, timeout_s=timeout_s, cache_size=0) as pool:
        warm_t, warm_y = responses(4 * workers, seed=99)
        pool.score(warm_t, warm_y)  # start the workers and warm their caches
        tic = time.perf_counter()
        verdicts = pool.score(texts, truths)
        seconds = time.perf_counter() - tic
        accuracy = sum(v.score for v in verdicts) / len(verdicts)
        stats = dict(pool.stats, wall=seconds)
    stats["worker_cpu"] = _children_cpu() - cpu  # incl. the short warm-up
    return len(texts) / seconds, accuracy, stats


def in_process(texts: list[str], truths: list[str]) -> tuple[float, float]:
    from rlvrlab.rewards import VERIFIERS

    check = VERIFIERS["math"].check
    for text, truth in zip(*responses(4, seed=99)):
        check(text, truth)  # imports and first-call caches, as the pools' warm-up
    tic = time.perf_counter()
    scores = [check(text, truth).score for text, truth in zip(texts, truths)]
    return len(texts) / (time.perf_counter() - tic), sum(scores) / len(scores)


def main(n: int = 1000, timeout_s: float = 5.0) -> None:
    texts, truths = responses(n)
    cores = default_workers()
    load = os.getloadavg()[0]
    print(f"{n} math responses, timeout {timeout_s:g} s per item, {cores} cores, load average {load:.2f} at start")
    direct, acc0 = in_process(texts, truths)
    print(f"  in process (no pool, no timeout): {direct:8.1f} verifications/s   (share correct {acc0:.3f})")
    one, acc1, stats1 = measure(1, texts, truths, timeout_s)
    print(f"  1 worker : {one:8.1f} verifications/s   (share correct {acc1:.3f}, timeouts {stats1['timeouts']}, "
          f"worker CPU {stats1['worker_cpu']:.2f} s in {stats1['wall']:.2f} s)")
    many, acc_n, stats_n = measure(cores, texts, truths, timeout_s)
    print(f"  {cores} workers: {many:8.1f} verifications/s   (share correct {acc_n:.3f}, timeouts {stats_n['timeouts']}, "
          f"worker CPU {stats_n['worker_cpu']:.2f} s in {stats_n['wall']:.2f} s)")
    print(f"  speed-up : {many / one:.2f}x ({cores} workers vs 1); pool of {cores} vs in process {many / direct:.2f}x; "
          f"1 worker vs in process {one / direct:.2f}x")
    busy = stats_n["worker_cpu"] / stats_n["wall"]
    if cores > 1 and busy < 0.75 * cores:
        print(f"  note: the {cores} workers kept only {busy:.1f} cores busy: other processes compete for them")
    if not acc0 == acc1 == acc_n:
        print("  WARNING: the two runs disagree (a timeout under load?)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, float(sys.argv[2]) if len(sys.argv) > 2 else 5.0)
