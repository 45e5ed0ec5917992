"""Validation of a composed RunConfig: choices, ranges, knobs that would be ignored, cross-field rules.

Every rule raises ConfigError with one line naming the key(s) and the fix: tables where a table says it best
(CHOICES, RANGES in rlvrlab.config.ranges, KNOB_READERS), short functions where two fields meet (CROSS_FIELD_RULES;
model.lora's in rlvrlab.config.lora). What is valid comes from the registries: the algorithm library's, the
verifiers' and the synthetic tasks' (rlvrlab.data.tasks.TASKS: names, verifiers, levels, the toy task).
"""

import dataclasses
import difflib
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from functools import reduce
from typing import TYPE_CHECKING, Any

from rlvrlab.config import memory
from rlvrlab.config.lora import check_lora
from rlvrlab.config.ranges import RANGES
from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import ConfigError

if TYPE_CHECKING:
    from rlvrlab.data.problems import Task

CHOICES: dict[str, tuple[Any, ...]] = {
    "model.tier": ("toy", "tiny", "real"),
    "model.dtype": ("float32", "bfloat16"),
    "model.toy_init": ("skewed", "uniform"),
    "dataset.format": ("synthetic", "jsonl", "parquet"),
    "dataset.math_extraction": ("boxed", "mathverify", "any"),  # rlvrlab.rewards.math.EXTRACTIONS
    "dataset.split": ("train", "eval", "all"),
    "rollout.engine": ("hf", "vllm"),
    "rollout.vllm_seeding": ("request", "engine"),
    "trainer.engine": ("deepspeed", "torch"),
    "trainer.zero_stage": (0, 1, 2, 3),
    "trainer.device": ("auto", "cuda", "cpu"),
    "algorithm.tis_level": ("none", "token", "sequence"),
    "tracking.backend": ("mlflow", "none"),
}


# knob -> (the key that selects what reads it, the values of that key under which it is read).
# A knob moved off its default while nothing reads it would be silently ignored, so that is an error.
# The knobs of the algorithm functions are not listed here: _knob_readers() reads them off the registered
# functions' signatures (rlvrlab.algorithms.knobs) and UP's off the losses' up_compatible trait.
KNOB_READERS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "algorithm.tis_cap": ("algorithm.tis_level", ("token", "sequence")),
    "algorithm.tis_lower": ("algorithm.tis_level", ("token", "sequence")),
    "algorithm.tis_batch_normalize": ("algorithm.tis_level", ("token", "sequence")),
    "algorithm.max_gen_batches": ("algorithm.dynamic_sampling", (True,)),
    "algorithm.loss_scale_factor": ("algorithm.agg", ("seq-mean-token-sum-norm",)),
    "model.path": ("model.tier", ("real",)),
    "model.toy_num_responses": ("model.tier", ("toy",)),
    "model.toy_num_correct": ("model.tier", ("toy",)),
    "model.toy_init": ("model.tier", ("toy",)),
    "model.toy_init_skew": ("model.tier", ("toy",)),
    "model.tiny_layers": ("model.tier", ("tiny",)),
    "model.tiny_hidden": ("model.tier", ("tiny",)),
    "model.tiny_heads": ("model.tier", ("tiny",)),
    "model.warmstart_steps": ("model.tier", ("tiny",)),
    "dataset.num_problems": ("dataset.format", ("synthetic",)),
    "dataset.path": ("dataset.format", ("jsonl", "parquet")),
    "dataset.math_extraction": ("dataset.verifier", ("math",)),
    "dataset.expected_rows": ("dataset.format", ("jsonl", "parquet")),
    "dataset.provide": ("dataset.format", ("jsonl", "parquet")),
    "rollout.vllm_gpu_memory_utilization": ("rollout.engine", ("vllm",)),
    "rollout.vllm_seeding": ("rollout.engine", ("vllm",)),
    "rollout.vllm_extensible_kv_cache": ("rollout.engine", ("vllm",)),
    "trainer.zero_stage": ("trainer.engine", ("deepspeed",)),
    "trainer.offload_optimizer": ("trainer.engine", ("deepspeed",)),
    "trainer.grad_accum_fp32": ("model.dtype", ("bfloat16",)),
    "trainer.pack_by_length": ("trainer.micro_batch_tokens", (None,)),  # an explicit budget takes its place
    "trainer.gradient_checkpointing": ("model.tier", ("tiny", "real")),
    "model.architecture": ("model.tier", ("real",)),
    "tracking.uri": ("tracking.backend", ("mlflow",)),
}


