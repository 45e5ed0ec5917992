"""The training loop on the toy tier: records, determinism, staleness, engines, resume, failures.

Each run takes a second or two: the toy policy is one logit table (rlvrlab.policy.toy).
"""

import functools
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlvrlab.config import compose
from rlvrlab.errors import RlvrlabError
from rlvrlab.train.logprobs import logp_and_entropy
from rlvrlab.train.loop import train


def toy(tmp_path: Path, *overrides: str):
    return compose("toy", [f"output_dir={tmp_path}", "steps=6", *overrides])


def test_toy_run_records_everything(tmp_path, mlflow_history):
    from mlflow.tracking import MlflowClient

    cfg = toy(tmp_path, "trainer.checkpoint_every=3", "algorithm=ucpo")
    first = {}
    run_id = train(cfg, on_step=lambda step, batch, run, stats: first.setdefault("w", run.update.module.logits.detach().clone()))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.tau"] == "0.2" and run.data.params["seed"] == "0"
    tags = run.data.tags
    assert tags["algorithm"] == "ucpo" and tags["seed"] == "0" and len(tags["config_hash"]) == 12
    assert tags["git_sha"] and tags["git_dirty"] in ("true", "false")
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "packages.txt"} <= artifacts
    history = mlflow_history(tmp_path, run_id)
    for name in ("train/reward", "loss/policy", "loss/grad_norm", "loss/clip_frac_upper", "loss/ratio_max",
                 "policy/entropy", "policy/correct_entropy", "rollout/lag", "rollout/logp_gap_max", "time/update",
                 "rollout/tokens_per_s", "policy/toy_correct_uniformity"):
        assert sorted(history[name]) == list(range(6)), name
        assert all(math.isfinite(v) for v in history[name].values()), name
    checkpoints = sorted(p.name for p in (tmp_path / run_id / "checkpoints").iterdir())
    assert checkpoints == ["step_000003", "step_000006"]
    assert (tmp_path / run_id / "checkpoints" / "step_000006" / "model" / "model.safetensors").is_file()
    # the policy moved
    from safetensors.torch import load_file

    final = load_file(str(tmp_path / run_id / "checkpoints" / "step_000006" / "model" / "model.safetensors"))
    assert not torch.equal(final["logits"], first["w"])


def test_same_seed_same_metrics_other_seed_differs(tmp_path, mlflow_history):
    def metrics(seed: int, folder: str) -> dict:
        run_id = train(toy(tmp_path / folder, f"seed={seed}", "trainer.checkpoint_every=0"))
        history = mlflow_history(tmp_path / folder, run_id)
        return {k: v for k, v in history.items() if not k.startswith(("time/", "rollout/tokens_per_s"))}

    assert metrics(1, "a") == metrics(1, "b")
    assert metrics(1, "a")["train/reward"] != metrics(2, "c")["train/reward"]


def test_on_policy_single_epoch_ratio_is_exactly_one(tmp_path):
    seen = []
    train(toy(tmp_path, "trainer.staleness=0", "trainer.ppo_epochs=1", "trainer.micro_batch_size=8"),
          on_step=lambda step, batch, run, stats: seen.append(stats.loss))
    for loss_stats in seen:
        assert loss_stats.ratio_max == 1.0 and loss_stats.ratio_mean == 1.0
        assert loss_stats.clip_frac == 0.0 and loss_stats.approx_kl == 0.0


