"""rlvrlab's algorithm library against outputs of verl's and the UCPO repo's own functions.

Runs every case of tests/vectors/*.json and, when RLVRLAB_VECTORS_DIR is set, every case of the files of
the same names in that folder. Cases are dispatched by their ``function``/``params`` fields, never by
case name, so new cases of the same schema run unchanged. Tolerance: atol 1e-6, rtol 1e-5 (the files'
``tolerance_hint``); float64 UCPO outputs at atol 1e-6, rtol 0.

Strict parameters: every key of a case's ``params`` (and of its ``global_batch_info``) is either mapped to an
rlvrlab argument by the check that runs the case, or on that check's ignore list below with the reason it does
not apply; any other key fails the case, naming the key (`require_known_params`).

Deliberate differences from the references (docs/algorithms.md) are applied to the expected values by
rule, and the rule is what is tested:
- D1: a group whose rewards are all exactly equal gets advantage 0 (verl's float32 GRPO gives 0.056 for
  seven copies of 0.7).
- D2: a singleton group gets advantage 0 in estimators whose only baseline is the group (verl's loop
  GRPO gives r/(1+eps), RLOO and OPO give r, GPG alpha*r; the UCPO repo's GRPO gives r/(1+1e-6)).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import numpy as np
import pytest
import torch

from rlvrlab import algorithms as A
from rlvrlab.algorithms import advantages as adv_fns, losses as loss_fns, rollout_shaping as shaping

SHIPPED = Path(__file__).parents[1] / "vectors"
VERIFIER_FILE = "ucpo_verifier_probe.json"  # the UCPO repo's math-verify scoring, both argument orders
LEGACY_FILE = "verl_legacy_b178a3c_diff.json"  # legacy verl values; rlvrlab follows current verl
ATOL, RTOL = 1e-6, 1e-5


def _dirs() -> list[Path]:
    extra = os.environ.get("RLVRLAB_VECTORS_DIR")
    return [SHIPPED] + ([Path(extra)] if extra else [])


def t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def close(actual, expected, atol=ATOL, rtol=RTOL, what="") -> None:
    actual = torch.as_tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def require_known_params(params: Mapping, mapped: Collection[str], ignored: Mapping[str, str], where: str) -> None:
    """Fail on the first key of ``params`` that is neither mapped to an rlvrlab argument nor ignored with a reason."""
    for key in params:
        if key not in mapped and key not in ignored:
            mapped_keys = ", ".join(sorted(mapped)) or "none"
            pytest.fail(f"{where}: params key {key!r} is neither mapped to an rlvrlab argument ({mapped_keys}) nor "
                        "on the ignore list; map it in tests/algorithms/test_reference_vectors.py or ignore it with the reason",
                        pytrace=False)


# ---------------------------------------------------------------- advantages (verl)

# Keys that edit the shared inputs rather than parametrise a function: every advantage case may carry them.
ADVANTAGE_INPUT_KEYS = ("response_mask_override", "rows_kept")
# verl function -> the params keys its rlvrlab counterpart takes (see _advantage_call).
ADVANTAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "compute_grpo_outcome_advantage": ("epsilon", "norm_adv_by_std_in_grpo"),
    "compute_grpo_vectorized_outcome_advantage": ("epsilon", "norm_adv_by_std_in_grpo"),
    "compute_grpo_passk_outcome_advantage": ("epsilon", "norm_adv_by_std_in_grpo"),
    "compute_gdpo_outcome_advantage": ("epsilon", "norm_adv_by_std_in_grpo"),
    "compute_reinforce_plus_plus_outcome_advantage": ("gamma",),
    "compute_gpg_outcome_advantage": ("f_norm",),  # checked to be 1 (rlvrlab's gpg)
}
# verl function -> params key -> why it does not apply.
ADVANTAGE_IGNORED: dict[str, dict[str, str]] = {
    fn: {
        "epsilon": "RLOO has no std normalisation: verl's function takes epsilon and does not read it",
        "norm_adv_by_std_in_grpo": "a GRPO switch; verl's RLOO does not read it (the edge cases pass it as null)",
    }
    for fn in ("compute_rloo_outcome_advantage", "compute_rloo_vectorized_outcome_advantage")
}


def _advantage_call(function: str, params: dict) -> tuple[Callable, dict, bool]:
    """verl function + params -> (rlvrlab estimator, knobs, whether D2 applies)."""
    norm = params.get("norm_adv_by_std_in_grpo", True)
    eps = params.get("epsilon", 1e-6)
    table = {
        "compute_grpo_outcome_advantage": (adv_fns.grpo, {"adv_eps": eps}) if norm else (adv_fns.dr_grpo, {}),
        "compute_grpo_vectorized_outcome_advantage": (adv_fns.grpo, {"adv_eps": eps})
        if norm
        else (adv_fns.dr_grpo, {}),
        "compute_rloo_outcome_advantage": (adv_fns.rloo, {}),
        "compute_rloo_vectorized_outcome_advantage": (adv_fns.rloo, {}),
        "compute_opo_outcome_advantage": (adv_fns.opo, {}),
        "compute_gpg_outcome_advantage": (adv_fns.gpg, {}),
        "compute_reinforce_plus_plus_baseline_outcome_advantage": (adv_fns.reinforce_pp_baseline, {}),
        "compute_reinforce_plus_plus_outcome_advantage": (adv_fns.reinforce_pp, {"gamma": params.get("gamma", 1.0)}),
        "compute_grpo_passk_outcome_advantage": (adv_fns.grpo_passk, {"adv_eps": eps})
        if norm
        else (adv_fns.dr_grpo_passk, {}),
        "compute_gdpo_outcome_advantage": (adv_fns.gdpo, {"adv_eps": eps}),
    }
    assert function in table, f"no rlvrlab mapping for verl function {function!r}"
    if function == "compute_gpg_outcome_advantage":
        assert params.get("f_norm", 1.0) == 1.0, "rlvrlab's gpg uses f_norm = 1"
    if function == "compute_gdpo_outcome_advantage":
        assert norm, "rlvrlab's gdpo normalises by the group std"
    fn, knobs = table[function]
    group_only = fn in (adv_fns.grpo, adv_fns.dr_grpo, adv_fns.rloo, adv_fns.opo, adv_fns.gpg)
    return fn, knobs, group_only


def _apply_group_rules(expected: torch.Tensor, scores: torch.Tensor, index: list, group_only: bool) -> torch.Tensor:
    """D1 and D2 on an expected [B, T] advantage tensor."""
    expected = expected.clone()
    for gid in set(index):
        rows = [i for i, g in enumerate(index) if g == gid]
        singleton = len(rows) == 1
        constant = len(rows) > 1 and bool((scores[rows] == scores[rows[0]]).all())
        if group_only and (singleton or constant):
            expected[rows] = 0.0
    return expected


def check_verl_advantages(case: dict, shared: dict) -> None:
    inputs = {**shared, **case.get("inputs", {})}
    params = case.get("params", {})
    function = case["function"]
    require_known_params(params, ADVANTAGE_PARAMS.get(function, ()) + ADVANTAGE_INPUT_KEYS,
                         ADVANTAGE_IGNORED.get(function, {}), function)
    rewards, mask, index = t(inputs["token_level_rewards"]), t(inputs["response_mask"]), list(inputs["index"])
    if "response_mask_override" in params:
        mask = t(params["response_mask_override"])
    if "rows_kept" in params:
        keep = params["rows_kept"]
        rewards, mask, index = rewards[keep], mask[keep], [index[i] for i in keep]
    fn, knobs, group_only = _advantage_call(case["function"], params)
    inp = A.AdvantageInputs(token_rewards=rewards, mask=mask, group_ids=index)
    if "error" in case["outputs"]:
        with pytest.raises(ValueError):
            fn(inp, **knobs)
        return
    out = fn(inp, **knobs)
    scores = rewards.sum(-1)
    for field in ("advantages", "returns"):
        expected = _apply_group_rules(t(case["outputs"][field]), scores, index, group_only)
        close(getattr(out, field), expected, what=field)


# ---------------------------------------------------------------- policy losses (verl)


def _loss_inputs(inputs: dict) -> A.LossInputs:
    return A.LossInputs(
        logp=t(inputs["log_prob"]).requires_grad_(True),
        old_logp=t(inputs["old_log_prob"]),
        adv=t(inputs["advantages"]),
        mask=t(inputs["response_mask"]),
    )


# verl's agg_loss(..., **config.global_batch_info) key -> rlvrlab's Aggregation field. verl's ppo_loss fills all
# four (loss_scale_factor from actor.loss_scale_factor: the constant L of seq-mean-token-sum-norm, default the
# padded width; verl's agg_loss in core_algos.py, docs/references.md). None of the shipped cases sets loss_scale_factor;
# test_loss_scale_factor_maps_to_the_aggregation pins the mapping on a case derived from a shipped one.
GLOBAL_BATCH_INFO = {
    "batch_num_tokens": "num_tokens",
    "global_batch_size": "num_seqs",
    "dp_size": "dp_size",
    "loss_scale_factor": "loss_scale_factor",
}


def _aggregation(mode: str, params: dict) -> A.Aggregation:
    info = params.get("global_batch_info") or {}
    require_known_params(info, GLOBAL_BATCH_INFO, {}, "global_batch_info")
    return A.Aggregation(mode=mode, **{GLOBAL_BATCH_INFO[key]: value for key, value in info.items()})


def _bounds(params: dict) -> tuple[float, float]:
    base = params.get("clip_ratio", 0.2)
    low, high = params.get("clip_ratio_low"), params.get("clip_ratio_high")
    return (base if low is None else low), (base if high is None else high)


# verl metric name -> how rlvrlab's typed LossStats expresses it, per verl loss
_CLIP_STATS: dict[str, Callable[[A.LossStats], float]] = {
    "actor/pg_clipfrac": lambda s: s.clip_frac,
    "actor/ppo_kl": lambda s: s.approx_kl,
    "actor/pg_clipfrac_lower": lambda s: s.dual_clip_frac,
}
STAT_NAMES: dict[str, dict[str, Callable[[A.LossStats], float]]] = {
    "vanilla": _CLIP_STATS,
    "gspo": _CLIP_STATS,
    "cispo": _CLIP_STATS,
    "sapo": _CLIP_STATS,
    "geo_mean": {
        "actor/pg_clipfrac": lambda s: s.clip_frac_upper,
        "actor/ppo_kl": lambda s: s.approx_kl,
        "actor/pg_clipfrac_lower": lambda s: s.clip_frac_lower,
    },
    "dppo": {
        "actor/pg_clipfrac": lambda s: s.masked_frac,
        "actor/ppo_kl": lambda s: s.approx_kl,
        "actor/pg_clipfrac_lower": lambda s: s.dual_clip_frac,
    },
    "dro": {"actor/ppo_kl": lambda s: s.approx_kl},
    "gpg": {},
}


_BOUNDS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high")  # -> eps_low, eps_high (_bounds)
_ONE_CONFIG = "the file's generator passes one actor config to every loss"
# verl loss -> the params keys its rlvrlab counterpart takes (see _loss_call and _check_loss).
LOSS_PARAMS: dict[str, tuple[str, ...]] = {
    "vanilla": (*_BOUNDS, "clip_ratio_c", "loss_agg_mode", "global_batch_info"),
    "gspo": (*_BOUNDS, "global_batch_info"),
    "sapo": ("tau_pos", "tau_neg", "global_batch_info"),
    "cispo": (*_BOUNDS, "loss_agg_mode", "global_batch_info"),
    "geo_mean": (*_BOUNDS, "loss_agg_mode"),
    "gpg": ("loss_agg_mode", "global_batch_info"),
    "dppo_tv": (*_BOUNDS, "clip_ratio_c", "loss_agg_mode", "global_batch_info"),
    "dppo_kl": (*_BOUNDS, "clip_ratio_c", "loss_agg_mode", "global_batch_info"),
    "dro": ("dro_beta", "loss_agg_mode", "global_batch_info"),
}
_FORCED_AGG = "verl aggregates this loss with seq-mean-token-mean whatever the mode says; so does the harness"
# verl loss -> params key -> why it does not apply to the rlvrlab counterpart.
LOSS_IGNORED: dict[str, dict[str, str]] = {
    "gspo": {"loss_agg_mode_arg": _FORCED_AGG, "loss_agg_mode": _FORCED_AGG},
    "sapo": {"loss_agg_mode": _FORCED_AGG, "clip_ratio_low": f"sapo has no ratio bounds; {_ONE_CONFIG}",
             "clip_ratio_high": f"sapo has no ratio bounds; {_ONE_CONFIG}",
             "clip_ratio_c": f"sapo has no dual clip; {_ONE_CONFIG}", "dro_beta": f"a DRO knob; {_ONE_CONFIG}"},
    "cispo": {"clip_ratio_c": f"cispo has no dual clip; {_ONE_CONFIG}", "tau_pos": f"a SAPO knob; {_ONE_CONFIG}",
              "tau_neg": f"a SAPO knob; {_ONE_CONFIG}", "dro_beta": f"a DRO knob; {_ONE_CONFIG}"},
    "geo_mean": {"global_batch_info": "verl's GMPO takes a plain mean over the local rows and ignores it",
                 "clip_ratio_c": f"gmpo has no dual clip; {_ONE_CONFIG}", "tau_pos": f"a SAPO knob; {_ONE_CONFIG}",
                 "tau_neg": f"a SAPO knob; {_ONE_CONFIG}", "dro_beta": f"a DRO knob; {_ONE_CONFIG}"},
    "gpg": {key: f"plain policy gradient: no ratio, bounds or penalty; {_ONE_CONFIG}"
            for key in (*_BOUNDS, "clip_ratio_c", "tau_pos", "tau_neg", "dro_beta")},
    "dppo_tv": {"tau_pos": f"a SAPO knob; {_ONE_CONFIG}", "tau_neg": f"a SAPO knob; {_ONE_CONFIG}",
                "dro_beta": f"a DRO knob; {_ONE_CONFIG}"},
    "dppo_kl": {"tau_pos": f"a SAPO knob; {_ONE_CONFIG}", "tau_neg": f"a SAPO knob; {_ONE_CONFIG}",
                "dro_beta": f"a DRO knob; {_ONE_CONFIG}"},
    "dro": {key: f"DRO has no ratio bounds or gate; {_ONE_CONFIG}"
            for key in (*_BOUNDS, "clip_ratio_c", "tau_pos", "tau_neg")},
}


def _loss_call(verl_name: str, params: dict) -> tuple[Callable, dict, str, str]:
    """verl loss + params -> (rlvrlab loss, knobs, aggregation mode, stat-name table)."""
    low, high = _bounds(params)
    mode = params.get("loss_agg_mode", params.get("loss_agg_mode_arg", "token-mean"))
    c = params.get("clip_ratio_c", 3.0)
    table = {
        "vanilla": (loss_fns.clip_loss, {"eps_low": low, "eps_high": high, "dual_clip_c": c}, mode, "vanilla"),
        # verl aggregates GSPO and SAPO with seq-mean-token-mean whatever loss_agg_mode says
        "gspo": (loss_fns.gspo_loss, {"eps_low": low, "eps_high": high}, "seq-mean-token-mean", "gspo"),
        "sapo": (
            loss_fns.sapo_loss,
            {"sapo_tau_pos": params.get("tau_pos", 1.0), "sapo_tau_neg": params.get("tau_neg", 1.05)},
            "seq-mean-token-mean",
            "sapo",
        ),
        "cispo": (loss_fns.cispo_loss, {"eps_low": low, "eps_high": high}, mode, "cispo"),
        "geo_mean": (loss_fns.gmpo_loss, {"eps_low": low, "eps_high": high}, mode, "geo_mean"),
        "gpg": (loss_fns.pg_loss, {}, mode, "gpg"),
        "dppo_tv": (loss_fns.dppo_tv_loss, {"eps_low": low, "eps_high": high, "dppo_c": c}, mode, "dppo"),
        "dppo_kl": (loss_fns.dppo_kl_loss, {"eps_low": low, "eps_high": high, "dppo_c": c}, mode, "dppo"),
        "dro": (loss_fns.dro_loss, {"dro_beta": params.get("dro_beta")}, mode, "dro"),
    }
    assert verl_name in table, f"no rlvrlab mapping for verl loss {verl_name!r}"
    return table[verl_name]


def _check_loss(case: dict, shared: dict, verl_name: str) -> None:
    inputs = {**shared, **case.get("inputs", {})}
    params = case.get("params", {})
    assert verl_name in LOSS_PARAMS, f"no rlvrlab mapping for verl loss {verl_name!r}"
    require_known_params(params, LOSS_PARAMS[verl_name], LOSS_IGNORED.get(verl_name, {}), f"verl loss {verl_name}")
    fn, knobs, mode, stat_table = _loss_call(verl_name, params)
    x = _loss_inputs(inputs)
    # verl's GMPO takes a plain mean over the local rows and ignores global_batch_info
    agg = A.Aggregation(mode) if verl_name == "geo_mean" else _aggregation(mode, params)
    expected = case["outputs"]
    if "error" in expected:  # verl refused these parameters (e.g. clip_ratio_c <= 1); so must rlvrlab
        with pytest.raises((ValueError, KeyError)):
            fn(x, agg, **knobs)
        return
    out = fn(x, agg, **knobs)
    (grad,) = torch.autograd.grad(out.loss, x.logp)
    close(out.loss, expected["pg_loss"], what="pg_loss")
    close(grad, expected["grad_wrt_log_prob"], what="grad_wrt_log_prob")
    for name, value in expected.get("metrics", {}).items():
        assert name in STAT_NAMES[stat_table], f"metric {name} has no rlvrlab counterpart"
        close(STAT_NAMES[stat_table][name](out.stats), value, what=name)


def check_vanilla(case: dict, shared: dict) -> None:
    _check_loss(case, shared, "vanilla")


def check_gspo(case: dict, shared: dict) -> None:
    _check_loss(case, shared, "gspo")


def check_other_loss(case: dict, shared: dict) -> None:
    name = case["function"].removeprefix("compute_policy_loss_")
    _check_loss(case, shared, name)


def check_up_dapo(case: dict, shared: dict) -> None:
    params = case["params"]
    require_known_params(params, ("eps_low", "eps_high", "dual_clip_c", "loss_agg_mode"), {}, "UP-DAPO")
    knobs = {"eps_low": params["eps_low"], "eps_high": params["eps_high"], "dual_clip_c": params["dual_clip_c"]}
    agg = A.Aggregation(mode=params["loss_agg_mode"])
    x = _loss_inputs({**shared, **case.get("inputs", {})})
    up = A.with_unbounded_positive(loss_fns.clip_loss)(x, agg, **knobs)
    (grad,) = torch.autograd.grad(up.loss, x.logp)
    expected = case["outputs"]
    close(up.loss, expected["loss"], what="loss")
    close(grad, expected["grad_wrt_log_prob"], what="grad_wrt_log_prob")
    valid = x.mask.bool()
    close(up.per_token.detach()[valid], t(expected["per_token_loss"])[valid], what="per_token_loss")
    dapo = loss_fns.clip_loss(x, agg, **knobs)
    (dapo_grad,) = torch.autograd.grad(dapo.loss, x.logp)
    close(dapo_grad, expected["dapo_grad_wrt_log_prob_for_comparison"], what="dapo grad")


# ---------------------------------------------------------------- KL and entropy (verl)


def check_kl(case: dict, shared: dict) -> None:
    inputs = {**shared, **case.get("inputs", {})}
    require_known_params(case["params"], ("kl_penalty",), {}, "verl kl_penalty")
    name = case["params"]["kl_penalty"]
    if "error" in case["outputs"]:  # e.g. verl's "full" raises NotImplementedError; rlvrlab has no such name
        assert name not in A.KL_ESTIMATORS
        return
    logp = t(inputs["logprob"]).requires_grad_(True)
    ref, mask = t(inputs["ref_logprob"]), t(inputs["response_mask"])
    per_token = A.KL_ESTIMATORS[name](logp, ref)
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    close(per_token, case["outputs"]["per_token"], what="per_token")
    close(grad, case["outputs"]["grad_of_sum_wrt_logprob"], what="grad")
    for mode, value in case["outputs"]["agg_loss"].items():
        close(A.Aggregation(mode=mode)(per_token, mask), value, what=f"agg {mode}")


def check_entropy(case: dict, shared: dict) -> None:
    inputs = {**shared, **case.get("inputs", {})}
    entropy = A.entropy_from_logits(t(inputs["logits"]))
    close(entropy, case["outputs"]["token_entropy"], what="token_entropy")
    mask = t(inputs["response_mask"])
    for mode, value in case["outputs"]["entropy_loss"].items():
        close(A.Aggregation(mode=mode)(entropy, mask), value, what=f"entropy {mode}")


# ---------------------------------------------------------------- UCPO repo


def _ucpo_inputs(case: dict, dtype: torch.dtype) -> A.AdvantageInputs:
    inputs = case["inputs"]
    return A.AdvantageInputs(
        token_rewards=t(inputs["token_level_rewards"], dtype),
        mask=t(inputs["response_mask"], dtype),
        group_ids=list(inputs["index"]),
        old_logp=t(inputs["old_log_prob"], dtype),
    )


def _check_correct_set_stats(inp: A.AdvantageInputs, expected: dict) -> None:
    stats = A.correct_set_stats(inp)
    pairs = {
        "Hq_correct": stats.correct_entropy,
        "mc_correct": stats.correct_max_q,
        "Hq_incorrect": stats.incorrect_entropy,
    }
    for key, actual in pairs.items():
        close(actual, expected.get(key, []), rtol=0, what=key)
    # the repo lists counts for groups with >= 1 member in its GRPO logs, >= 2 in iq; rlvrlab keeps >= 2
    close(stats.num_correct, [n for n in expected.get("num_correct", []) if n >= 2], what="num_correct")
    close(stats.num_incorrect, [n for n in expected.get("num_incorrect", []) if n >= 2], what="num_incorrect")


def check_ucpo_iq(case: dict, shared: dict) -> None:
    knobs = {"tau": case["tau"], "alpha": case["alpha"], "adv_eps": case["epsilon"]}
    for dtype, suffix, atol, rtol in ((torch.float64, "float64", 1e-6, 0.0), (torch.float32, "float32", 1e-6, 1e-5)):
        inp = _ucpo_inputs(case, dtype)
        out = adv_fns.ucpo(inp, **knobs)
        assert out.advantages.dtype == dtype
        close(out.advantages, case["outputs"][f"advantages_{suffix}"], atol=atol, rtol=rtol, what=suffix)
        close(out.advantages[:, 0], case["outputs"][f"per_seq_advantage_{suffix}"], atol=atol, rtol=rtol)
    inp = _ucpo_inputs(case, torch.float64)
    stats = case["outputs"]["stats_float64"]
    _check_correct_set_stats(inp, stats)
    mask = inp.mask
    first = mask.argmax(dim=-1)  # a valid position per row (every row here is non-empty)

    def per_seq(x: torch.Tensor) -> torch.Tensor:
        return x.gather(1, first.unsqueeze(1)).squeeze(1)

    if "adv_original_mean" in stats:
        base = per_seq(adv_fns.grpo(inp, adv_eps=case["epsilon"]).advantages).abs().mean()
        close(base, stats["adv_original_mean"][0], rtol=0, what="adv_original_mean")
    if "adv_modified_mean" in stats:
        modified = per_seq(adv_fns.ucpo(inp, **knobs).advantages).abs().mean()
        close(modified, stats["adv_modified_mean"][0], rtol=0, what="adv_modified_mean")


def check_ucpo_repo_grpo(case: dict, shared: dict) -> None:
    norm = case["norm_adv_by_std_in_grpo"]
    for dtype, suffix, rtol in ((torch.float64, "float64", 0.0), (torch.float32, "float32", 1e-5)):
        inp = _ucpo_inputs(case, dtype)
        out = adv_fns.grpo(inp, adv_eps=case["epsilon"]) if norm else adv_fns.dr_grpo(inp)
        scores = inp.token_rewards.sum(-1)
        expected = _apply_group_rules(
            t(case["outputs"][f"advantages_{suffix}"], torch.float64), scores, inp.group_ids, True
        )
        close(out.advantages, expected, rtol=rtol, what=suffix)
    _check_correct_set_stats(_ucpo_inputs(case, torch.float64), case["outputs"]["diagnostics_float64"])


# ---------------------------------------------------------------- verifier (UCPO repo's math-verify scoring)


def check_ucpo_verifier(case: dict, shared: dict) -> None:
    """The probe in both argument orders, parsed with math-verify's defaults as the repo does: the repo's
    ``verify(parsed response, parsed truth)`` must give ``ucpo_score``; rlvrlab's documented order
    ``verify(parsed truth, parsed response)`` must give ``score_if_verify_called_gold_first``. The two differ
    only on relations against intervals (case ineq_pred_interval_gt; see rlvrlab/rewards/math.py), and rlvrlab
    trains with the documented order (tests/rewards/test_rewards.py runs the probe through the pool as well)."""
    from rlvrlab.rewards import math as math_verifier

    response, truth = case["response"], case["ground_truth"]
    assert [str(x) for x in math_verifier.parse_response(response, "mathverify")] == case["parsed_response"]
    assert [str(x) for x in math_verifier.parse_truth(truth, "mathverify")] == case["parsed_ground_truth"]
    assert math_verifier.check_ucpo_order(response, truth, "mathverify").score == case["ucpo_score"]
    assert math_verifier.check(response, truth, "mathverify").score == case["score_if_verify_called_gold_first"]


# ---------------------------------------------------------------- DAPO's rollout side and the mismatch correction (verl)


def check_dapo_overlong(case: dict, shared: dict) -> None:
    """verl's DAPORewardManager with the overlong buffer on: the penalty, the shaped reward, the overlong flag."""
    require_known_params(case["params"], ("max_resp_len", "overlong_buffer_len", "overlong_penalty_factor"), {},
                         "verl_dapo_overlong.json")
    p, x, out = case["params"], case["inputs"], case["outputs"]
    penalty = shaping.overlong_penalty(torch.tensor(x["response_lengths"]), max_len=p["max_resp_len"],
                                       buffer_len=p["overlong_buffer_len"], factor=p["overlong_penalty_factor"])
    rewards = torch.tensor(x["scores"], dtype=torch.float32) + penalty
    close(penalty, t(out["overlong_reward"], torch.float32), rtol=0, what="overlong_reward")
    close(rewards, t(out["rewards"], torch.float32), rtol=0, what="rewards")
    assert (penalty < 0).tolist() == out["overlong"]