def show(value: Any) -> str:
    """A value as the user would type it in an override."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return str(value)


def unknown(what: str, name: Any, options: Collection[Any], where: str = "") -> ConfigError:
    """`unknown <what> 'x' in <where>; did you mean 'y'? available: ...` (difflib picks the suggestion)."""
    names = [show(option) for option in options]
    close = difflib.get_close_matches(show(name), names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    source = f" in {where}" if where else ""
    return ConfigError(f"unknown {what} {show(name)!r}{source}; {hint}available: {', '.join(names) or 'none'}")


def lookup(cfg: RunConfig, key: str) -> Any:
    return reduce(getattr, key.split("."), cfg)


def validate(cfg: RunConfig, layers: Mapping[str, int] | None = None) -> None:
    """Raise ConfigError for the first rule `cfg` breaks. The checks that need no torch run first.

    ``layers`` maps a dotted key to the precedence layer that set it last (1 group file, 2 experiment body,
    3 command line; absent = schema default); without it every key counts as set by the user.
    """
    _check_text(cfg)  # first: every later message may quote a value
    _check_choices(cfg, CHOICES)
    _check_ranges(cfg)
    _check_choices(cfg, _registry_choices())
    _check_knobs_are_read(cfg, layers if layers is not None else {})
    for rule in CROSS_FIELD_RULES:
        rule(cfg)


def _registry_choices() -> dict[str, Collection[str]]:
    # Imported here: rlvrlab.algorithms imports torch (~2 s), which `rlvrlab --help` and the cheaper
    # checks above must not wait for.
    from rlvrlab import algorithms
    from rlvrlab.rewards import VERIFIERS

    return {
        "algorithm.estimator": algorithms.ADVANTAGES,
        "algorithm.loss": algorithms.POLICY_LOSSES,
        "algorithm.agg": algorithms.AGGREGATIONS,
        "algorithm.kl_estimator": algorithms.KL_ESTIMATORS,
        "dataset.verifier": VERIFIERS,
    }


def _check_choices(cfg: RunConfig, choices: Mapping[str, Collection[Any]]) -> None:
    for key, options in choices.items():
        if lookup(cfg, key) not in options:
            raise unknown(key, lookup(cfg, key), options)


def not_utf8(text: str) -> str | None:
    """None when `text` can be written as UTF-8; else where it cannot, quoted so that the message itself can be
    printed: a lone surrogate such as '\\udcff' (what Python makes of a byte of argv or of a file name that is not
    UTF-8) cannot be written to a UTF-8 terminal, log, YAML file or MLflow store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        around = text[max(0, error.start - 12): error.end + 12]
        code = ord(text[error.start])
        byte = f" (the byte 0x{code - 0xDC00:02x})" if 0xDC80 <= code <= 0xDCFF else ""  # surrogateescape's
        return f"character {error.start + 1} of {ascii(around)}{byte} is not UTF-8 text"
    return None


def require_utf8(text: str, what: str) -> None:
    """ConfigError naming `what` (a key, an argument) when `text` cannot be written as UTF-8 (not_utf8)."""
    problem = not_utf8(text)
    if problem is not None:
        raise ConfigError(f"{what}: {problem}, as from a terminal or file in another encoding (Latin-1); retype it "
                          "in UTF-8")


