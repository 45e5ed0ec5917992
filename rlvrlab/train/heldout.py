"""Evaluation during training (`trainer.eval_every`): the policy on held-out problems, logged under eval/ by step.

Every `trainer.eval_every` steps, before that step's update, and once more after the last step, the current policy
is measured on the held-out problems (the dataset's eval_fraction; at most `trainer.eval_problems` of them) and, for
exact tasks, on as many training problems. Step t's eval/ metrics are of the policy after t updates (t = 0: the
initial, e.g. warm-started, policy). Three methods, the best the task allows, named in the run's `eval_method` tag:

    exact    the task lists every correct response (rlvrlab.data.answer_space: pairs): one teacher-forced pass gives
             each one's probability, and rlvrlab.algorithms.passk.exact_metrics gives pass@1 (= expected reward),
             pass@k, q over the correct set (H(q), uniformity H(q)/log|C|, max q), coverage@k and the signal
             (the probability that a group of rollout.group_size samples has mixed rewards), with no sampling noise.
             Under eval/heldout/... and eval/train/....
    toy      the toy tier's whole table (rlvrlab.policy.toy.diagnostics), exact as well; its problems are all
             trained, so only eval/train/....
    sampled  any other task: trainer.eval_n responses per held-out problem from the rollout engine, verified;
             eval/heldout/reward (mean score) and the unbiased pass@k (Chen et al. 2021) for k = 1, 4, 16, 64 up
             to eval_n.

Exact evaluation needs the sampling distribution itself: rollout.top_p must be 1 (the config rules refuse exact
tasks with a truncated top_p only where an evaluation is asked for; sampled evaluation is used instead).
`regime_check` turns eval/heldout/signal into the logged check of issue 16: when the mean signal of the held-out
problems falls below SIGNAL_FLOOR the run has left the regime in which group-normalised estimators learn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlvrlab.algorithms.passk import exact_metrics, pass_at_k
from rlvrlab.config.schema import RunConfig
from rlvrlab.data import answer_space, load_problems
from rlvrlab.data.problems import Problem
from rlvrlab.errors import ConfigError

EXACT_KS = (1, 4, 16, 64)
SAMPLED_KS = (1, 4, 16, 64)
SIGNAL_FLOOR = 0.1  # below this mean group-signal probability the reward is (almost) never mixed


@dataclass
class HeldOut:
    """What `evaluate(run)` measures; built once per run by `make`."""

    method: str  # exact | toy | sampled
    heldout: list[Problem]
    train: list[Problem]
    space: Callable[[Problem], list[str]] | None

    def evaluate(self, run, step: int) -> dict[str, float]:
        """The eval/ metrics of the current policy (see the module docstring), with time/eval in seconds."""
        tic = time.perf_counter()
        if self.method == "toy":
            d = run.policy.diagnostics()
            out = {"eval/train/pass_at_1": d.correct_mass, "eval/train/uniformity": d.uniformity,
                   "eval/train/correct_entropy": d.correct_entropy, "eval/train/max_q": d.max_q,
                   "eval/train/coverage_at_64": d.coverage,
                   **{f"eval/train/pass_at_{k}": v for k, v in d.pass_at.items()}}
        elif self.method == "exact":
            out = {}
            for split, problems in (("heldout", self.heldout), ("train", self.train)):
                out.update({f"eval/{split}/{k}": v for k, v in self._exact(run, problems).items()})
            out["eval/heldout/reward"] = out["eval/heldout/pass_at_1"]  # 0/1 rewards: the expected reward
        else:
            out = self._sampled(run, step)
        out["time/eval"] = time.perf_counter() - tic
        return out

    def _exact(self, run, problems: list[Problem]) -> dict[str, float]:
        from rlvrlab.policy.exact import response_logprobs

        assert self.space is not None and run.tokenizer is not None
        logps = response_logprobs(run.update.module, [run.prompt_ids(p) for p in problems],
                                  [self.space(p) for p in problems], tokenizer=run.tokenizer, eos_id=run.eos_id,
                                  pad_id=run.pad_id, temperature=run.cfg.rollout.temperature)
        return exact_metrics([lp.exp().numpy() for lp in logps], EXACT_KS[1:], run.cfg.rollout.group_size)

    def _sampled(self, run, step: int) -> dict[str, float]:
        n = run.cfg.trainer.eval_n
        seed = int(np.random.SeedSequence([run.cfg.seed, step, 0xE7A1]).generate_state(1)[0])
        groups = run.rollout.generate([run.prompt_ids(p) for p in self.heldout], n=n, seed=seed)
        verdicts = run.verifier.score([g.text for group in groups for g in group],
                                      [p.answer for p, group in zip(self.heldout, groups) for _ in group])
        scores = np.array([v.score for v in verdicts], dtype=np.float64).reshape(len(self.heldout), n)
        out = {"eval/heldout/reward": float(scores.mean())}
        for k in (k for k in SAMPLED_KS if k <= n):
            out[f"eval/heldout/pass_at_{k}"] = float(np.mean([pass_at_k(n, int((row > 0).sum()), k)
                                                              for row in scores]))
        return out


def make(cfg: RunConfig) -> HeldOut | None:
    """The run's held-out evaluation, or None when trainer.eval_every is 0. One-line ConfigError when there is
    nothing held out to evaluate on."""
    if not cfg.trainer.eval_every:
        return None
    if cfg.model.tier == "toy":
        return HeldOut("toy", [], [], None)
    train, held = load_problems(cfg.dataset, cfg.model)
    if cfg.dataset.split != "train" or not held:
        raise ConfigError(f"trainer.eval_every={cfg.trainer.eval_every} evaluates on held-out problems, but dataset "
                          f"{cfg.dataset.name} with split={cfg.dataset.split} and eval_fraction="
                          f"{cfg.dataset.eval_fraction} holds none out of training; set dataset.split=train and "
                          "dataset.eval_fraction > 0, or trainer.eval_every=0")
    limit = cfg.trainer.eval_problems or len(held)
    space = answer_space(cfg.dataset)
    if space is not None and cfg.rollout.top_p == 1.0:
        return HeldOut("exact", held[:limit], train[:limit], space)
    return HeldOut("sampled", held[:limit], [], None)


def regime_check(metrics: dict[str, float]) -> bool | None:
    """True while the held-out problems still give group-normalised estimators a signal (exact tasks only)."""
    signal = metrics.get("eval/heldout/signal")
    return None if signal is None else signal >= SIGNAL_FLOOR


def metric_names() -> list[str]:
    """Every eval/ name an evaluation can log (sweep objectives are checked against these)."""
    exact = ["pass_at_1", *(f"pass_at_{k}" for k in EXACT_KS[1:]), *(f"coverage_at_{k}" for k in EXACT_KS[1:]),
             "signal", "correct_entropy", "uniformity", "max_q"]
    names = {f"eval/{split}/{m}" for split in ("heldout", "train") for m in exact}
    names |= {"eval/heldout/reward", "eval/heldout/in_regime", "eval/train/coverage_at_64", "time/eval"}
    names |= {f"eval/heldout/pass_at_{k}" for k in SAMPLED_KS}
    return sorted(names)