# verl's metric -> the dtype its values have there: "acc" is a float64 numpy array of the scores; the sequence
# rewards come from a float32 tensor (equal-looking values can differ in float64 and not in float32)
FILTER_DTYPES = {"acc": np.float64, "seq_final_reward": np.float32, "seq_reward": np.float32}


def check_dapo_filter(case: dict, shared: dict) -> None:
    """The DAPO recipe's group filter (RayDAPOTrainer.fit): kept groups in first-appearance order."""
    require_known_params(case["params"], ("metric",), {}, "verl_dapo_filter.json")
    values = np.asarray(case["inputs"]["metric_values"], dtype=FILTER_DTYPES[case["params"]["metric"]])
    uids = case["inputs"]["uids"]
    kept = shaping.groups_with_signal(uids, values)
    assert kept == case["outputs"]["kept_uids"]
    assert [i for i, u in enumerate(uids) if u in set(kept)] == case["outputs"]["kept_indices"]


def check_rollout_correction(case: dict, shared: dict) -> None:
    """verl's compute_rollout_correction_weights (truncated IS, token or sequence level, optional batch
    normalisation): the weights and every IS metric it returns (before normalisation)."""
    require_known_params(case["params"], ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize"), {},
                         "verl_rollout_correction.json")
    p, x = case["params"], case["inputs"]
    weights, metrics = shaping.rollout_correction_weights(
        t(x["log_ratio"], torch.float32), t(x["response_mask"], torch.float32), level=p["rollout_is"],
        cap=p["rollout_is_threshold"], normalize=p["rollout_is_batch_normalize"])
    close(weights, t(case["outputs"]["weights"], torch.float32), rtol=1e-6, what="weights")
    assert not weights.requires_grad
    _same_metrics(metrics, case["outputs"]["metrics"])