def _texts(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """(key, text) of every string in `value`, keys of mappings included, descending into lists and mappings."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _texts(item, f"{key}[{index}]")
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _texts(name, f"{key} (a key)")
            yield from _texts(item, f"{key}.{name}" if isinstance(name, str) and not not_utf8(name) else key)


def _check_text(cfg: RunConfig) -> None:
    """Every text value of the config (names, paths, templates, few-shot pairs, ...) can be written as UTF-8, and
    the experiment name is one MLflow accepts."""
    for field in dataclasses.fields(cfg):
        for key, text in _texts(dataclasses.asdict(cfg)[field.name], field.name):
            require_utf8(text, key)
    if len(cfg.experiment) > MAX_EXPERIMENT_NAME:
        raise ConfigError(f"experiment is {len(cfg.experiment)} characters long, more than the {MAX_EXPERIMENT_NAME} "
                          f"MLflow allows in an experiment name; give a shorter experiment=...")
    if not cfg.experiment:
        raise ConfigError("experiment is empty; MLflow needs an experiment name: give experiment=NAME")


# mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH (MLflow 3.x; tests/faults/test_hostile_values.py compares);
# not imported: composing a config never imports MLflow
MAX_EXPERIMENT_NAME = 500


def _check_ranges(cfg: RunConfig) -> None:
    for key, allowed in RANGES.items():
        value = lookup(cfg, key)
        if not allowed.contains(value):
            raise ConfigError(f"{key}={_short(show(value))} is out of range: it must be {allowed}")


def _short(text: str, keep: int = 40) -> str:
    """A long number (a pasted 4000-digit integer) shortened for a one-line message."""
    return text if len(text) <= keep else f"{text[:keep // 2]}...({len(text)} characters)"


def _knob_readers() -> dict[str, tuple[str, tuple[Any, ...]]]:
    """KNOB_READERS plus, for every algorithm knob, the estimators or losses whose signature reads it."""
    from rlvrlab import algorithms  # lazily, as in _registry_choices

    readers = dict(KNOB_READERS)
    registries: tuple[tuple[str, Mapping[str, algorithms.Estimator | algorithms.PolicyLoss]], ...] = (
        ("algorithm.estimator", algorithms.ADVANTAGES), ("algorithm.loss", algorithms.POLICY_LOSSES))
    for selector, registry in registries:
        for name, entry in registry.items():
            for knob in entry.knobs:
                key = f"algorithm.{knob}"
                readers[key] = (selector, readers.get(key, (selector, ()))[1] + (name,))
    up = tuple(sorted(name for name, loss in algorithms.POLICY_LOSSES.items() if loss.up_compatible))
    readers["algorithm.unbounded_positive"] = ("algorithm.loss", up)
    from rlvrlab.data.tasks import TASKS  # lazily: rlvrlab.data imports numpy

    readers["dataset.level"] = ("dataset.name", tuple(sorted(name for name, task in TASKS.items() if task.levels)))
    return readers


def _check_knobs_are_read(cfg: RunConfig, layers: Mapping[str, int]) -> None:
    """A knob nothing reads is an error when it was set at the same or a higher precedence layer than the
    selector that makes it unused (``algorithm.tau=0.3`` with estimator grpo). A knob from a lower layer that
    a later selection superseded (``algorithm.loss=sapo`` over grpo.yaml's dual_clip_c) is not."""
    defaults = RunConfig()
    for knob, (selector, readers) in _knob_readers().items():
        chosen = lookup(cfg, selector)
        if lookup(cfg, knob) == lookup(defaults, knob) or chosen in readers:
            continue
        if layers.get(knob, 0) >= layers.get(selector, 0):
            fix = f"{selector}={show(readers[0])}" if len(readers) == 1 else f"{selector} to one of them"
            raise ConfigError(f"{knob} has no effect with {selector} {show(chosen)!r} (it is read by: "
                              f"{', '.join(map(show, readers))}); set {fix} or drop the override")


def _group_size_fits_estimator(cfg: RunConfig) -> None:
    from rlvrlab.algorithms import ADVANTAGES  # lazily, as in _registry_choices

    if ADVANTAGES[cfg.algorithm.estimator].per_group and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"rollout.group_size={cfg.rollout.group_size} is too small for algorithm.estimator "
            f"{cfg.algorithm.estimator!r}, which compares responses within a group; set rollout.group_size>=2"
        )


def _passk_fits_group(cfg: RunConfig) -> None:
    reads_k = cfg.algorithm.estimator in _knob_readers()["algorithm.passk_k"][1]
    if reads_k and cfg.algorithm.passk_k > cfg.rollout.group_size:
        raise ConfigError(
            f"algorithm.passk_k={cfg.algorithm.passk_k} exceeds rollout.group_size={cfg.rollout.group_size} "
            "(pass@k needs k <= n samples per prompt); lower algorithm.passk_k or raise rollout.group_size"
        )


def _lower_ratio_bound_not_negative(cfg: RunConfig) -> None:
    from rlvrlab.algorithms import POLICY_LOSSES  # lazily, as in _registry_choices

    if POLICY_LOSSES[cfg.algorithm.loss].clips_ratio and cfg.algorithm.eps_low > 1:
        raise ConfigError(
            f"algorithm.eps_low={cfg.algorithm.eps_low} makes the lower ratio bound 1 - eps_low negative for "
            f"algorithm.loss {cfg.algorithm.loss!r}; set algorithm.eps_low<=1 (1 removes the lower bound)"
        )


def _clip_cov_bounds_ordered(cfg: RunConfig) -> None:
    if cfg.algorithm.clip_cov_ub <= cfg.algorithm.clip_cov_lb:
        raise ConfigError(
            f"algorithm.clip_cov_ub={cfg.algorithm.clip_cov_ub} must be greater than "
            f"algorithm.clip_cov_lb={cfg.algorithm.clip_cov_lb}; raise the upper bound or lower the lower one"
        )


def _mini_batches_divide_batch(cfg: RunConfig) -> None:
    batch = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if batch % cfg.trainer.mini_batches:
        raise ConfigError(
            f"trainer.mini_batches={cfg.trainer.mini_batches} does not divide the {batch} responses per step "
            "(rollout.prompts_per_step * rollout.group_size); pick a divisor of it"
        )


def _real_model_has_path(cfg: RunConfig) -> None:
    if cfg.model.tier == "real" and cfg.model.path is None:
        raise ConfigError("model.tier=real needs model.path; set model.path=/path/to/hf-model-folder")


def _file_dataset_has_path(cfg: RunConfig) -> None:
    if cfg.dataset.format != "synthetic" and cfg.dataset.path is None:
        raise ConfigError(
            f"dataset.format={cfg.dataset.format} needs dataset.path; "
            f"set dataset.path=/path/to/data.{cfg.dataset.format}"
        )


def _task(cfg: RunConfig) -> "Task | None":
    """The registered task (rlvrlab.data.tasks.TASKS) a synthetic dataset names; None for a file's data."""
    from rlvrlab.data.tasks import synthetic_task  # lazily, as in _knob_readers

    return synthetic_task(cfg.dataset)


def _synthetic_dataset_exists(cfg: RunConfig) -> None:
    from rlvrlab.data.tasks import TASKS  # lazily, as in _knob_readers

    if cfg.dataset.format == "synthetic" and cfg.dataset.name not in TASKS:
        error = unknown("synthetic dataset.name", cfg.dataset.name, sorted(TASKS))
        raise ConfigError(f"{error}; a file's data needs dataset.format=jsonl or parquet and dataset.path")


def _task_has_its_verifier_and_level(cfg: RunConfig) -> None:
    task, dataset = _task(cfg), cfg.dataset
    if task is not None and dataset.verifier != task.verifier:
        raise ConfigError(f"dataset.verifier={dataset.verifier} cannot grade the {task.name} task, whose answers "
                          f"verifier {task.verifier} grades; set dataset.verifier={task.verifier} or drop the override")
    if task is not None and task.levels and dataset.level not in task.levels:
        levels = ", ".join(f"{level} ({what})" for level, what in task.levels.items())
        raise ConfigError(f"dataset.level={dataset.level} is not a level of the {task.name} task; use one of {levels}")


def _split_all_holds_nothing_out(cfg: RunConfig) -> None:
    if cfg.dataset.split == "all" and cfg.dataset.eval_fraction > 0:
        raise ConfigError(
            f"dataset.split=all reads every row and holds none out, but dataset.eval_fraction="
            f"{cfg.dataset.eval_fraction}; set dataset.eval_fraction=0, or dataset.split=train or eval for a hold-out"
        )


def _toy_has_incorrect_responses(cfg: RunConfig) -> None:
    # With every response correct, all rewards in a group are equal and there is nothing to learn.
    if cfg.model.toy_num_correct >= cfg.model.toy_num_responses:
        raise ConfigError(
            f"model.toy_num_correct={cfg.model.toy_num_correct} must be below "
            f"model.toy_num_responses={cfg.model.toy_num_responses}; lower it or add responses"
        )


def _bf16_needs_deepspeed(cfg: RunConfig) -> None:
    if cfg.model.dtype == "bfloat16" and cfg.trainer.engine != "deepspeed":
        raise ConfigError("model.dtype=bfloat16 trains with DeepSpeed's bf16 mixed precision (fp32 master weights); "
                          "set trainer.engine=deepspeed or model.dtype=float32")


def _toy_model_with_toy_data(cfg: RunConfig) -> None:
    task = _task(cfg)
    if (cfg.model.tier == "toy") != (task is not None and task.toy):
        raise ConfigError(f"model.tier={cfg.model.tier} with dataset {cfg.dataset.name}: the toy policy answers only "
                          "the toy dataset and vice versa; use model=toy dataset=toy, or another model and dataset")


def _tiny_heads_divide_hidden(cfg: RunConfig) -> None:
    if cfg.model.tiny_hidden % cfg.model.tiny_heads:
        raise ConfigError(
            f"model.tiny_hidden={cfg.model.tiny_hidden} is not divisible by model.tiny_heads="
            f"{cfg.model.tiny_heads}; pick a head count that divides the hidden size"
        )


def _template_has_prompt(cfg: RunConfig) -> None:
    if cfg.dataset.template is not None and "{prompt}" not in cfg.dataset.template:
        raise ConfigError("dataset.template has no {prompt} placeholder; add {prompt} where the question goes")


def _fewshot_are_pairs(cfg: RunConfig) -> None:
    for number, pair in enumerate(cfg.dataset.fewshot, 1):
        if len(pair) != 2 or not all(text.strip() for text in pair):
            raise ConfigError(f"dataset.fewshot example {number} is {pair}; each example is a non-empty "
                              '[question, answer] pair, e.g. ["What is 3 + 4?", "3 + 4 = 7."]')


def _overlong_buffer_fits(cfg: RunConfig) -> None:
    a = cfg.algorithm
    if a.overlong_buffer > 0 and overlong_buffer_tokens(cfg) < 1:
        raise ConfigError(f"algorithm.overlong_buffer={a.overlong_buffer:g} of rollout.max_new_tokens="
                          f"{cfg.rollout.max_new_tokens} is less than one token; raise it or set it to 0 (off)")


def overlong_buffer_tokens(cfg: RunConfig) -> int:
    """DAPO's overlong buffer in tokens: the share algorithm.overlong_buffer of rollout.max_new_tokens (the paper:
    4096 of 20480, i.e. 0.2)."""
    return int(round(cfg.algorithm.overlong_buffer * cfg.rollout.max_new_tokens))


def _rollout_correction_fits_the_loss(cfg: RunConfig) -> None:
    if cfg.algorithm.tis_level == "none":
        return
    from rlvrlab.algorithms import POLICY_LOSSES  # lazily, as in _registry_choices

    if POLICY_LOSSES[cfg.algorithm.loss].aggregates_itself:
        raise ConfigError(f"algorithm.tis_level={cfg.algorithm.tis_level} weights each token's loss before the "
                          f"aggregation, but algorithm.loss {cfg.algorithm.loss!r} aggregates its own sequence "
                          "terms; use another loss or algorithm.tis_level=none")


def _rollout_correction_bounds(cfg: RunConfig) -> None:
    """IcePop's window and verl's rejection options and thresholds (rlvrlab.algorithms.parse_rejection reads them
    as verl does; bounds must also be finite here)."""
    a = cfg.algorithm
    if a.tis_level != "none" and a.tis_lower is not None and a.tis_lower > a.tis_cap:
        raise ConfigError(f"algorithm.tis_lower={a.tis_lower:g} is above algorithm.tis_cap={a.tis_cap:g}: IcePop keeps "
                          "the weights inside [tis_lower, tis_cap]; lower tis_lower or raise tis_cap")
    if a.rollout_rs is None:
        if a.rollout_rs_threshold is not None:
            raise ConfigError(f"algorithm.rollout_rs_threshold={a.rollout_rs_threshold} has no effect without "
                              "algorithm.rollout_rs; name the rejection options (e.g. algorithm.rollout_rs=token_k1) "
                              "or drop the threshold")
        return
    from rlvrlab.algorithms import parse_rejection  # lazily, as in _registry_choices

    example = "e.g. algorithm.rollout_rs=token_k1,seq_max_k2 algorithm.rollout_rs_threshold=0.5_2.0,0.1"
    try:
        criteria = parse_rejection(a.rollout_rs, a.rollout_rs_threshold)
    except ValueError as error:
        raise ConfigError(f"algorithm.rollout_rs={a.rollout_rs} with algorithm.rollout_rs_threshold="
                          f"{show(a.rollout_rs_threshold)}: {error}; {example}") from None
    for criterion in criteria:
        if not all(math.isfinite(bound) for bound in (criterion.upper, criterion.lower or 1.0)):
            raise ConfigError(f"algorithm.rollout_rs_threshold={a.rollout_rs_threshold}: the bounds of "
                              f"{criterion.option} must be finite numbers; {example}")


def _token_budget_needs_an_exact_loss(cfg: RunConfig) -> None:
    t = cfg.trainer
    if t.micro_batch_tokens is None and not t.pack_by_length:
        return
    from rlvrlab.algorithms import POLICY_LOSSES  # lazily, as in _registry_choices

    if not POLICY_LOSSES[cfg.algorithm.loss].micro_batch_exact:
        knob = "trainer.micro_batch_tokens" if t.micro_batch_tokens is not None else "trainer.pack_by_length"
        off = "trainer.micro_batch_tokens=null" if t.micro_batch_tokens is not None else "trainer.pack_by_length=false"
        raise ConfigError(f"{knob} regroups rows into micro-batches by length, but algorithm.loss "
                          f"{cfg.algorithm.loss!r} picks tokens within each micro-batch, so its update would "
                          f"change; add {off} (micro-batches of trainer.micro_batch_size rows)")


def _dynamic_sampling_needs_groups(cfg: RunConfig) -> None:
    if cfg.algorithm.dynamic_sampling and cfg.rollout.group_size < 2:
        raise ConfigError("algorithm.dynamic_sampling keeps groups whose scores differ, which needs "
                          "rollout.group_size >= 2")


def _betas_are_a_pair(cfg: RunConfig) -> None:
    betas = cfg.trainer.betas
    if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        raise ConfigError(f"trainer.betas={betas} must be two values in [0, 1), e.g. trainer.betas=[0.9,0.999]")


def _offload_needs_zero(cfg: RunConfig) -> None:
    if cfg.trainer.offload_optimizer and cfg.trainer.zero_stage == 0:
        raise ConfigError("trainer.offload_optimizer=true needs DeepSpeed ZeRO (it offloads the partitioned "
                          "optimizer states); set trainer.zero_stage to 1, 2 or 3")


def _fp32_accumulation_needs_zero(cfg: RunConfig) -> None:
    # DeepSpeed 0.19.8 wraps a bf16 model's fp32 accumulation at ZeRO 1-3 only (tests/update/test_deepspeed_engine.py)
    t = cfg.trainer
    if t.engine == "deepspeed" and cfg.model.dtype == "bfloat16" and t.zero_stage == 0 and t.grad_accum_fp32:
        raise ConfigError("trainer.grad_accum_fp32=true at trainer.zero_stage=0: DeepSpeed 0.19.8 cannot accumulate "
                          "fp32 gradients of a bf16 model without ZeRO (NotImplementedError); set trainer.zero_stage "
                          "to 1, 2 or 3, or trainer.grad_accum_fp32=false")


def _world_size_divides_prompts(cfg: RunConfig) -> None:
    n = cfg.trainer.world_size
    if n is not None and cfg.rollout.prompts_per_step % n:
        raise ConfigError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} is not divisible by "
                          f"trainer.world_size={n} (each rank samples whole prompts); change one of them")