def test_staleness_two_consumes_version_t_minus_two_with_its_logp(tmp_path, monkeypatch):
    from rlvrlab.data import load_problems
    from rlvrlab.policy.toy import ToyPolicy
    from rlvrlab.train import loop

    cfg = toy(tmp_path, "trainer.staleness=2", "steps=8")
    problems, _ = load_problems(cfg.dataset, cfg.model)
    initial = ToyPolicy.initial(problems, num_responses=cfg.model.toy_num_responses, init=cfg.model.toy_init,
                                skew=cfg.model.toy_init_skew)
    snapshots = {0: initial.logits.detach().clone()}  # policy version -> weights
    versions, gaps, behaviours = [], [], []
    update_rows = loop.update_rows

    def recorded_rows(run, batch, trainer, *args, **kwargs):
        behaviours.append(trainer.behaviour)
        return update_rows(run, batch, trainer, *args, **kwargs)

    def observe(step, batch, run, stats):
        versions.append((step, batch.version, stats.lag))
        # the consumed batch's pi_old must be the log-probs of the weights that generated it
        logp, _ = logp_and_entropy(ToyPolicy(snapshots[batch.version]), batch, temperature=cfg.rollout.temperature)
        gaps.append(float((logp.detach() - behaviours[step]).abs().max()))
        snapshots[step + 1] = run.update.module.logits.detach().clone()  # version step+1: after this update

    monkeypatch.setattr(loop, "update_rows", recorded_rows)
    train(cfg, on_step=observe)
    assert versions == [(t, max(t - 2, 0), min(t, 2)) for t in range(8)]
    assert max(gaps) < 1e-6
    assert not torch.equal(snapshots[8], snapshots[6])  # the weights did move between generation and use


def test_deepspeed_and_torch_engines_take_the_same_steps(tmp_path, mlflow_history):
    def metrics(engine: str) -> dict:
        run_id = train(toy(tmp_path / engine, f"trainer.engine={engine}", "steps=4", "trainer.checkpoint_every=0"))
        history = mlflow_history(tmp_path / engine, run_id)
        return {k: v for k, v in history.items() if k.startswith(("train/", "loss/", "policy/"))}

    torch_run, ds_run = metrics("torch"), metrics("deepspeed")
    assert torch_run.keys() == ds_run.keys()
    for name in torch_run:
        for step in torch_run[name]:
            assert ds_run[name][step] == pytest.approx(torch_run[name][step], rel=1e-5, abs=1e-6), (name, step)


