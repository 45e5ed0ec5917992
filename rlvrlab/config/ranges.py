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
UNIT = Range(0, 1)

# Upper bounds of the sizes and counts: a value above them cannot be meant, and today would only fail late (a
# 1e30 group overflows int64 inside torch.multinomial, a 1e11-response toy table asks for terabytes) or run for
# ever. Each is far above any published or shipped setting; rlvrlab.config.memory then checks that what is
# allowed fits the machine (tiny/real tiers: the GPUs; toy tier: this machine's memory).
MAX_GROUP = 2**16  # responses per prompt (group_size, eval_n): published RLVR samples 4-1024 per prompt
MAX_PROMPTS = 2**16  # prompts per step: published batches hold 32-8192 prompts
MAX_ROWS = MAX_GROUP * MAX_PROMPTS  # responses per step, the most a mini-batch or micro-batch can split
# toy tier: torch.multinomial draws from at most 2^24 categories; 2^20 responses per problem is 4 MiB of float32
# logits per table row, beyond any study of the toy setting (16-256 responses)
MAX_TOY_RESPONSES = 2**20
# toy tier's skewed start: correct logits from +skew/2 to -skew/2, incorrect at 0. At skew/2 = 50 the others hold
# e^-50 ~ 2e-22 of the top response's probability, far below float32's resolution near 1 (2^-24 ~ 6e-8): the
# policy is already one-hot there, and a larger skew only brings exp underflow (float32's exp(-x) is 0 past
# x ~ 104, log-probs -inf) and, past ~3.4e38, logits that are not finite in float32 at all
MAX_TOY_SKEW = 100.0
MAX_TOKENS = 2**20  # prompt or response tokens: the longest context windows of current models are ~1M tokens
MAX_PROBLEMS = 2**24  # problems generated or evaluated: 16.7M, beyond any RLVR training set (DAPO-Math: 17k)
MAX_STEPS = 10**8  # training steps (and step intervals): years at a millisecond a step; MLflow's steps are int64
MAX_TRIES = 2**16  # repeats of a whole phase (generate batches, PPO epochs, warm-start steps) within a step or run
MAX_STALENESS = 64  # steps rollouts may lag: each lagged batch is kept in memory; asynchronous RLVR lags 1-8 steps
# the tiny tier is a small random transformer (CPU tests); these are past the largest published LLMs (Llama 3.1
# 405B: 126 layers, hidden 16384, 128 heads): anything larger is a real model (model.tier=real)
MAX_TINY_LAYERS = 256
MAX_TINY_HIDDEN = 2**15
MAX_TINY_HEADS = 2**10
MAX_SECONDS = 86_400.0  # a wait in seconds (verifier_timeout): a day; threading's timeouts overflow at ~9.2e9 s
MAX_WORKERS = 2**12  # processes (verifier_workers), ranks (world_size: data parallel splits the prompts per step)
MAX_DEVICE_GIB = 2.0**14  # one accelerator's memory for the estimate: 16 TiB, ~100x an H200's 141 GB
MAX_ROWS_IN_FILE = 10**12  # rows a data file must hold (expected_rows): a trillion, beyond any benchmark

RANGES: dict[str, Range] = {
    "algorithm.adv_eps": POSITIVE,
    "algorithm.tau": UNIT,
    "algorithm.alpha": NON_NEGATIVE,
    "algorithm.passk_k": Range(1, MAX_GROUP),  # <= rollout.group_size (a cross-field rule)
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
    "algorithm.max_gen_batches": Range(1, MAX_TRIES),
    "algorithm.overlong_buffer": Range(0, 1, high_open=True),
    "algorithm.overlong_penalty": NON_NEGATIVE,
    "model.toy_num_responses": Range(2, MAX_TOY_RESPONSES),
    "model.toy_num_correct": Range(1, MAX_TOY_RESPONSES),  # < toy_num_responses (a cross-field rule)
    "model.toy_init_skew": Range(0, MAX_TOY_SKEW),
    "model.tiny_layers": Range(1, MAX_TINY_LAYERS),
    "model.tiny_hidden": Range(1, MAX_TINY_HIDDEN),
    "model.tiny_heads": Range(1, MAX_TINY_HEADS),
    "model.warmstart_steps": Range(0, MAX_STEPS),
    "model.warm_start_seed": Range(0, 2**32 - 1, null_is_off=True, null_means="for the run's seed"),  # as `seed`
    "model.lora.r": Range(0, MAX_TINY_HIDDEN),  # 0 = off; a rank above the layers' widths would not be low-rank
    "model.lora.alpha": POSITIVE,
    "model.lora.dropout": Range(0, 1, high_open=True),  # > 0 is refused by rlvrlab.config.lora (eval-mode training)
    "dataset.num_problems": Range(1, MAX_PROBLEMS),
    "dataset.eval_fraction": Range(0, 1, high_open=True),
    "dataset.verifier_timeout": Range(0, MAX_SECONDS, low_open=True),
    "trainer.eval_every": Range(0, MAX_STEPS),
    "trainer.eval_problems": Range(0, MAX_PROBLEMS),
    "trainer.eval_n": Range(1, MAX_GROUP),
    "dataset.verifier_workers": Range(0, MAX_WORKERS),  # 0 = all cores
    "dataset.expected_rows": Range(1, MAX_ROWS_IN_FILE, null_is_off=True),
    "rollout.group_size": Range(1, MAX_GROUP),
    "rollout.prompts_per_step": Range(1, MAX_PROMPTS),
    # vLLM samples greedily below 1e-5 (its _SAMPLING_EPS), which no sampled log-prob of the trainer matches; and
    # far below it logits / temperature leave float32 (1e-300: infinite logits, a run FAILED as non-finite)
    "rollout.temperature": Range(1e-5),
    "rollout.top_p": Range(0, 1, low_open=True),
    "rollout.max_new_tokens": Range(1, MAX_TOKENS),
    "rollout.vllm_gpu_memory_utilization": Range(0, 1, low_open=True),
    "rollout.max_prompt_tokens": Range(1, MAX_TOKENS),
    # AdamW's step is lr / (1 - beta1^t), at most lr / 1.1e-16 for a float64 beta1 < 1: with lr <= 1e3 it stays
    # within float32 (torch refused 1e38 with an overflow traceback); no useful rate comes near the bound
    "trainer.lr": Range(0, 1e3, low_open=True),
    "trainer.weight_decay": NON_NEGATIVE,
    "trainer.grad_clip": NON_NEGATIVE,
    "trainer.ppo_epochs": Range(1, MAX_TRIES),
    "trainer.mini_batches": Range(1, MAX_ROWS),  # divides the step's responses
    "trainer.micro_batch_size": Range(1, MAX_ROWS),
    "trainer.micro_batch_tokens": Range(1, MAX_ROWS * MAX_TOKENS, null_is_off=True),
    "trainer.staleness": Range(0, MAX_STALENESS),
    "trainer.checkpoint_every": Range(0, MAX_STEPS),
    "trainer.dist_timeout_minutes": Range(0, 7 * 24 * 60, low_open=True),  # at most a week
    "trainer.world_size": Range(1, MAX_WORKERS, null_is_off=True),
    "trainer.device_memory_gib": Range(0, MAX_DEVICE_GIB, low_open=True),
    "tracking.log_every": Range(1, MAX_STEPS),
    "tracking.log_last": Range(0, MAX_STEPS),
    "seed": Range(0, 2**32 - 1),  # what every RNG seeded from it (numpy's legacy one included) accepts
    "steps": Range(1, MAX_STEPS),
}