def _architecture_is_complete(cfg: RunConfig) -> None:
    needed = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads", "vocab_size")
    missing = [key for key in needed if key not in cfg.model.architecture]
    if cfg.model.architecture and missing:
        raise ConfigError(f"model.architecture lacks {', '.join(missing)}; copy these keys from the model's "
                          "config.json")


def _fits_the_devices(cfg: RunConfig) -> None:
    """The per-GPU memory estimate (rlvrlab.config.memory) of trainer.world_size GPUs of trainer.device_memory_gib
    each; refused in one line when it exceeds them. Launch checks it again with the real ranks and devices. The toy
    tier runs in this machine's memory: its table and batch are held to that (memory.check_toy_fits)."""
    if cfg.model.tier == "toy":
        memory.check_toy_fits(cfg)
    arch = memory.architecture(cfg)
    if arch is not None:
        memory.check_fits(cfg, arch, world_size=memory.planned_world_size(cfg),
                          device_bytes=int(cfg.trainer.device_memory_gib * memory.GIB))


CROSS_FIELD_RULES: tuple[Callable[[RunConfig], None], ...] = (
    _group_size_fits_estimator,
    _passk_fits_group,
    _lower_ratio_bound_not_negative,
    _clip_cov_bounds_ordered,
    _mini_batches_divide_batch,
    _real_model_has_path,
    _file_dataset_has_path,
    _synthetic_dataset_exists,
    _task_has_its_verifier_and_level,
    _split_all_holds_nothing_out,
    _toy_has_incorrect_responses,
    _tiny_heads_divide_hidden,
    _bf16_needs_deepspeed,
    _toy_model_with_toy_data,
    _template_has_prompt,
    _fewshot_are_pairs,
    _betas_are_a_pair,
    _overlong_buffer_fits,
    _rollout_correction_fits_the_loss,
    _rollout_correction_bounds,
    _token_budget_needs_an_exact_loss,
    _dynamic_sampling_needs_groups,
    _offload_needs_zero,
    _fp32_accumulation_needs_zero,
    _world_size_divides_prompts,
    _architecture_is_complete,
    check_lora,  # model.lora's rules (rlvrlab.config.lora)
    _fits_the_devices,
)