def _same_metrics(actual: Mapping[str, float], expected: Mapping[str, float], prefix: str = "") -> None:
    """The same metric names as verl's (after its prefix), each within atol 1e-6 or rtol 1e-6 (some are exp(20) or
    exp(40), from the +-20 clamp)."""
    expected = {name.removeprefix(prefix): value for name, value in expected.items()}
    assert set(actual) == set(expected), f"missing {sorted(set(expected) - set(actual))}, " \
                                         f"extra {sorted(set(actual) - set(expected))}"
    for name, value in expected.items():
        assert math.isclose(actual[name], value, rel_tol=1e-6, abs_tol=1e-6), (name, actual[name], value)


def _is_threshold(spec: float | str) -> tuple[float, float | None]:
    """verl's rollout_is_threshold -> (algorithm.tis_cap, algorithm.tis_lower): one number truncates (TIS) at it;
    "lower_upper" masks (IcePop) outside [lower, upper]."""
    if isinstance(spec, str) and "_" in spec:
        lower, upper = spec.split("_", 1)
        return float(upper), float(lower)
    return float(spec), None


def check_rollout_corr_rejection(case: dict, shared: dict) -> None:
    """verl's compute_rollout_correction_and_rejection_mask: IS weights (token or sequence level, truncated or
    IcePop-masked, optionally normalised), the response mask after the rejection options (chained), and every
    metric (IS, rejection per option and together, off-policy), with verl's names after its rollout_corr/ prefix."""
    require_known_params(case["params"], ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize",
                                           "rollout_rs", "rollout_rs_threshold"), {},
                         "verl_rollout_corr_rejection.json")
    p, x, out = case["params"], shared[case["inputs"]["input_set"]], case["outputs"]
    cap, lower = _is_threshold(p["rollout_is_threshold"])
    rejection = shaping.parse_rejection(p["rollout_rs"], p["rollout_rs_threshold"]) if p["rollout_rs"] else ()
    mask = torch.tensor(x["response_mask"])  # int64, as verl's
    got = shaping.rollout_correction(t(x["old_log_prob"]), t(x["rollout_log_prob"]), mask, level=p["rollout_is"],
                                     cap=cap, lower=lower, normalize=p["rollout_is_batch_normalize"],
                                     rejection=rejection)
    assert got.mask.dtype == mask.dtype and got.mask.tolist() == out["modified_response_mask"]
    if out["rollout_is_weights"] is None:
        assert got.weights is None
    else:
        assert got.weights is not None and not got.weights.requires_grad
        close(got.weights, out["rollout_is_weights"], rtol=1e-6, what="weights")
    _same_metrics(got.metrics, out["metrics"], prefix="rollout_corr/")
    # the same with a float mask (the trainer's): the same weights, mask values and metrics
    float_mask = shaping.rollout_correction(t(x["old_log_prob"]), t(x["rollout_log_prob"]), mask.float(),
                                            level=p["rollout_is"], cap=cap, lower=lower,
                                            normalize=p["rollout_is_batch_normalize"], rejection=rejection)
    assert float_mask.mask.tolist() == out["modified_response_mask"]
    _same_metrics(float_mask.metrics, out["metrics"], prefix="rollout_corr/")