@pytest.mark.slow
def test_resume_after_kill_equals_uninterrupted_run(tmp_path, mlflow_history):
    args = ["toy", f"output_dir={tmp_path}", "steps=10", "trainer.checkpoint_every=2", "trainer.staleness=1",
            "algorithm=ucpo"]
    cli = [sys.executable, "-m", "rlvrlab.cli.main", "train"]
    env = {**os.environ, "RLVRLAB_KILL_AFTER_STEP": "6"}
    killed = subprocess.run([*cli, *args], env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr  # SIGKILL: no cleanup ran
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("toy").experiment_id)
    run_id = run.info.run_id
    assert run.info.status == "RUNNING"
    resumed = subprocess.run([*cli, "--resume", run_id, f"output_dir={tmp_path}"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert client.get_run(run_id).info.status == "FINISHED"

    reference_id = train(compose("toy", [a for a in args[1:] if not a.startswith("output_dir")] +
                                 [f"output_dir={tmp_path / 'ref'}"]))
    want, got = mlflow_history(tmp_path / "ref", reference_id), mlflow_history(tmp_path, run_id)
    for name in want:
        if name.startswith(("time/", "rollout/tokens_per_s")):
            continue
        assert got[name] == want[name], name


def test_a_checkpoint_queued_in_the_earlier_format_resumes_to_the_same_run(tmp_path, mlflow_history):
    """Checkpoints written up to a8ea15d queue one RolloutBatch that carries the trainer's and the reference's
    log-probs as optional fields; this version queues Sampled (the batch, TrainerLogp, the reference's). A killed
    run whose checkpoint is rewritten in the earlier format resumes to exactly the run that was never interrupted
    (staleness 1 queues a batch; the KL term gives it reference log-probs)."""
    from mlflow.tracking import MlflowClient

    from rlvrlab import rundir
    from rlvrlab.train.batch import RolloutBatch

    args = ["toy", "steps=6", "trainer.checkpoint_every=2", "trainer.staleness=1", "algorithm.kl_coef=0.01"]
    cli = [sys.executable, "-m", "rlvrlab.cli.main", "train"]
    killed = subprocess.run([*cli, *args, f"output_dir={tmp_path}"], capture_output=True, text=True,
                            env={**os.environ, "RLVRLAB_KILL_AFTER_STEP": "3"})
    assert killed.returncode == -9, killed.stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("toy").experiment_id)
    folder = rundir.latest(rundir.run_dir(tmp_path, run.info.run_id))
    assert folder is not None and rundir.step_of(folder) < 6
    state_file = folder / "state_rank0.pt"
    state = torch.load(state_file, weights_only=False)
    assert len(state["queue"]) == 1 and state["queue"][0].trainer is not None
    earlier = []
    for sampled in state["queue"]:  # pickled as a8ea15d's RolloutBatch was: the class and its __dict__
        batch = replace(sampled.batch)
        vars(batch).update(old_logp=sampled.trainer.behaviour, raw_logp=sampled.trainer.raw,
                           old_entropy=sampled.trainer.entropy, ref_logp=sampled.reference, adv=None,
                           is_weights=None, kept_mask=None)
        earlier.append(batch)
    torch.save({**state, "queue": earlier}, state_file)
    assert type(torch.load(state_file, weights_only=False)["queue"][0]) is RolloutBatch
    rundir.write_complete(folder, rundir.step_of(folder), rundir.checksums(folder, rundir.checkpoint_files(folder)))
    resumed = subprocess.run([*cli, "--resume", run.info.run_id, f"output_dir={tmp_path}"], capture_output=True,
                             text=True)
    assert resumed.returncode == 0, resumed.stderr

    reference_id = train(compose(args[0], [*args[1:], f"output_dir={tmp_path / 'ref'}"]))
    want, got = mlflow_history(tmp_path / "ref", reference_id), mlflow_history(tmp_path, run.info.run_id)
    for name in want:
        if not name.startswith(("time/", "rollout/tokens_per_s")):
            assert got[name] == want[name], name

def test_resume_without_a_checkpoint_is_one_error_and_leaves_the_run_as_it_was(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = toy(tmp_path, "trainer.checkpoint_every=0")
    run_id = train(cfg)
    with pytest.raises(RlvrlabError, match=rf"run {run_id} has no complete checkpoint"):
        train(cfg, resume=run_id)
    assert MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).info.status == "FINISHED"


def test_non_finite_loss_stops_the_run_and_marks_it_failed(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from rlvrlab.algorithms import POLICY_LOSSES

    calls = {"n": 0}
    clip = POLICY_LOSSES["clip"].fn

    @functools.wraps(clip, assigned=(), updated=())  # the same knobs as clip (inspect.signature follows it)
    def poisoned(x, agg, **knobs):  # a loss that turns NaN at its 4th evaluation (step 3)
        calls["n"] += 1
        out = clip(x, agg, **knobs)
        return out if calls["n"] < 4 else type(out)(out.loss * math.nan, out.per_token, out.stats)

    monkeypatch.setitem(POLICY_LOSSES, "clip", replace(POLICY_LOSSES["clip"], fn=poisoned))
    with pytest.raises(RlvrlabError, match=r"step 3: the loss is nan; run \w+ is marked FAILED and the last good "
                                           r"checkpoint is .*step_000002"):
        train(toy(tmp_path, "trainer.checkpoint_every=2"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("toy").experiment_id)
    assert run.info.status == "FAILED"
    assert (tmp_path / run.info.run_id / "checkpoints" / "step_000002" / "COMPLETE").exists()


def test_toy_diagnostics_are_exact_hand_worked_numbers():
    """p = [0.4, 0.1, 0.25, 0.25] over four responses, the first two correct: Z = 0.5, q = [0.8, 0.2]."""
    import math

    import torch

    from rlvrlab.data.problems import Problem
    from rlvrlab.policy.toy import ToyPolicy, diagnostics

    problems = [Problem(id="toy-0", prompt="0", answer="r0|r1"), Problem(id="toy-1", prompt="1", answer="r2")]
    policy = ToyPolicy(torch.tensor([[0.4, 0.1, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]]).log())
    d = diagnostics(policy, problems)
    h = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))
    assert math.isclose(d.correct_mass, (0.5 + 0.25) / 2, rel_tol=1e-6)
    assert math.isclose(d.uniformity, h / math.log(2), rel_tol=1e-6)  # only the problem with |C| >= 2
    assert math.isclose(d.correct_entropy, (h + 0.0) / 2, rel_tol=1e-6)
    assert math.isclose(d.max_q, (0.8 + 1.0) / 2, rel_tol=1e-6)
    coverage = ((1 - 0.6**64) + (1 - 0.9**64)) / 2, 1 - 0.75**64
    assert math.isclose(d.coverage, (coverage[0] + coverage[1]) / 2, rel_tol=1e-6)
    assert math.isclose(d.pass_at[4], ((1 - 0.5**4) + (1 - 0.75**4)) / 2, rel_tol=1e-6)
    assert d.pass_at[1] == d.correct_mass


def test_log_every_logs_every_nth_step_and_the_last(tmp_path, mlflow_history):
    run_id = train(toy(tmp_path, "steps=6", "trainer.checkpoint_every=0", "tracking.log_every=4"))
    history = mlflow_history(tmp_path, run_id)
    assert sorted(history["train/reward"]) == sorted(history["loss/policy"]) == [0, 4, 5]


def test_log_last_logs_each_of_the_last_steps_too(tmp_path, mlflow_history):
    run_id = train(toy(tmp_path, "steps=9", "trainer.checkpoint_every=0", "tracking.log_every=4", "tracking.log_last=3"))
    assert sorted(mlflow_history(tmp_path, run_id)["train/reward"]) == [0, 4, 6, 7, 8]


@pytest.mark.parametrize("overrides", [
    pytest.param(["algorithm=ucpo", "trainer.ppo_epochs=2", "trainer.staleness=1"], id="ucpo-stale-two-epochs"),
    pytest.param(["algorithm=grpo"], id="reused-update-logp"),
    pytest.param(["algorithm=up_dapo", "algorithm.kl_coef=0.1", "algorithm.entropy_coef=0.01"], id="up-kl-entropy"),
    pytest.param(["algorithm=grpo", "algorithm.ent_adv_alpha=0.5", "trainer.mini_batches=2"], id="ent-adv"),
    pytest.param(["algorithm=grpo", "algorithm.loss=cispo", "algorithm.unbounded_positive=true"], id="up-cispo"),
])
def test_steps_that_log_nothing_train_exactly_as_those_that_log(tmp_path, mlflow_history, overrides):
    """Steps that log nothing skip their statistics (the loss's diagnostics, the entropy, the toy table's): the
    training is the same to the bit, and the steps that do log give the same numbers as a run that logs every step."""
    weights: dict[int, torch.Tensor] = {}
    histories = {}
    for every in (1, 3):
        out = tmp_path / f"every{every}"
        cfg = toy(out, "steps=7", "trainer.checkpoint_every=0", f"tracking.log_every={every}", *overrides)
        seen = []

        def record(step, batch, run, stats, seen=seen, every=every):
            seen.append(stats is not None)
            weights[every] = run.update.module.logits.detach().clone()

        histories[every] = mlflow_history(out, train(cfg, on_step=record))
        assert seen == [step % every == 0 or step == 6 for step in range(7)]
    assert torch.equal(weights[1], weights[3])
    sparse, dense = histories[3], histories[1]
    assert sorted(sparse["policy/entropy"]) == [0, 3, 6]
    for name, points in sparse.items():
        if not name.startswith("time/") and name != "rollout/tokens_per_s":
            assert points == {step: dense[name][step] for step in points}, name


# ----------------------------------------------------------------- every registered algorithm, two toy steps


def _every_algorithm() -> list:
    """Overrides that select each registered estimator, each registered loss (UP on the up_compatible ones) and
    each experiments/algorithms/*.yaml: a new entry is trained here without being named."""
    from rlvrlab.algorithms import ADVANTAGES, POLICY_LOSSES
    from rlvrlab.config.compose import experiments_dir

    cases = [pytest.param([f"algorithm.estimator={name}"], id=f"estimator-{name}") for name in sorted(ADVANTAGES)]
    for name, loss in sorted(POLICY_LOSSES.items()):
        cases.append(pytest.param([f"algorithm.loss={name}"], id=f"loss-{name}"))
        if loss.up_compatible:
            up = [f"algorithm.loss={name}", "algorithm.unbounded_positive=true"]
            cases.append(pytest.param(up, id=f"loss-up_{name}"))
    yamls = sorted((experiments_dir() / "algorithms").glob("*.yaml"))
    return cases + [pytest.param([f"algorithm={path.stem}"], id=f"yaml-{path.stem}") for path in yamls]


@pytest.fixture(scope="module")
def shared_output(tmp_path_factory) -> Path:
    """One output folder (one MLflow database, created once) for the many two-step runs."""
    return tmp_path_factory.mktemp("every_algorithm")


@pytest.mark.parametrize("overrides", _every_algorithm())
def test_every_algorithm_trains_two_toy_steps(shared_output: Path, overrides: list[str]):
    from mlflow.tracking import MlflowClient

    seen: list[tuple[float, float]] = []
    cfg = toy(shared_output, "steps=2", "trainer.checkpoint_every=0", *overrides)
    run_id = train(cfg, on_step=lambda step, batch, run, stats: seen.append((stats.policy_loss, stats.grad_norm)))
    assert len(seen) == 2 and all(math.isfinite(v) for pair in seen for v in pair), seen
    assert MlflowClient(f"sqlite:///{shared_output / 'mlflow.db'}").get_run(run_id).info.status == "FINISHED"


def test_dynamic_sampling_trains_only_on_groups_with_signal(tmp_path, mlflow_history):
    """DAPO's dynamic sampling: every consumed group has differing scores (or the batch says how many no-signal
    groups filled it after max_gen_batches), and the data stream advances by the batches sampled."""
    seen = []

    def check(step, batch, run, stats):
        groups: dict[str, list[float]] = {}
        for gid, score in zip(batch.group_ids, batch.scores.tolist()):
            groups.setdefault(gid, []).append(score)
        constant = sum(max(v) == min(v) for v in groups.values())
        assert len(groups) == run.cfg.rollout.prompts_per_step
        assert constant == batch.filled_groups, (constant, batch.filled_groups)
        seen.append(batch.generated_batches)

    cfg = toy(tmp_path, "algorithm=dapo", "rollout.group_size=4", "trainer.checkpoint_every=0")
    run_id = train(cfg, on_step=check)
    history = mlflow_history(tmp_path, run_id)
    assert [history["rollout/generated_batches"][s] for s in range(6)] == seen
    assert sum(seen) > 6  # the skewed toy start solves or fails many groups outright: more batches were sampled
    # max_gen_batches=1: nothing is resampled, no-signal groups fill the batch and are counted
    filled = []
    train(toy(tmp_path / "one", "algorithm=dapo", "algorithm.max_gen_batches=1", "trainer.checkpoint_every=0"),
          on_step=lambda step, batch, run, stats: filled.append((batch.generated_batches, batch.filled_groups)))
    assert all(g == 1 for g, _ in filled) and sum(f for _, f in filled) > 0


def test_rollout_correction_with_an_exact_engine_changes_nothing(tmp_path, mlflow_history):
    """The toy engine samples from a copy of the trainer's own table (log-prob gap at float rounding), so every
    truncated importance weight is 1 to rounding and the run equals the uncorrected one; the mismatch KL is ~0."""
    plain = train(toy(tmp_path / "a", "trainer.checkpoint_every=0"))
    corrected = train(toy(tmp_path / "b", "trainer.checkpoint_every=0", "algorithm.tis_level=sequence"))
    a, b = mlflow_history(tmp_path / "a", plain), mlflow_history(tmp_path / "b", corrected)
    assert a["train/reward"] == b["train/reward"]
    assert a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-6)
    assert all(abs(v - 1) < 1e-5 for v in b["rollout_corr/rollout_is_mean"].values())
    assert all(abs(v) < 1e-9 for v in b["rollout/mismatch_kl"].values())
    assert "rollout_corr/rollout_is_mean" not in a


