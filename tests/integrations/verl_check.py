"""Run in verl's environment (.venv-verl) by tests/integrations/test_verl.py: verl's registries after `import verl`
alone (rlvrlab's entry point), UCPO and UP called through verl's getters against rlvrlab's own functions on the same
random inputs, verl's GRPO against rlvrlab's, and verl's MLflow logger writing metric names into a run given by
MLFLOW_TRACKING_URI / MLFLOW_RUN_ID. Prints one line `VERL_CHECK_RESULT {json}`; the test judges the numbers."""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

MARKER = "VERL_CHECK_RESULT "


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def batch(seed: int, groups: int = 6, size: int = 4, width: int = 7, binary: bool = True) -> dict:
    """Rows of `groups` prompts x `size` responses in shuffled order; outcome reward on each last token; right padding;
    binary rewards with one all-correct and one all-wrong group (or uniform ones)."""
    g = torch.Generator().manual_seed(seed)
    b = groups * size
    order = torch.randperm(b, generator=g)
    uid = np.array([f"prompt-{i // size}" for i in order.tolist()], dtype=object)
    lengths = torch.randint(1, width + 1, (b,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    if binary:
        score = (torch.rand(b, generator=g) < 0.5).float()
        group_of = order // size
        score[group_of == 0] = 1.0
        score[group_of == 1] = 0.0
    else:
        score = torch.rand(b, generator=g)
    rewards = torch.zeros(b, width)
    rewards[torch.arange(b), lengths - 1] = score
    old = -torch.rand(b, width, generator=g) * 3.0 * mask
    return {"uid": uid, "mask": mask, "rewards": rewards, "old_log_probs": old}


def check_estimators(out: dict) -> None:
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import core_algos, ray_trainer

    from rlvrlab.algorithms import ADVANTAGES, AdvantageInputs

    knobs = {"ucpo_tau": 0.5, "ucpo_alpha": 0.3, "ucpo_epsilon": 1e-6}
    config = OmegaConf.create({"adv_estimator": "ucpo", **knobs})
    ucpo, grpo = core_algos.get_adv_estimator_fn("ucpo"), core_algos.get_adv_estimator_fn("grpo")
    diffs: dict[str, float] = {"ucpo": 0.0, "ucpo_trainer": 0.0, "ucpo_returns": 0.0, "grpo_binary": 0.0,
                               "grpo_uniform": 0.0}
    nonzero = 0
    for seed in range(5):
        x = batch(seed)
        inputs = AdvantageInputs(token_rewards=x["rewards"], mask=x["mask"], group_ids=x["uid"].tolist(),
                                 old_logp=x["old_log_probs"])
        own = ADVANTAGES["ucpo"].fn(inputs, tau=0.5, alpha=0.3, adv_eps=1e-6)
        adv, ret = ucpo(token_level_rewards=x["rewards"], response_mask=x["mask"], index=x["uid"], config=config,
                        old_log_probs=x["old_log_probs"])
        diffs["ucpo"] = max(diffs["ucpo"], max_diff(adv, own.advantages))
        diffs["ucpo_returns"] = max(diffs["ucpo_returns"], max_diff(ret, own.returns))
        nonzero += int((own.advantages != 0).sum())
        # verl's own trainer step: compute_advantage on a DataProto, as RayPPOTrainer and the v1 trainer call it
        data = DataProto.from_dict(tensors={"token_level_rewards": x["rewards"], "response_mask": x["mask"],
                                            "old_log_probs": x["old_log_probs"]}, non_tensors={"uid": x["uid"]})
        data = ray_trainer.compute_advantage(data, adv_estimator="ucpo", config=config)
        diffs["ucpo_trainer"] = max(diffs["ucpo_trainer"], max_diff(data.batch["advantages"], own.advantages))
        for kind, y in (("grpo_binary", x), ("grpo_uniform", batch(seed, binary=False))):
            verl_adv, _ = grpo(token_level_rewards=y["rewards"], response_mask=y["mask"], index=y["uid"])
            mine = ADVANTAGES["grpo"].fn(AdvantageInputs(token_rewards=y["rewards"], mask=y["mask"],
                                                         group_ids=y["uid"].tolist()), adv_eps=1e-6)
            diffs[kind] = max(diffs[kind], max_diff(verl_adv, mine.advantages))
    out["estimator_max_abs_diff"] = diffs
    out["ucpo_nonzero_tokens"] = nonzero
    # the documented differences D1 (a group of equal non-binary rewards) and D2 (a response without siblings)
    seven = torch.zeros(7, 1)
    seven[:, 0] = 0.7
    d1, _ = grpo(token_level_rewards=seven, response_mask=torch.ones(7, 1), index=np.array(["p"] * 7, dtype=object))
    d2, _ = grpo(token_level_rewards=torch.ones(1, 1), response_mask=torch.ones(1, 1), index=np.array(["q"]))
    out["grpo_d1_verl_max_abs"] = float(d1.abs().max())
    out["grpo_d2_verl"] = float(d2[0, 0])
    try:
        ucpo(token_level_rewards=seven, response_mask=torch.ones(7, 1), index=np.array(["p"] * 7, dtype=object))
        out["ucpo_without_old_log_probs"] = "no error"
    except Exception as error:  # noqa: BLE001 - the message is what is checked
        out["ucpo_without_old_log_probs"] = f"{type(error).__name__}: {error}"
    from verl.trainer.ppo.v1 import utils as v1_utils

    out["v1_compute_advantage_wrapped"] = bool(getattr(v1_utils.compute_advantage, "rlvrlab_wraps", False))


def check_losses(out: dict) -> None:
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    from rlvrlab.algorithms import POLICY_LOSSES, Aggregation, LossInputs, with_unbounded_positive
    from rlvrlab.algorithms.losses import with_rollout_correction

    up, vanilla = core_algos.get_policy_loss_fn("up"), core_algos.get_policy_loss_fn("vanilla")
    # rlvrlab's UP-DAPO as its trainer binds it (algorithms.bound): UP over clip, rollout-correction weights applied
    own_up = with_rollout_correction(with_unbounded_positive(POLICY_LOSSES["clip"].fn))
    diffs = {"loss": 0.0, "grad": 0.0, "metrics": 0.0, "vanilla_loss_all_negative": 0.0,
             "vanilla_grad_all_negative": 0.0, "vanilla_metrics_all_negative": 0.0}
    cases = 0
    for seed in range(4):
        g = torch.Generator().manual_seed(100 + seed)
        b, t = 12, 9
        mask = (torch.arange(t)[None, :] < torch.randint(1, t + 1, (b,), generator=g)[:, None])
        old = -torch.rand(b, t, generator=g) * 2.0
        new = old + torch.randn(b, t, generator=g) * 0.4  # ratios from ~0.3 to ~3: every clip is reached
        adv = torch.randn(b, t, generator=g)
        weights = torch.rand(b, t, generator=g) + 0.5
        for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
            for info in ({}, {"dp_size": 2, "batch_num_tokens": 150, "global_batch_size": 30,
                              "loss_scale_factor": 16}):
                for is_weights in (None, weights):
                    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                                         clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                                         loss_agg_mode=mode)
                    config.global_batch_info.update(info)
                    cases += 1
                    logp = new.clone().requires_grad_(True)
                    loss, metrics = up(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                                       loss_agg_mode=mode, config=config, rollout_is_weights=is_weights)
                    (grad,) = torch.autograd.grad(loss, logp)
                    mine_logp = new.clone().requires_grad_(True)
                    agg = Aggregation(mode=mode, num_tokens=info.get("batch_num_tokens"),
                                      num_seqs=info.get("global_batch_size"), dp_size=info.get("dp_size", 1),
                                      loss_scale_factor=info.get("loss_scale_factor"))
                    mine = own_up(LossInputs(logp=mine_logp, old_logp=old, adv=adv, mask=mask.float(),
                                             is_weights=is_weights), agg, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
                    (mine_grad,) = torch.autograd.grad(mine.loss, mine_logp)
                    diffs["loss"] = max(diffs["loss"], abs(loss.item() - mine.loss.item()))
                    diffs["grad"] = max(diffs["grad"], max_diff(grad, mine_grad))
                    expected = {"actor/pg_clipfrac": mine.stats.clip_frac, "actor/ppo_kl": mine.stats.approx_kl,
                                "actor/pg_clipfrac_lower": mine.stats.dual_clip_frac}
                    diffs["metrics"] = max(diffs["metrics"], *(abs(metrics[k] - v) for k, v in expected.items()))
                    # anchor: with no positive advantage UP is verl's vanilla loss, value, gradient and metrics
                    negative = -adv.abs()
                    a, b_ = new.clone().requires_grad_(True), new.clone().requires_grad_(True)
                    up_loss, up_metrics = up(old_log_prob=old, log_prob=a, advantages=negative, response_mask=mask,
                                             loss_agg_mode=mode, config=config, rollout_is_weights=is_weights)
                    v_loss, v_metrics = vanilla(old_log_prob=old, log_prob=b_, advantages=negative,
                                                response_mask=mask, loss_agg_mode=mode, config=config,
                                                rollout_is_weights=is_weights)
                    diffs["vanilla_loss_all_negative"] = max(diffs["vanilla_loss_all_negative"],
                                                             abs(up_loss.item() - v_loss.item()))
                    (ga,), (gb,) = torch.autograd.grad(up_loss, a), torch.autograd.grad(v_loss, b_)
                    diffs["vanilla_grad_all_negative"] = max(diffs["vanilla_grad_all_negative"], max_diff(ga, gb))
                    diffs["vanilla_metrics_all_negative"] = max(
                        diffs["vanilla_metrics_all_negative"], *(abs(up_metrics[k] - v) for k, v in v_metrics.items()))
    out["loss_max_abs_diff"] = diffs
    out["loss_cases"] = cases


def check_tracking(out: dict, names: list[str]) -> None:
    """verl's Tracking into the run of MLFLOW_RUN_ID (created by the test): each name logged at steps 1 and 2."""
    from verl.utils.tracking import Tracking

    from rlvrlab.integrations.verl import mlflow_key

    tracker = Tracking(project_name="verl_metric_names", experiment_name="check", default_backend=["mlflow"],
                       config={"algorithm": {"adv_estimator": "ucpo"}})
    for step in (1, 2):
        tracker.log(data={name: 0.25 * step for name in names}, step=step)
    tracker.finish()
    out["sanitized_by_rlvrlab"] = {name: mlflow_key(name) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--metric-names", default="", help="JSON list of verl metric names to log through Tracking")
    args = parser.parse_args()
    out: dict = {}
    import verl
    from verl.trainer.ppo import core_algos

    out["verl_version"] = verl.__version__
    # `import verl` alone: rlvrlab's verl.plugins entry point has run
    out["registered_on_import_verl"] = "ucpo" in core_algos.ADV_ESTIMATOR_REGISTRY and \
        "up" in core_algos.POLICY_LOSS_REGISTRY
    check_estimators(out)
    check_losses(out)
    if args.metric_names:
        check_tracking(out, json.loads(args.metric_names))
    print(MARKER + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