def check_rs_threshold_spec(case: dict, shared: dict) -> None:
    """verl's reading of rollout_rs / rollout_rs_threshold: the options kept in order with their bounds, or a
    refusal (rlvrlab raises ValueError wherever verl raises anything; its ZeroDivisionError for k1's "0" too)."""
    require_known_params(case["params"], ("rollout_rs", "rollout_rs_threshold"), {}, "verl_rollout_rs_thresholds.json")
    p, out = case["params"], case["outputs"]
    if "raises" in out:
        with pytest.raises(ValueError):
            shaping.parse_rejection(p["rollout_rs"], p["rollout_rs_threshold"])
        return
    criteria = shaping.parse_rejection(p["rollout_rs"], p["rollout_rs_threshold"])
    assert [c.option for c in criteria] == out["options"]
    assert {c.option: {"lower": c.lower, "upper": c.upper} for c in criteria} == out["thresholds"]


CHECKS: dict[str, Callable[[dict, dict], None]] = {
    "verl_dapo_overlong.json": check_dapo_overlong,
    "verl_dapo_filter.json": check_dapo_filter,
    "verl_rollout_correction.json": check_rollout_correction,
    "verl_rollout_corr_rejection.json": check_rollout_corr_rejection,
    "verl_rollout_rs_thresholds.json": check_rs_threshold_spec,
    "verl_advantages.json": check_verl_advantages,
    "verl_policy_loss_vanilla.json": check_vanilla,
    "verl_policy_loss_gspo.json": check_gspo,
    "verl_policy_loss_other.json": check_other_loss,
    "verl_kl.json": check_kl,
    "verl_entropy.json": check_entropy,
    "up_dapo_grads.json": check_up_dapo,
    "ucpo_iq_vectors.json": check_ucpo_iq,
    "ucpo_repo_grpo_vectors.json": check_ucpo_repo_grpo,
    VERIFIER_FILE: check_ucpo_verifier,
}


