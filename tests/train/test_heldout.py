"""Evaluation during training (trainer.eval_every, rlvrlab.train.heldout): when it runs, what it logs under eval/,
that the exact metrics are those of the policy at that step, the sampled path, and the one-line refusals."""

import math

import pytest

from rlvrlab.algorithms.passk import exact_metrics
from rlvrlab.config import compose
from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.train.heldout import make, metric_names
from rlvrlab.train.loop import train

PAIRS = ["dataset=pairs", "model.tiny_layers=1", "model.tiny_hidden=32", "model.tiny_heads=2",
         "model.warmstart_steps=150", "rollout.max_new_tokens=6", "trainer.engine=torch", "rollout.prompts_per_step=4",
         "rollout.group_size=4", "trainer.eval_problems=8"]


def test_toy_runs_log_the_exact_table_metrics_at_the_evaluated_steps(tmp_path, mlflow_history) -> None:
    cfg = compose("toy", [f"output_dir={tmp_path}", "steps=7", "trainer.eval_every=3", "trainer.checkpoint_every=0"])
    run_id = train(cfg)
    history = mlflow_history(tmp_path, run_id)
    assert sorted(history["eval/train/pass_at_1"]) == [0, 3, 6, 7]  # every 3 steps before the update, and the end
    # step 7's evaluation is of the final policy: the table the last step's own diagnostics were computed from
    assert history["eval/train/pass_at_1"][7] == pytest.approx(history["policy/toy_correct_mass"][6])
    assert history["eval/train/uniformity"][7] == pytest.approx(history["policy/toy_correct_uniformity"][6])
    assert "eval/heldout/pass_at_1" not in history  # the toy tier trains on every problem


@pytest.mark.slow
def test_pairs_runs_log_exact_heldout_metrics_of_the_policy_at_that_step(tmp_path, mlflow_history) -> None:
    from mlflow.tracking import MlflowClient

    from rlvrlab import components
    from rlvrlab.data import load_problems
    from rlvrlab.policy.exact import response_logprobs

    cfg = compose("default", [*PAIRS, f"output_dir={tmp_path}", "steps=3", "trainer.eval_every=2",
                              "trainer.checkpoint_every=0"])
    run_id = train(cfg)
    history = mlflow_history(tmp_path, run_id)
    assert sorted(history["eval/heldout/pass_at_1"]) == [0, 2, 3]
    for name in ("eval/heldout/uniformity", "eval/heldout/max_q", "eval/heldout/coverage_at_16",
                 "eval/heldout/signal", "eval/train/pass_at_1", "eval/heldout/reward", "eval/heldout/in_regime"):
        assert sorted(history[name]) == [0, 2, 3], name
        assert all(math.isfinite(v) for v in history[name].values()), name
    assert MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id).data.tags["eval_method"] == "exact"
    # step 0 is the warm-started policy: its exact metrics, recomputed from the model folder, are the logged ones
    train_problems, held = load_problems(cfg.dataset, cfg.model)
    folder = components.model_folder(cfg, train_problems)
    tok, model = components.load_tokenizer(folder), components.load_model(folder)
    evaluation = make(cfg)
    assert evaluation is not None and evaluation.method == "exact" and evaluation.heldout == held[:8]
    logps = response_logprobs(model, [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in held[:8]],
                              [evaluation.space(p) for p in held[:8]], tokenizer=tok, eos_id=tok.eos_token_id,
                              pad_id=tok.pad_token_id)
    expected = exact_metrics([lp.exp().numpy() for lp in logps], ks=[4, 16, 64], group_size=4)
    for key in ("pass_at_1", "uniformity", "coverage_at_16", "signal"):
        assert history[f"eval/heldout/{key}"][0] == pytest.approx(expected[key], abs=1e-6), key
    assert history["eval/heldout/pass_at_1"][3] != history["eval/heldout/pass_at_1"][0]  # the policy moved


@pytest.mark.slow
def test_sampled_evaluation_where_answers_cannot_be_listed(tmp_path, mlflow_history) -> None:
    cfg = compose("default", [f"output_dir={tmp_path}", "steps=1", "trainer.eval_every=1", "trainer.eval_problems=3",
                              "trainer.eval_n=4", "rollout.prompts_per_step=2", "rollout.group_size=2",
                              "trainer.engine=torch", "trainer.checkpoint_every=0"])
    assert make(cfg).method == "sampled"
    history = mlflow_history(tmp_path, train(cfg))
    for name in ("eval/heldout/reward", "eval/heldout/pass_at_1", "eval/heldout/pass_at_4"):
        assert sorted(history[name]) == [0, 1], name
        assert all(0 <= v <= 1 for v in history[name].values())
    assert history["eval/heldout/pass_at_4"][0] >= history["eval/heldout/pass_at_1"][0]


def test_no_held_out_problems_is_one_line() -> None:
    cfg = compose("default", ["trainer.eval_every=5", "dataset.eval_fraction=0"])
    with pytest.raises(ConfigError, match="holds none out") as caught:
        make(cfg)
    assert "\n" not in str(caught.value)
    with pytest.raises(RlvrlabError, match="trainer.eval_every"):
        compose("default", ["trainer.eval_every=-1"])
    assert make(compose("default", [])) is None


def test_eval_metrics_are_valid_sweep_objectives() -> None:
    from rlvrlab.train.metrics import metric_names as all_names

    assert set(metric_names()) <= set(all_names())
    assert "eval/heldout/pass_at_1" in all_names() and "eval/heldout/uniformity" in all_names()


def test_exact_metric_names_are_the_ones_logged() -> None:
    logged = {f"eval/heldout/{k}" for k in exact_metrics([[0.1, 0.2]], ks=[4, 16, 64], group_size=8)}
    assert logged <= set(metric_names())
