"""rlvrlab's algorithm library against outputs of verl's and the UCPO repo's own functions.

Runs every case of tests/vectors/*.json and, when RLVRLAB_VECTORS_DIR is set, every case of the files of
the same names in that folder. Cases are dispatched by their ``function``/``params`` fields, never by
case name, so new cases of the same schema run unchanged. Tolerance: atol 1e-6, rtol 1e-5 (the files'
``tolerance_hint``); float64 UCPO outputs at atol 1e-6, rtol 0.

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
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rlvrlab import algorithms as A
from rlvrlab.algorithms import advantages as adv_fns
from rlvrlab.algorithms import losses as loss_fns

SHIPPED = Path(__file__).parent / "vectors"
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


# ---------------------------------------------------------------- advantages (verl)


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


def _aggregation(mode: str, params: dict) -> A.Aggregation:
    info = params.get("global_batch_info") or {}
    return A.Aggregation(
        mode=mode,
        num_tokens=info.get("batch_num_tokens"),
        num_seqs=info.get("global_batch_size"),
        dp_size=info.get("dp_size", 1),
    )


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
    trains with the documented order (tests/test_rewards.py runs the probe through the pool as well)."""
    from rlvrlab.rewards import math as math_verifier

    response, truth = case["response"], case["ground_truth"]
    assert [str(x) for x in math_verifier.parse_response(response, "mathverify")] == case["parsed_response"]
    assert [str(x) for x in math_verifier.parse_truth(truth, "mathverify")] == case["parsed_ground_truth"]
    assert math_verifier.check_ucpo_order(response, truth, "mathverify").score == case["ucpo_score"]
    assert math_verifier.check(response, truth, "mathverify").score == case["score_if_verify_called_gold_first"]


CHECKS: dict[str, Callable[[dict, dict], None]] = {
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


@pytest.mark.parametrize(("file_name", "case", "shared"), _cases())
def test_reference_case(file_name: str, case: dict, shared: dict) -> None:
    assert file_name in CHECKS, f"unknown vector file {file_name}; expected one of {sorted(CHECKS)}"
    CHECKS[file_name](case, shared)


def test_every_shipped_file_and_case_is_checked() -> None:
    shipped = {p.name for p in SHIPPED.glob("*.json")}
    assert shipped == set(CHECKS)
    num_cases = sum(len(json.loads((SHIPPED / name).read_text())["cases"]) for name in shipped)
    assert sum(1 for p in _cases() if p.id.startswith("shipped/")) == num_cases == 69 + 16  # + 16 verifier probes


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