def _cases() -> list:
    params = []
    for folder in _dirs():
        tag = "shipped" if folder == SHIPPED else "extra"
        for path in sorted(folder.glob("*.json")):
            if path.name == LEGACY_FILE:
                continue
            data = json.loads(path.read_text())
            for i, case in enumerate(data["cases"]):
                case_id = f"{tag}/{path.stem}/{case.get('name', i)}"
                params.append(pytest.param(path.name, case, data.get("shared_inputs", {}), id=case_id))
    return params


# Files whose cases carry their settings as top-level fields (UCPO's tau, alpha, epsilon) or none: a params key
# there would be read by nothing.
PARAMLESS = ("verl_entropy.json", "ucpo_iq_vectors.json", "ucpo_repo_grpo_vectors.json", VERIFIER_FILE)


@pytest.mark.parametrize(("file_name", "case", "shared"), _cases())
def test_reference_case(file_name: str, case: dict, shared: dict) -> None:
    assert file_name in CHECKS, f"unknown vector file {file_name}; expected one of {sorted(CHECKS)}"
    if file_name in PARAMLESS:
        require_known_params(case.get("params", {}), (), {}, file_name)
    CHECKS[file_name](case, shared)


def _extra_cases(folder: Path, monkeypatch: pytest.MonkeyPatch, file_name: str, cases: list[dict],
                 shared: dict) -> list:
    (folder / file_name).write_text(json.dumps({"cases": cases, "shared_inputs": shared}))
    monkeypatch.setenv("RLVRLAB_VECTORS_DIR", str(folder))
    return [p.values for p in _cases() if p.id.startswith("extra/")]


