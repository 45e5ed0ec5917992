"""The allowed interval of every numeric knob (RANGES), checked once at composition by rlvrlab.config.rules, and
how an interval reads in the one-line error that refuses a value outside it.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """An interval of allowed numbers. For an Optional knob (null_is_off) null passes: it turns the knob off."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    null_is_off: bool = False
    inf_is_off: bool = False  # +inf turns the knob off (an unbounded clip); any other knob refuses inf like nan
    null_means: str = "to turn it off"  # what null does, as the error says it (null_is_off knobs)

    def contains(self, value: float | None) -> bool:
        if value is None:
            return self.null_is_off
        if isinstance(value, float) and math.isinf(value) and not (self.inf_is_off and value > 0):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        off = f" (or null {self.null_means})" if self.null_is_off else " (or .inf to turn it off)" if self.inf_is_off \
            else ""
        finite = "" if self.inf_is_off or self.null_is_off else " and finite"
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}{finite}{off}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}{off}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) >= 1e6 else f"{x:g}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
UNIT = Range(0, 1)

RANGES: dict[str, Range] = {
    "algorithm.adv_eps": POSITIVE,
    "algorithm.tau": UNIT,
    "algorithm.alpha": NON_NEGATIVE,
    "algorithm.passk_k": AT_LEAST_ONE,
    "algorithm.gamma": UNIT,
    "algorithm.fgrpo_gamma": NON_NEGATIVE,
    "algorithm.eps_low": Range(0, inf_is_off=True),
    "algorithm.eps_high": Range(0, inf_is_off=True),
    "algorithm.dual_clip_c": Range(1, low_open=True, null_is_off=True),
    "algorithm.loss_scale_factor": Range(0, low_open=True, null_is_off=True),
    "algorithm.sapo_tau_pos": POSITIVE,
    "algorithm.sapo_tau_neg": POSITIVE,
    "algorithm.cov_ratio": Range(0, 1, low_open=True),
    "algorithm.kl_cov_coef": NON_NEGATIVE,
    "algorithm.dro_beta": POSITIVE,
    "algorithm.dppo_c": Range(1, low_open=True),
    "algorithm.w_reinforce_lambda": UNIT,
    "algorithm.kl_coef": NON_NEGATIVE,
    "algorithm.entropy_coef": NON_NEGATIVE,
    "algorithm.ent_adv_alpha": NON_NEGATIVE,
    "algorithm.ent_adv_kappa": POSITIVE,
    "algorithm.tis_cap": POSITIVE,
    "algorithm.tis_lower": Range(0, low_open=True, null_is_off=True),
    "algorithm.max_gen_batches": AT_LEAST_ONE,
    "algorithm.overlong_buffer": Range(0, 1, high_open=True),
    "algorithm.overlong_penalty": NON_NEGATIVE,
    "model.toy_num_responses": Range(2),
    "model.toy_num_correct": AT_LEAST_ONE,
    "model.toy_init_skew": NON_NEGATIVE,
    "model.tiny_layers": AT_LEAST_ONE,
    "model.tiny_hidden": AT_LEAST_ONE,
    "model.tiny_heads": AT_LEAST_ONE,
    "model.warmstart_steps": NON_NEGATIVE,
    "model.warm_start_seed": Range(0, 2**32 - 1, null_is_off=True, null_means="for the run's seed"),  # as `seed`
    "dataset.num_problems": AT_LEAST_ONE,
    "dataset.eval_fraction": Range(0, 1, high_open=True),
    "dataset.verifier_timeout": POSITIVE,
    "trainer.eval_every": NON_NEGATIVE,
    "trainer.eval_problems": NON_NEGATIVE,
    "trainer.eval_n": AT_LEAST_ONE,
    "dataset.verifier_workers": NON_NEGATIVE,  # 0 = all cores
    "dataset.expected_rows": Range(1, null_is_off=True),
    "rollout.group_size": AT_LEAST_ONE,
    "rollout.prompts_per_step": AT_LEAST_ONE,
    "rollout.temperature": POSITIVE,
    "rollout.top_p": Range(0, 1, low_open=True),
    "rollout.max_new_tokens": AT_LEAST_ONE,
    "rollout.vllm_gpu_memory_utilization": Range(0, 1, low_open=True),
    "rollout.max_prompt_tokens": AT_LEAST_ONE,
    # AdamW's step is lr / (1 - beta1^t), at most lr / 1.1e-16 for a float64 beta1 < 1: with lr <= 1e3 it stays
    # within float32 (torch refused 1e38 with an overflow traceback); no useful rate comes near the bound
    "trainer.lr": Range(0, 1e3, low_open=True),
    "trainer.weight_decay": NON_NEGATIVE,
    "trainer.grad_clip": NON_NEGATIVE,
    "trainer.ppo_epochs": AT_LEAST_ONE,
    "trainer.mini_batches": AT_LEAST_ONE,
    "trainer.micro_batch_size": AT_LEAST_ONE,
    "trainer.micro_batch_tokens": Range(1, null_is_off=True),
    "trainer.staleness": NON_NEGATIVE,
    "trainer.checkpoint_every": NON_NEGATIVE,
    "trainer.dist_timeout_minutes": Range(0, 7 * 24 * 60, low_open=True),  # at most a week
    "trainer.world_size": Range(1, null_is_off=True),
    "trainer.device_memory_gib": POSITIVE,
    "tracking.log_every": AT_LEAST_ONE,
    "tracking.log_last": NON_NEGATIVE,
    "seed": Range(0, 2**32 - 1),  # what every RNG seeded from it (numpy's legacy one included) accepts
    "steps": AT_LEAST_ONE,
}