def test_overlong_filter_masks_truncated_responses_from_the_loss() -> None:
    from rlvrlab.rollout.base import Generation
    from rlvrlab.train.batch import Behaviour, UpdateRows, collate

    gens = [[Generation((1,), (5, 6, 7), "a", (0.0, 0.0, 0.0)), Generation((1,), (5, 2), "b", (0.0, 0.0))]]
    batch = collate(gens, ["g"], [1.0, 0.0], pad_id=0, version=0, batch_index=0, truncated=[True, False])
    rows = UpdateRows(batch, torch.zeros(2, 3), Behaviour.UPDATE_FORWARD)
    assert rows.loss_mask(drop_truncated=False).tolist() == [[1, 1, 1], [1, 1, 0]]
    assert rows.loss_mask(drop_truncated=True).tolist() == [[0, 0, 0], [1, 1, 0]]


@pytest.mark.parametrize("tier,algorithms", [("toy", ("grpo", "ucpo")),
                                             pytest.param("tiny", ("grpo", "dapo_loss"), marks=pytest.mark.slow)])
def test_same_seed_pairs_arms(tmp_path, monkeypatch, tier, algorithms):
    """Why `rlvrlab report` pairs comparisons by seed: two algorithms run with the same seed start from identical
    weights, consume the same prompts in the same order and draw the same sampling seeds, so their first batch of
    responses is identical and every later difference is the algorithms'. Another seed changes the prompt order
    and the sampling seeds (here both tiers start from one fixed initial model: the toy's skewed table, which has no
    seed, and the tiny tier's warm start 0; by default a tiny run's warm start is its own seed's, shared by the arms
    of that seed: tests/policy/test_warm_start_seed.py). Arms with DAPO's dynamic sampling (`dapo`) consume extra
    batches of the stream as they resample, so only their first batch is shared; the loss-only arm `dapo_loss` is
    compared here."""
    import rlvrlab.train.loop as loop

    seen: dict[str, dict] = {}
    original = loop.build

    def spying_build(cfg, **kwargs):
        run = original(cfg, **kwargs)
        record = seen.setdefault(f"{cfg.algorithm.name}-{cfg.seed}", {"calls": []})
        record["weights"] = {k: v.detach().clone() for k, v in run.update.module.state_dict().items()}
        generate = run.rollout.generate

        def spy(prompts, *, n, seed):
            groups = generate(prompts, n=n, seed=seed)
            record["calls"].append((prompts, n, seed, [[g.response_ids for g in group] for group in groups]))
            return groups

        run.rollout.generate = spy
        return run

    monkeypatch.setattr(loop, "build", spying_build)
    base = [f"output_dir={tmp_path}", "steps=3", "trainer.checkpoint_every=0"]
    if tier == "toy":
        compose_args = ("toy", base)
    else:
        compose_args = (None, [*base, "model.warm_start_seed=0", "trainer.engine=torch", "rollout.prompts_per_step=4",
                               "rollout.group_size=4"])
    for algorithm, seed in ((algorithms[0], 3), (algorithms[1], 3), (algorithms[0], 4)):
        train(compose(compose_args[0], [*compose_args[1], f"algorithm={algorithm}", f"seed={seed}"]))
    a, b, other = seen[f"{algorithms[0]}-3"], seen[f"{algorithms[1]}-3"], seen[f"{algorithms[0]}-4"]
    assert a["weights"].keys() == b["weights"].keys()
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    assert len(a["calls"]) == len(b["calls"]) == 3
    assert [(p, n, s) for p, n, s, _ in a["calls"]] == [(p, n, s) for p, n, s, _ in b["calls"]]  # prompts, seeds
    assert a["calls"][0][3] == b["calls"][0][3]  # same weights and seed: the same first responses
    assert [s for _, _, s, _ in other["calls"]] != [s for _, _, s, _ in a["calls"]]
    assert [p for p, _, _, _ in other["calls"]] != [p for p, _, _, _ in a["calls"]]