@pytest.mark.parametrize(
    ("file_name", "where", "key"),
    [("verl_policy_loss_vanilla.json", "params", "clip_ratio_dual"),
     ("verl_policy_loss_vanilla.json", "global_batch_info", "micro_batch_size"),
     ("verl_advantages.json", "params", "gamma"),  # a knob of REINFORCE++, not of GRPO
     ("verl_kl.json", "params", "kl_coef"),
     ("ucpo_iq_vectors.json", "params", "tau")],
)
def test_a_case_with_an_unknown_params_key_fails_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          file_name: str, where: str, key: str) -> None:
    """A shipped case plus one key nothing maps, run from RLVRLAB_VECTORS_DIR: the case fails and names the key."""
    data = json.loads((SHIPPED / file_name).read_text())
    case = json.loads(json.dumps(data["cases"][0]))
    params = case.setdefault("params", {})
    (params.setdefault("global_batch_info", {}) if where == "global_batch_info" else params)[key] = 1.0
    ((name, extra, shared),) = _extra_cases(tmp_path, monkeypatch, file_name, [case], data.get("shared_inputs", {}))
    test_reference_case(name, data["cases"][0], shared)  # the shipped case itself passes
    with pytest.raises(pytest.fail.Exception, match=f"params key '{key}' is neither mapped"):
        test_reference_case(name, extra, shared)


