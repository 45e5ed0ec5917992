#!/usr/bin/env python3
"""Generate DAPO / rollout-correction reference vectors from verl's own code.

Usage (see tests/vectors/README.md):

    /tmp/verlenv/bin/python tests/vectors/make_verl_dapo_vectors.py \
        --verl-src /tmp/verl/src \
        --recipe /path/to/verl-recipe/dapo/dapo_ray_trainer.py \
        --out tests/vectors

* ``verl_dapo_overlong.json``   -- verl/workers/reward_manager/dapo.py  DAPORewardManager.__call__
                                   (unmodified, imported from --verl-src, driven with a real DataProto)
* ``verl_rollout_correction.json`` -- verl/trainer/ppo/rollout_corr_helper.py
                                   compute_rollout_correction_weights (unmodified, imported)
* ``verl_rollout_corr_rejection.json`` -- the same file's compute_rollout_correction_and_rejection_mask
                                   (IS truncated or IcePop, rejection options and chains, all metrics)
* ``verl_rollout_rs_thresholds.json`` -- how its compute_rollout_rejection_mask reads rollout_rs and
                                   rollout_rs_threshold (options kept and bounds, or the error raised)
* ``verl_dapo_filter.json``     -- the inline group filter of RayDAPOTrainer.fit in the DAPO recipe
                                   (verl-project/verl-recipe, dapo/dapo_ray_trainer.py). It is inline
                                   code, not a function, so it is TRANSCRIBED verbatim below and run on
                                   a real verl DataProto; --recipe is read only to check that the
                                   transcribed lines still occur verbatim in the recipe file.

Only empty stub modules for ``ray``, ``transformers`` and ``orjson`` are inserted (top-level imports of
verl.protocol / verl.utils.torch_functional / verl.utils.tracking that the measured code never calls).
This script does not import rlvrlab. Deterministic: fixed seeds, CPU, float32 where verl uses torch.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import platform
import sys
import types
from collections import defaultdict

import numpy as np
import torch

RECIPE_REPO = "verl-project/verl-recipe"
RECIPE_COMMIT = "e477deff97b15d067f8b4e71f75b80ae58ad64c4"  # last commit touching dapo/dapo_ray_trainer.py
RECIPE_SNAPSHOT = "48ea0a797fa29867ea0ad92aff7d284eec7d4be3"  # HEAD of the snapshot it was read from
RECIPE_FILE = "dapo/dapo_ray_trainer.py"
RECIPE_LINES = "251-294 (RayDAPOTrainer.fit, `else:  # NOTE: When prompts after filtering ...` branch)"

STUB_ROOTS = {"ray", "transformers", "orjson"}
FILES = ["verl_dapo_overlong.json", "verl_dapo_filter.json", "verl_rollout_correction.json",
         "verl_rollout_corr_rejection.json", "verl_rollout_rs_thresholds.json"]


# --------------------------------------------------------------------------------------------
# Stubs: any attribute of a stub module is a dummy class; nothing from them is ever called.
# --------------------------------------------------------------------------------------------
class _AnyModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__init__": lambda s, *a, **k: None, "__call__": lambda s, *a, **k: None})
        setattr(self, name, cls)
        return cls


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STUB_ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _AnyModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def _f(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


# --------------------------------------------------------------------------------------------
# 1. DAPO overlong penalty (DAPORewardManager.__call__)
# --------------------------------------------------------------------------------------------
class FakeTokenizer:
    eos_token = "<eos>"

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(t)) for t in ids)


def overlong_case(DataProto, DAPORewardManager, OmegaConf, name, max_resp_len, buf_len, factor, lengths, scores):
    B = len(lengths)
    P = 3  # prompt length (left padded, all valid here)
    prompts = torch.arange(1, B * P + 1, dtype=torch.long).reshape(B, P)
    responses = torch.full((B, max_resp_len), 7, dtype=torch.long)
    attn = torch.zeros((B, P + max_resp_len), dtype=torch.long)
    attn[:, :P] = 1
    for i, L in enumerate(lengths):
        assert 1 <= L <= max_resp_len
        attn[i, P : P + L] = 1
        responses[i, L:] = 0  # pad token
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attn},
        non_tensors={
            "reward_model": np.array([{"ground_truth": "gt"} for _ in range(B)], dtype=object),
            "data_source": np.array(["fake"] * B, dtype=object),
            "extra_info": np.array([{"idx": i} for i in range(B)], dtype=object),
        },
    )

    def fake_compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return scores[extra_info["idx"]]  # plain float -> verl records it under "acc"

    cfg = OmegaConf.create({"enable": True, "len": buf_len, "penalty_factor": factor, "log": True})
    mgr = DAPORewardManager(
        tokenizer=FakeTokenizer(),
        num_examine=0,
        compute_score=fake_compute_score,
        reward_fn_key="data_source",
        max_resp_len=max_resp_len,
        overlong_buffer_cfg=cfg,
    )
    out = mgr(data, return_dict=True)
    rt = out["reward_tensor"]
    info = out["reward_extra_info"]
    assert rt.dtype == torch.float32
    rewards = []
    for i, L in enumerate(lengths):
        rewards.append(_f(rt[i, L - 1]))
        other = rt[i].clone()
        other[L - 1] = 0
        assert torch.count_nonzero(other) == 0
    assert [float(a) for a in info["acc"]] == [float(s) for s in scores]
    return {
        "name": name,
        "params": {"max_resp_len": max_resp_len, "overlong_buffer_len": buf_len, "overlong_penalty_factor": factor},
        "inputs": {"response_lengths": list(lengths), "scores": [float(s) for s in scores]},
        "outputs": {
            "rewards": rewards,
            "overlong_reward": [_f(v) for v in info["overlong_reward"]],
            "overlong": [bool(v) for v in info["overlong"]],
        },
    }


def make_overlong(DataProto, DAPORewardManager, OmegaConf):
    rng = np.random.default_rng(1501)
    c = []
    L20 = [1, 10, 15, 16, 17, 18, 19, 20]  # max 20, buffer 4 -> buffer starts after 16
    c.append(("buf4_f1_binary", 20, 4, 1.0, L20, [1, 0, 1, 1, 1, 0, 1, 0]))
    c.append(("buf4_f05_binary", 20, 4, 0.5, L20, [1, 0, 1, 1, 1, 0, 1, 0]))
    c.append(("buf4_f1_fractional", 20, 4, 1.0, L20, [0.25, 0.7, 0.1, 0.9, 0.5, 0.33, 1.0, 0.6]))
    L32 = [1, 8, 15, 16, 17, 20, 24, 29, 31, 32]  # max 32, buffer 16 -> starts after 16
    c.append(("buf16_f1_binary", 32, 16, 1.0, L32, [1, 1, 0, 1, 1, 0, 1, 1, 0, 1]))
    c.append(("buf16_f05_fractional", 32, 16, 0.5, L32, [0.2, 0.8, 0.5, 0.1, 0.95, 0.3, 0.7, 0.05, 0.6, 0.4]))
    c.append(("buf16_f1_max_equals_buffer", 16, 16, 1.0, [1, 4, 8, 12, 15, 16], [1, 0, 1, 0.5, 1, 1]))
    c.append(("buf4_f05_all_at_max", 20, 4, 0.5, [20, 20, 20], [1, 0, 0.75]))
    c.append(("buf12_f1_nondyadic", 48, 12, 1.0, [35, 36, 37, 40, 41, 43, 47, 48], [1, 1, 0, 1, 0.3, 1, 0.9, 0]))
    c.append(("buf16_f03_fractional", 40, 16, 0.3, [5, 24, 25, 30, 33, 39, 40], [0.1, 0.2, 1, 0.45, 0.8, 1, 0.5]))
    lens = rng.integers(1, 65, size=12).tolist()
    lens[0], lens[1] = 48, 64
    sc = np.round(rng.random(12), 4).tolist()
    c.append(("random_seeded_buf16_f1", 64, 16, 1.0, lens, sc))
    lens = rng.integers(1, 33, size=10).tolist()
    sc = rng.integers(0, 2, size=10).astype(float).tolist()
    c.append(("random_seeded_buf4_f05", 32, 4, 0.5, lens, sc))
    return [overlong_case(DataProto, DAPORewardManager, OmegaConf, *args) for args in c]


# --------------------------------------------------------------------------------------------
# 2. DAPO group filter (inline code in RayDAPOTrainer.fit) -- TRANSCRIBED
# --------------------------------------------------------------------------------------------
# The following lines are copied verbatim (only de-indented) from
#   https://github.com/verl-project/verl-recipe/blob/e477deff97b15d067f8b4e71f75b80ae58ad64c4/dapo/dapo_ray_trainer.py
#   lines 251-273 (inside `else:  # NOTE: When prompts after filtering is less than train batch size,`)
# They are checked against --recipe at run time (see _check_transcription).
TRANSCRIBED = '''\
prompt_uid2metric_vals = defaultdict(list)
for uid, metric_val in zip(
    new_batch.non_tensor_batch["uid"], new_batch.non_tensor_batch[metric_name], strict=True
):
    prompt_uid2metric_vals[uid].append(metric_val)

prompt_uid2metric_std = {}
for prompt_uid, metric_vals in prompt_uid2metric_vals.items():
    prompt_uid2metric_std[prompt_uid] = np.std(metric_vals)

kept_prompt_uids = [
    uid
    for uid, std in prompt_uid2metric_std.items()
    if std > 0 or len(prompt_uid2metric_vals[uid]) == 1
]
num_prompt_in_batch += len(kept_prompt_uids)

kept_traj_idxs = []
for idx, traj_from_prompt_uid in enumerate(new_batch.non_tensor_batch["uid"]):
    if traj_from_prompt_uid in kept_prompt_uids:
        kept_traj_idxs.append(idx)

new_batch = new_batch[kept_traj_idxs]
batch = new_batch if batch is None else DataProto.concat([batch, new_batch])
'''

# lines 240-248: how the "seq_final_reward" / "seq_reward" metrics are materialised (verbatim)
TRANSCRIBED_METRIC = '''\
if metric_name == "seq_final_reward":
    # Turn to numpy for easier filtering
    new_batch.non_tensor_batch["seq_final_reward"] = (
        new_batch.batch["token_level_rewards"].sum(dim=-1).numpy()
    )
elif metric_name == "seq_reward":
    new_batch.non_tensor_batch["seq_reward"] = (
        new_batch.batch["token_level_scores"].sum(dim=-1).numpy()
    )
'''

# lines 275-294: batch filling / alignment (verbatim except `continue`/`raise` replaced by a marker)
TRANSCRIBED_ALIGN = '''\
prompt_bsz = self_config_data_train_batch_size
if num_prompt_in_batch < prompt_bsz:
    result = "keep_generating"  # verl: `continue` (next generation batch) or ValueError at max_num_gen_batches
else:
    # Align the batch
    traj_bsz = self_config_data_train_batch_size * self_config_actor_rollout_ref_rollout_n
    batch = batch[:traj_bsz]
    result = "aligned"
'''


def _check_transcription(recipe_path):
    src = open(recipe_path).read()
    lines = [ln.strip() for ln in src.splitlines()]
    for block in (TRANSCRIBED, TRANSCRIBED_METRIC):
        want = [ln.strip() for ln in block.splitlines()]
        # find the block as a contiguous run of stripped lines
        ok = any(lines[i : i + len(want)] == want for i in range(len(lines) - len(want) + 1))
        if not ok:
            raise SystemExit(f"transcribed block no longer matches {recipe_path}:\n{block}")
    for ln in ("traj_bsz = self.config.data.train_batch_size * self.config.actor_rollout_ref.rollout.n",
               "batch = batch[:traj_bsz]", "if num_prompt_in_batch < prompt_bsz:",
               "prompt_bsz = self.config.data.train_batch_size"):
        assert ln in lines, ln


def _filter_batch(DataProto, uids, metric_values, metric_name):
    B = len(uids)
    T = 4
    # token_level_rewards as in verl: float32, the sequence reward at one token (here the last)
    tlr = torch.zeros((B, T), dtype=torch.float32)
    tlr[:, -1] = torch.tensor(metric_values, dtype=torch.float32)
    tensors = {"token_level_rewards": tlr, "token_level_scores": tlr.clone(),
               "row": torch.arange(B, dtype=torch.long)}
    non_tensors = {"uid": np.array(uids, dtype=object)}
    if metric_name == "acc":
        # ray_trainer: new_batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra_infos_dict.items()})
        non_tensors["acc"] = np.array([float(v) for v in metric_values])
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def run_filter(DataProto, uids, metric_values, metric_name, batch=None, num_prompt_in_batch=0):
    new_batch = _filter_batch(DataProto, uids, metric_values, metric_name)
    ns = {"np": np, "defaultdict": defaultdict, "DataProto": DataProto, "new_batch": new_batch,
          "metric_name": metric_name, "batch": batch, "num_prompt_in_batch": num_prompt_in_batch}
    exec(TRANSCRIBED_METRIC, ns)
    exec(TRANSCRIBED, ns)
    kept_rows = ns["new_batch"].batch["row"].tolist() if len(ns["kept_traj_idxs"]) else []
    assert kept_rows == ns["kept_traj_idxs"]
    return ns


def make_filter(DataProto):
    rng = np.random.default_rng(1502)
    cases = []

    def add(name, metric, uids, vals):
        ns = run_filter(DataProto, uids, vals, metric)
        stds = {str(k): float(v) for k, v in ns["prompt_uid2metric_std"].items()}
        cases.append({
            "name": name,
            "params": {"metric": metric},
            "inputs": {"uids": list(uids), "metric_values": [float(v) for v in vals]},
            "outputs": {"kept_uids": [str(u) for u in ns["kept_prompt_uids"]],
                        "kept_indices": [int(i) for i in ns["kept_traj_idxs"]]},
            "_group_std": stds,
        })

    add("all_equal_groups_dropped", "acc", ["a"] * 4 + ["b"] * 4, [1, 1, 1, 1, 0, 0, 0, 0])
    add("mixed_kept_equal_dropped", "acc", ["a"] * 4 + ["b"] * 4 + ["c"] * 4,
        [1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0])
    add("singleton_groups_kept", "acc", ["s1", "g", "s2", "g", "s3"], [1.0, 0.0, 0.0, 0.0, 1.0])
    add("interleaved_groups_first_appearance_order", "acc",
        ["u3", "u1", "u2", "u1", "u3", "u2", "u4", "u1", "u3", "u2", "u4", "u4"],
        [1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0])
    add("fractional_tiny_diff_float64_kept", "acc", ["x", "x", "x", "y", "y", "y"],
        [0.5, 0.5, 0.5 + 1e-12, 0.25, 0.25, 0.25])
    add("repeated_0p1_float64", "acc", ["p"] * 3 + ["q"] * 5 + ["r"] * 2, [0.1] * 3 + [0.7] * 5 + [0.3, 0.3])
    add("seq_final_reward_float32_tiny_diff", "seq_final_reward", ["x", "x", "x", "y", "y", "y", "z", "z"],
        [0.5, 0.5, 0.5 + 1e-9, 0.25, 0.25, 0.25 + 1e-6, 0.1, 0.1])
    add("seq_final_reward_overlong_penalised", "seq_final_reward", ["a", "a", "b", "b", "c", "c", "c", "d"],
        [1.0, 0.75, -0.25, -0.25, 0.0, -0.5, 0.0, -1.0])
    add("seq_final_reward_repeated_0p1_0p3", "seq_final_reward", ["p"] * 4 + ["q"] * 3,
        [0.1] * 4 + [0.3] * 3)
    add("all_singletons", "acc", ["a", "b", "c", "d"], [0, 1, 0, 1])
    # seeded random: 6 prompts x n=4, binary acc, uid order shuffled
    uids = [f"p{i}" for i in range(6) for _ in range(4)]
    perm = rng.permutation(len(uids))
    uids = [uids[j] for j in perm]
    vals = rng.integers(0, 2, size=len(uids)).astype(float).tolist()
    add("random_seeded_binary_shuffled", "acc", uids, vals)
    # seeded random fractional with some all-equal groups
    uids, vals = [], []
    for g in range(5):
        n = int(rng.integers(1, 6))
        v = rng.random(n).round(3) if g % 2 == 0 else np.full(n, round(float(rng.random()), 3))
        uids += [f"g{g}"] * n
        vals += v.tolist()
    add("random_seeded_fractional", "acc", uids, vals)

    # Batch filling / alignment across generation batches (lines 275-294)
    align = []
    for name, tbs, n, gen_batches in [
        ("one_gen_batch_enough_then_truncate", 2, 2,
         [(["a", "a", "b", "b", "c", "c"], [1, 0, 0, 1, 1, 0])]),
        ("two_gen_batches_concat_then_truncate", 3, 2,
         [(["a", "a", "b", "b"], [1, 0, 1, 1]), (["c", "c", "d", "d", "e", "e"], [0, 0, 1, 0, 0.5, 1])]),
        ("not_enough_keep_generating", 3, 2, [(["a", "a", "b", "b"], [1, 0, 1, 1])]),
    ]:
        batch, nprompt, steps = None, 0, []
        offset = 0
        for uids, vals in gen_batches:
            ns = run_filter(DataProto, uids, vals, "acc", batch=batch, num_prompt_in_batch=nprompt)
            batch, nprompt = ns["batch"], ns["num_prompt_in_batch"]
            ns2 = {"self_config_data_train_batch_size": tbs, "self_config_actor_rollout_ref_rollout_n": n,
                   "num_prompt_in_batch": nprompt, "batch": batch}
            exec(TRANSCRIBED_ALIGN, ns2)
            steps.append({"uids": uids, "metric_values": [float(v) for v in vals],
                          "kept_uids": list(ns["kept_prompt_uids"]),
                          "kept_indices": [i + offset for i in ns["kept_traj_idxs"]],
                          "num_prompt_in_batch": nprompt, "result": ns2["result"]})
            offset += len(uids)
            if ns2["result"] == "aligned":
                batch = ns2["batch"]
                break
        final = None
        if steps[-1]["result"] == "aligned":
            # global indices (into the concatenation of all generation batches) of the final batch
            kept_global = [i for s in steps for i in s["kept_indices"]]
            final = kept_global[: tbs * n]
            assert len(batch) == len(final)
        align.append({"name": name, "params": {"metric": "acc", "train_batch_size": tbs, "rollout_n": n},
                      "gen_batches": steps, "final_indices": final})
    return cases, align


# --------------------------------------------------------------------------------------------
# 3. Rollout correction IS weights
# --------------------------------------------------------------------------------------------
def make_rollout_corr(rch):
    g = torch.Generator().manual_seed(1503)
    cases = []

    def rand(B, T, scale):
        return (torch.randn(B, T, generator=g, dtype=torch.float64) * scale).to(torch.float32)

    def ragged(lengths, T):
        m = torch.zeros(len(lengths), T, dtype=torch.long)
        for i, L in enumerate(lengths):
            m[i, :L] = 1
        return m

    def add(name, level, thr, norm, lr, mask):
        lr = lr.to(torch.float32)
        w, met = rch.compute_rollout_correction_weights(
            log_ratio=lr, response_mask=mask, rollout_is=level, rollout_is_threshold=thr,
            rollout_is_batch_normalize=norm)
        assert w.dtype == torch.float32
        # the wrapper with rejection off must give the same weights and IS metrics
        proto, mod_mask, met2 = rch.compute_rollout_correction_and_rejection_mask(
            old_log_prob=lr, rollout_log_prob=torch.zeros_like(lr), response_mask=mask, rollout_is=level,
            rollout_is_threshold=thr, rollout_is_batch_normalize=norm, rollout_rs=None)
        assert torch.equal(proto.batch["rollout_is_weights"], w) and torch.equal(mod_mask, mask)
        for k, v in met.items():
            assert met2["rollout_corr/" + k] == v, k
        cases.append({
            "name": name,
            "params": {"rollout_is": level, "rollout_is_threshold": float(thr), "rollout_is_batch_normalize": norm},
            "inputs": {"log_ratio": lr.tolist(), "response_mask": mask.tolist()},
            "outputs": {"weights": w.tolist(), "metrics": {k: float(v) for k, v in met.items()}},
        })

    # token level
    add("token_t2_nonorm", "token", 2.0, False, rand(4, 6, 0.5), ragged([6, 4, 2, 5], 6))
    add("token_t1p5_norm", "token", 1.5, True, rand(3, 5, 0.5), ragged([5, 3, 4], 5))
    add("token_tlarge_nonorm_big_ratios", "token", 1e4, False, rand(4, 7, 3.0), ragged([7, 6, 3, 5], 7))
    lr = rand(5, 7, 0.6)
    add("token_t2_norm_padding_row", "token", 2.0, True, lr, ragged([7, 0, 5, 2, 6], 7))
    lr = rand(3, 4, 0.3)
    lr[0, 1], lr[1, 0], lr[2, 2] = 25.0, -25.0, 21.0
    add("token_t2_nonorm_safety_clamp", "token", 2.0, False, lr, ragged([4, 3, 4], 4))
    add("token_tlarge_norm_safety_clamp", "token", 1e9, True, lr, ragged([4, 3, 4], 4))
    # sequence level
    add("seq_t2_nonorm", "sequence", 2.0, False, rand(4, 6, 0.1), ragged([6, 5, 3, 4], 6))
    add("seq_t1p5_norm", "sequence", 1.5, True, rand(3, 4, 0.15), ragged([4, 2, 3], 4))
    lr = rand(4, 5, 0.05)
    lr[0, :] += 6.0   # sum ~ +30 -> clamped to +20
    lr[1, :3] -= 9.0  # sum ~ -27 -> clamped to -20
    add("seq_t2_nonorm_safety_clamp", "sequence", 2.0, False, lr, ragged([5, 3, 4, 2], 5))
    add("seq_tlarge_norm_safety_clamp", "sequence", 1e4, True, lr, ragged([5, 3, 4, 2], 5))
    add("seq_tlarge_nonorm", "sequence", 1e4, False, rand(3, 6, 0.4), ragged([6, 4, 5], 6))
    lr = rand(5, 7, 0.2)
    lr[3, :] = 0.9  # padded positions carry junk; only the mask decides
    add("seq_t1p5_norm_padding_row", "sequence", 1.5, True, lr, ragged([7, 3, 5, 0, 6], 7))
    add("seq_t2_nonorm_padding_row", "sequence", 2.0, False, lr, ragged([7, 3, 5, 0, 6], 7))
    return cases


# --------------------------------------------------------------------------------------------
# 4. Rollout correction and rejection (compute_rollout_correction_and_rejection_mask)
# --------------------------------------------------------------------------------------------
def make_rollout_corr_rejection(rch):
    """IS (token/sequence, TIS or IcePop, batch normalisation), every rollout_rs option alone, chains of them,
    IS with rejection, padding rows and junk on padding, log-ratios beyond the +-20 clamp; the whole public
    function with separate trainer (old_log_prob) and rollout log-probs, so the off-policy metrics are recorded."""
    g = torch.Generator().manual_seed(1504)
    cases, shared, input_sets = [], {}, {}

    def logps(B, T, mismatch, spread=3.0):
        rollout = -torch.rand(B, T, generator=g, dtype=torch.float64) * spread
        old = rollout + torch.randn(B, T, generator=g, dtype=torch.float64) * mismatch
        return old.to(torch.float32), rollout.to(torch.float32)

    def ragged(lengths, T):
        m = torch.zeros(len(lengths), T, dtype=torch.long)
        for i, L in enumerate(lengths):
            m[i, :L] = 1
        return m

    def add(name, old, rollout, mask, rollout_is=None, is_thr=2.0, norm=False, rs=None, rs_thr=None):
        proto, new_mask, met = rch.compute_rollout_correction_and_rejection_mask(
            old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, rollout_is=rollout_is,
            rollout_is_threshold=is_thr, rollout_is_batch_normalize=norm, rollout_rs=rs, rollout_rs_threshold=rs_thr)
        weights = None if proto is None else proto.batch["rollout_is_weights"]
        assert weights is None or weights.dtype == torch.float32
        assert new_mask.dtype == mask.dtype
        for k, v in met.items():
            assert isinstance(v, float) and np.isfinite(v), (name, k, v)
        inputs = {"old_log_prob": old.tolist(), "rollout_log_prob": rollout.tolist(), "response_mask": mask.tolist()}
        key = json.dumps(inputs)
        if key not in input_sets:  # cases share inputs: each set is stored once, under its first case's name
            input_sets[key] = name
            shared[name] = inputs
        cases.append({
            "name": name,
            "params": {"rollout_is": rollout_is, "rollout_is_threshold": is_thr, "rollout_is_batch_normalize": norm,
                       "rollout_rs": rs, "rollout_rs_threshold": rs_thr},
            "inputs": {"input_set": input_sets[key]},
            "outputs": {"rollout_is_weights": None if weights is None else weights.tolist(),
                        "modified_response_mask": new_mask.tolist(), "metrics": dict(met)},
        })

    m46 = ragged([6, 4, 2, 5], 6)
    # importance sampling alone: truncated (TIS) or masked (IcePop, "lower_upper"), token or sequence level
    old, ro = logps(4, 6, 0.5)
    add("is_token_tis", old, ro, m46, "token", 2.0)
    add("is_token_tis_norm", old, ro, m46, "token", 1.5, True)
    add("is_token_icepop", old, ro, m46, "token", "0.5_2.0")
    add("is_token_icepop_norm", old, ro, m46, "token", "0.8_1.25", True)
    add("is_token_tis_threshold_as_text", old, ro, m46, "token", "2.0")
    old, ro = logps(4, 6, 0.15)
    add("is_seq_tis", old, ro, m46, "sequence", 2.0)
    add("is_seq_tis_norm", old, ro, m46, "sequence", 1.5, True)
    add("is_seq_icepop", old, ro, m46, "sequence", "0.8_1.25")
    old, ro = logps(5, 7, 0.2)
    m57 = ragged([7, 3, 5, 0, 6], 7)
    add("is_seq_icepop_norm_padding_row", old, ro, m57, "sequence", "0.7_1.5", True)
    add("is_token_icepop_norm_padding_row", old, ro, m57, "token", "0.7_1.5", True)

    # each rejection option alone (k1: "lower_upper" or one number, the lower then 1/upper)
    old, ro = logps(6, 8, 0.3)
    m68 = ragged([8, 5, 7, 2, 8, 6], 8)
    for option, thr in [("token_k1", "0.8_1.25"), ("token_k1", "1.5"), ("token_k2", "0.05"), ("token_k3", 0.04),
                        ("seq_sum_k1", "0.5_2.0"), ("seq_sum_k2", "0.3"), ("seq_sum_k3", "0.25"),
                        ("seq_mean_k1", "0.95_1.1"), ("seq_mean_k2", "0.05"), ("seq_mean_k3", "0.05"),
                        ("seq_max_k2", "0.15"), ("seq_max_k3", "0.12")]:
        add(f"rs_{option}_{str(thr).replace('.', 'p')}", old, ro, m68, rs=option, rs_thr=thr)

    # chains: every option must pass
    add("rs_chain_token_k1_seq_mean_k1", old, ro, m68, rs="token_k1,seq_mean_k1", rs_thr="0.5_2.0,0.9_1.1")
    add("rs_chain_seq_sum_k3_seq_max_k2", old, ro, m68, rs="seq_sum_k3,seq_max_k2", rs_thr="0.3,0.15")
    add("rs_chain_four", old, ro, m68, rs="token_k1,seq_mean_k1,seq_sum_k3,seq_max_k2",
        rs_thr="0.4_2.5,0.9_1.15,1.5,0.4")
    add("rs_chain_shared_threshold", old, ro, m68, rs="token_k2,seq_max_k3", rs_thr=0.1)
    add("rs_chain_duplicate_option", old, ro, m68, rs="seq_mean_k1,seq_mean_k1,token_k3", rs_thr="1.1,0.2")
    add("rs_chain_spaces_and_empty_items", old, ro, m68, rs=" token_k1 , ,seq_max_k2 ", rs_thr=" 1.5, 0.2 ")
    add("rs_rejects_everything", old, ro, m68, rs="token_k2", rs_thr="1e-9")

    # importance weights and rejection together
    add("is_token_tis_norm_rs_chain", old, ro, m68, "token", 2.0, True, "token_k1,seq_max_k2", "0.7_1.4,0.15")
    add("is_seq_icepop_rs_token_k1", old, ro, m68, "sequence", "0.5_2.0", False, "token_k1", "0.7_1.4")
    old, ro = logps(5, 7, 0.2)
    add("is_seq_tis_norm_rs_seq_mean_k3_padding_row", old, ro, m57, "sequence", 2.0, True, "seq_mean_k3", "0.02")

    # log-ratios beyond the +-20 safety clamp: token ratios and sequence sums
    old, ro = logps(4, 5, 0.3)
    old[0, 1] = ro[0, 1] + 25.0
    old[1, 0] = ro[1, 0] - 25.0
    old[2, 2] = ro[2, 2] + 21.0
    old[3, :] = ro[3, :] + 6.0  # sequence sum 24 (row of 4 tokens) -> clamped to 20
    m45 = ragged([5, 3, 4, 4], 5)
    add("clamp_is_token_tis", old, ro, m45, "token", 2.0)
    add("clamp_is_token_icepop_wide", old, ro, m45, "token", "1e-12_1e9")
    add("clamp_is_seq_tis_norm", old, ro, m45, "sequence", 1e4, True)
    add("clamp_rs_all_k1_k2_k3", old, ro, m45, None, 2.0, False,
        "token_k1,seq_sum_k2,seq_mean_k3,seq_max_k3", "1e-12_1e12,500,1e6,1e9")
    add("clamp_is_seq_icepop_rs_seq_max_k2", old, ro, m45, "sequence", "1e-5_1e9", False, "seq_max_k2", "100")

    # padding positions holding junk (only the mask decides), a padding row, one-token and one-row batches
    old, ro = logps(4, 6, 0.3)
    junk = ragged([6, 2, 0, 4], 6)
    old = torch.where(junk.bool(), old, torch.full_like(old, 100.0))
    ro = torch.where(junk.bool(), ro, torch.full_like(ro, -100.0))
    add("padding_junk_is_token_rs_seq_max_k3", old, ro, junk, "token", 2.0, True, "seq_max_k3", "0.1")
    old, ro = logps(1, 3, 0.4)
    add("one_token", old, ro, ragged([1], 3), "sequence", 2.0, True, "token_k2,seq_sum_k1", "0.5,0.5_2.0")
    add("one_row", old, ro, ragged([3], 3), "token", "0.5_1.5", True, "seq_mean_k2", "0.5")
    return cases, shared


def make_rs_threshold_specs(rch):
    """How verl reads rollout_rs / rollout_rs_threshold: the options it keeps (de-duplicated, in order) and each
    one's bounds, or the error it raises, through the public compute_rollout_rejection_mask."""
    specs = [
        ("token_k1", "2.0"), ("token_k1", 2), ("token_k1", "0.5_3"), ("seq_sum_k3", 0.5),
        ("token_k1,seq_max_k2", "0.5_2.0,0.3"), ("token_k1,seq_max_k2", "2.0"), ("seq_mean_k1, seq_mean_k1", "1.1"),
        ("token_k2,,token_k3", "0.1,0.2"), ("token_k1", "1.0_1.0"), ("seq_max_k3", "1e30"),
        ("token_k4", "1"), ("seq_max_k1", "2"), ("", "1"), (" , ", "1"), ("token_k1", None), ("token_k1", ""),
        ("token_k1", " , "), ("token_k1,token_k2", "1,2,3"), ("token_k1", "2_0.5"), ("token_k1", "0_2"),
        ("token_k1", "-1"), ("token_k1", "0"), ("token_k1", "a_b"), ("token_k1", "inf"), ("token_k2", "0.5_1"),
        ("token_k2", "0"), ("token_k2", "-0.1"), ("token_k2", "abc"),
    ]
    log_ratio, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.long)
    cases = []
    for i, (rs, thr) in enumerate(specs):
        case = {"name": f"spec_{i:02d}", "params": {"rollout_rs": rs, "rollout_rs_threshold": thr}}
        try:
            _, met = rch.compute_rollout_rejection_mask(log_ratio, mask, rollout_rs=rs, rollout_rs_threshold=thr)
        except Exception as error:  # noqa: BLE001 - the type verl raises is what is recorded
            case["outputs"] = {"raises": type(error).__name__, "message": str(error)}
        else:
            options = [k[len("rollout_rs_"):-len("_mean")] for k in met
                       if k.endswith("_mean") and not k.endswith("_seq_mean")]
            bounds = rch._parse_rollout_rs_thresholds(options, thr)
            case["outputs"] = {"options": options, "thresholds": bounds}
        cases.append(case)
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--verl-src", required=True, help="unzipped verl 0.9.1 wheel (dir containing verl/)")
    ap.add_argument("--recipe", help=f"verl-recipe dapo/dapo_ray_trainer.py at {RECIPE_COMMIT} (needed for "
                    "verl_dapo_filter.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="+", choices=FILES, default=FILES, help="write these files only")
    args = ap.parse_args()
    if "verl_dapo_filter.json" in args.only and not args.recipe:
        ap.error("--recipe is needed for verl_dapo_filter.json (or leave it out with --only)")

    torch.manual_seed(0)
    torch.set_num_threads(1)
    sys.meta_path.insert(0, _StubFinder())
    sys.path.insert(0, os.path.abspath(args.verl_src))
    import verl
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.trainer.ppo import rollout_corr_helper as rch
    from verl.workers.reward_manager.dapo import DAPORewardManager

    assert os.path.abspath(verl.__file__).startswith(os.path.abspath(args.verl_src)), verl.__file__
    version = open(os.path.join(args.verl_src, "verl", "version", "version")).read().strip()
    if args.recipe:
        _check_transcription(args.recipe)

    cmd = ("/tmp/verlenv/bin/python tests/vectors/make_verl_dapo_vectors.py --verl-src /tmp/verl/src "
           f"--recipe <verl-recipe@{RECIPE_COMMIT[:12]}>/dapo/dapo_ray_trainer.py --out tests/vectors")
    gen = {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
           "device": "cpu", "command": cmd,
           "stubbed_modules": sorted(STUB_ROOTS) + ["(empty; top-level imports never called by measured code)"]}
    base = {"repo": "verl-project/verl", "version": version, "distribution": f"verl=={version} wheel (PyPI)"}

    overlong = make_overlong(DataProto, DAPORewardManager, OmegaConf) if "verl_dapo_overlong.json" in args.only else []
    filt, align = make_filter(DataProto) if "verl_dapo_filter.json" in args.only else ([], [])
    for c in filt:
        c.pop("_group_std")
    rc = make_rollout_corr(rch) if "verl_rollout_correction.json" in args.only else []
    rcr, rcr_inputs = (make_rollout_corr_rejection(rch) if "verl_rollout_corr_rejection.json" in args.only
                       else ([], {}))
    specs = make_rs_threshold_specs(rch) if "verl_rollout_rs_thresholds.json" in args.only else []

    docs = {
        "verl_dapo_overlong.json": {
            "source": dict(base, file="verl/workers/reward_manager/dapo.py",
                           function="DAPORewardManager.__call__",
                           driven_with="real verl.protocol.DataProto; fake tokenizer (decode joins ids); fake "
                                       "compute_score returning scores[i] as a plain float; overlong_buffer_cfg "
                                       "enable=True, log=True; return_dict=True",
                           note="rewards[i] = reward_tensor[i, len_i-1] (float32; every other entry is 0). "
                                "overlong_reward is float32 where the penalty applies, else the int 0 from min(.,0)"),
            "generated_with": gen, "tolerance_hint": {"atol": 1e-6}, "cases": overlong},
        "verl_dapo_filter.json": {
            "source": {"repo": RECIPE_REPO, "commit": RECIPE_COMMIT, "snapshot_head": RECIPE_SNAPSHOT,
                       "file": RECIPE_FILE, "function": "RayDAPOTrainer.fit (inline dynamic-sampling group filter)",
                       "lines": RECIPE_LINES, "transcribed": True,
                       "verl_runtime": dict(base, note="run on verl.protocol.DataProto from the 0.9.1 wheel"),
                       "note": "metric 'acc' values are np.array(list_of_float) -> float64 before np.std; "
                               "'seq_final_reward' = token_level_rewards(float32).sum(-1).numpy() -> float32 "
                               "(metric_values are the single nonzero token reward, cast to float32). "
                               "align_cases: filling across generation batches and truncation to "
                               "train_batch_size*rollout_n (indices global over concatenated gen batches)."},
            "generated_with": gen, "cases": filt, "align_cases": align},
        "verl_rollout_correction.json": {
            "source": dict(base, file="verl/trainer/ppo/rollout_corr_helper.py",
                           function="compute_rollout_correction_weights",
                           also_checked="compute_rollout_correction_and_rejection_mask(old_log_prob=log_ratio, "
                                        "rollout_log_prob=0, rollout_rs=None) returns identical weights and "
                                        "'rollout_corr/'-prefixed identical IS metrics (its off-policy metrics "
                                        "need separate log-probs and are not recorded)",
                           helpers="verl/utils/torch_functional.py masked_sum, masked_mean"),
            "generated_with": gen, "dtype": "float32 log_ratio, int64 response_mask",
            "tolerance_hint": {"atol": 1e-6, "rtol": 1e-6,
                               "note": "metrics such as rollout_is_max can be exp(20)~4.85e8 in float32; "
                                       "compare those relatively"},
            "cases": rc},
        "verl_rollout_corr_rejection.json": {
            "source": dict(base, file="verl/trainer/ppo/rollout_corr_helper.py",
                           function="compute_rollout_correction_and_rejection_mask",
                           calls="compute_rollout_correction_weights, compute_is_metrics, "
                                 "compute_rollout_rejection_mask, compute_rs_metrics, compute_offpolicy_metrics",
                           helpers="verl/utils/torch_functional.py masked_sum, masked_mean",
                           supported_rollout_rs_options=sorted(rch.SUPPORTED_ROLLOUT_RS_OPTIONS),
                           safety_bound=rch.SAFETY_BOUND,
                           note="params are the function's own arguments (rollout_is_threshold 'lower_upper' is "
                                "IcePop); outputs.rollout_is_weights is the DataProto's tensor (null without IS); "
                                "metrics as returned, with the 'rollout_corr/' prefix; inputs.input_set names the "
                                "entry of shared_inputs holding the case's inputs"),
            "generated_with": gen, "dtype": "float32 log-probs, int64 response_mask",
            "shared_inputs": rcr_inputs,
            "tolerance_hint": {"atol": 1e-6, "rtol": 1e-6,
                               "note": "metrics such as rollout_is_max (exp(20)) or chi2_seq (exp(40)) are large; "
                                       "compare those relatively"},
            "cases": rcr},
        "verl_rollout_rs_thresholds.json": {
            "source": dict(base, file="verl/trainer/ppo/rollout_corr_helper.py",
                           function="compute_rollout_rejection_mask (log_ratio zeros [2, 3], response_mask ones)",
                           also="_parse_rollout_rs_thresholds(options kept, rollout_rs_threshold) for the bounds of "
                                "an accepted spec; options kept are read off the returned metric names in order",
                           note="outputs.raises is the exception type verl raises for a refused spec"),
            "generated_with": gen, "cases": specs},
    }
    os.makedirs(args.out, exist_ok=True)
    for fn, doc in docs.items():
        if fn not in args.only:
            continue
        with open(os.path.join(args.out, fn), "w") as fh:
            json.dump(doc, fh, indent=1, allow_nan=False)
            fh.write("\n")
        print("wrote", os.path.join(args.out, fn), len(doc["cases"]), "cases")


if __name__ == "__main__":
    main()