def test_every_ignored_key_has_a_reason() -> None:
    for table in (*ADVANTAGE_IGNORED.values(), *LOSS_IGNORED.values()):
        assert all(isinstance(reason, str) and len(reason) > 20 for reason in table.values()), table
    for verl_name, ignored in LOSS_IGNORED.items():  # never both mapped and ignored
        assert not set(ignored) & set(LOSS_PARAMS[verl_name]), verl_name


@pytest.mark.parametrize("scale", [3.0, 12.0])
def test_loss_scale_factor_maps_to_the_aggregation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   scale: float) -> None:
    """verl's seq-mean-token-sum-norm divides by global_batch_info.loss_scale_factor instead of the padded width
    T (verl's agg_loss, docs/references.md): the shipped case's loss and gradient times T / scale, its metrics unchanged."""
    data = json.loads((SHIPPED / "verl_policy_loss_vanilla.json").read_text())
    shipped = next(c for c in data["cases"] if c["params"]["loss_agg_mode"] == "seq-mean-token-sum-norm")
    width = len(data["shared_inputs"]["response_mask"][0])
    case = json.loads(json.dumps(shipped))
    case["params"]["global_batch_info"] = {"loss_scale_factor": scale}
    case["outputs"]["pg_loss"] *= width / scale
    case["outputs"]["grad_wrt_log_prob"] = (t(case["outputs"]["grad_wrt_log_prob"]) * width / scale).tolist()
    ((name, extra, shared),) = _extra_cases(tmp_path, monkeypatch, "verl_policy_loss_vanilla.json", [case],
                                            data["shared_inputs"])
    test_reference_case(name, extra, shared)
    assert _aggregation("token-mean", case["params"]).loss_scale_factor == scale


def test_every_shipped_file_and_case_is_checked() -> None:
    shipped = {p.name for p in SHIPPED.glob("*.json")}
    assert shipped == set(CHECKS)
    num_cases = sum(len(json.loads((SHIPPED / name).read_text())["cases"]) for name in shipped)
    # 69 loss/advantage cases, 16 verifier probes, 11 + 12 + 13 DAPO shaping, filter and rollout-correction cases,
    # 40 rollout-correction-and-rejection cases and 28 rejection threshold specs
    assert sum(1 for p in _cases() if p.id.startswith("shipped/")) == num_cases == 69 + 16 + 11 + 12 + 13 + 40 + 28


def test_every_rejection_option_is_verls_and_checked_against_it() -> None:
    """The registry of rejection options is verl's list, and every option runs in a shipped case, alone and in a
    chain; every metric name verl returned is one the trainer can log (correction_metric_names), and every such
    name occurs in some case."""
    data = json.loads((SHIPPED / "verl_rollout_corr_rejection.json").read_text())
    assert sorted(shaping.REJECTION_OPTIONS) == data["source"]["supported_rollout_rs_options"]
    assert shaping.SAFETY_BOUND == data["source"]["safety_bound"]
    chains = [[o.strip() for o in c["params"]["rollout_rs"].split(",") if o.strip()]
              for c in data["cases"] if c["params"]["rollout_rs"]]
    assert {o for chain in chains if len(chain) == 1 for o in chain} == set(shaping.REJECTION_OPTIONS)
    assert any(len(set(chain)) >= 4 for chain in chains)
    logged = {name.removeprefix("rollout_corr/") for c in data["cases"] for name in c["outputs"]["metrics"]}
    assert logged == set(shaping.correction_metric_names())


def test_deviation_rules_change_only_documented_values() -> None:
    """The rules touch exactly the fp32 all-equal group and the singleton rows of the shipped verl file."""
    data = json.loads((SHIPPED / "verl_advantages.json").read_text())
    shared = data["shared_inputs"]
    index, scores = shared["index"], t(shared["scores"])
    ref = t(data["cases"][0]["outputs"]["advantages"])  # grpo_std_norm
    changed = (_apply_group_rules(ref, scores, index, True) != ref).any(dim=-1)
    assert torch.nonzero(changed).flatten().tolist() == [3]  # the singleton group "c"
    edge = next(c for c in data["cases"] if c["name"].startswith("fp32_all_equal_edge_compute_grpo_outcome_advantage_normTrue"))
    edge_ref = t(edge["outputs"]["advantages"])
    assert math.isclose(float(edge_ref[0, 2]), 0.056, abs_tol=1e-3)  # verl's artefact
    out = adv_fns.grpo(
        A.AdvantageInputs(t(edge["inputs"]["token_level_rewards"]), t(edge["inputs"]["response_mask"]), edge["inputs"]["index"]),
        adv_eps=1e-6,
    )
    assert bool((out.advantages == 0).all())  # rlvrlab: exactly 0
