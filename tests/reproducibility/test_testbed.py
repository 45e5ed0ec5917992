"""`--protocol FILE` under a protocol that fixes its test bed's initial model (rlvrlab.tracking.testbed): `rlvrlab
train`, `rlvrlab sweep` (in-process and process launchers) and `rlvrlab eval pass-at-k` refuse another initial model
in one line before anything runs; --allow-initial-model-change runs it and says so on the run. Evaluation runs
record their weights' digest, the environment and the code's commit like training runs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))  # the CLI helpers of the fault battery

torch = pytest.importorskip("torch")

from battery import one_line_error, rlvrlab  # noqa: E402

from rlvrlab import components  # noqa: E402
from rlvrlab.config import compose  # noqa: E402
from rlvrlab.data import load_split  # noqa: E402
from rlvrlab.tracking import tags as T  # noqa: E402
from rlvrlab.tracking.identity import environment  # noqa: E402
from rlvrlab.tracking.testbed import Testbed, load  # noqa: E402
from rlvrlab.train.loop import train  # noqa: E402

TOY = ["steps=2", "trainer.checkpoint_every=0"]
OTHER = "ab" * 32  # a digest no model has
SMALL = ["model.tiny_layers=1", "model.tiny_hidden=32", "model.tiny_heads=2", "model.warmstart_steps=3",
         "dataset.num_problems=24"]


def _protocol(folder: Path, digest: str) -> Path:
    path = folder / "protocol.md"
    path.write_text(f"# Pre-registered study\n\n```testbed\ninitial_model_sha256: {digest}\n```\n")
    return path


def _client(output_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{output_dir.resolve() / 'mlflow.db'}")


def _runs(output_dir: Path) -> list:
    if not (output_dir / "mlflow.db").exists():
        return []
    client = _client(output_dir)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _toy_digest(tmp_path: Path) -> str:
    cfg = compose("toy", [f"output_dir={tmp_path}", *TOY])
    return components.initial_model(cfg, load_split(cfg.dataset, cfg.model)).sha256


def test_train_refuses_another_initial_model_in_one_line(tmp_path) -> None:
    protocol = _protocol(tmp_path, OTHER)
    runs = tmp_path / "runs"
    result = rlvrlab("train", "toy", *TOY, f"output_dir={runs}", "--protocol", str(protocol))
    line = one_line_error(result, OTHER[:12], str(protocol), "--allow-initial-model-change")
    assert _toy_digest(tmp_path)[:12] in line
    assert _runs(runs) == []  # stopped before any run was created


def test_train_under_the_protocols_model_or_an_allowed_change(tmp_path) -> None:
    runs = tmp_path / "runs"
    cfg = compose("toy", [f"output_dir={runs}", *TOY])
    same = train(cfg, testbed=load(_protocol(tmp_path, _toy_digest(tmp_path))))
    tags = _client(runs).get_run(same).data.tags
    assert tags[T.INITIAL_MODEL] == _toy_digest(tmp_path) and T.INITIAL_MODEL_OVERRIDE not in tags
    changed = train(cfg, testbed=Testbed(tmp_path / "protocol.md", OTHER, allow_change=True))
    tags = _client(runs).get_run(changed).data.tags
    assert tags[T.INITIAL_MODEL_OVERRIDE] == "true" and tags[T.INITIAL_MODEL_EXPECTED] == OTHER
    assert tags[T.INITIAL_MODEL] == _toy_digest(tmp_path)


def test_a_sweep_passes_the_check_to_its_seed_runs(tmp_path, monkeypatch) -> None:
    """In-process: a refused seed fails its trial with the one line; allowed, the seed run carries the override.
    The process launcher's child `rlvrlab train` gets the same options."""
    from rlvrlab.sweep.launch import train_command
    from rlvrlab.sweep.spec import load_sweep
    from rlvrlab.sweep.workers import run_sweep_file

    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "one.yaml"
    sweep.write_text("experiment: toy\noverrides: [algorithm=ucpo, steps=2, trainer.checkpoint_every=0]\nsampler: grid\nseeds: 1\n"
                     "space:\n  algorithm.tau: [0.0]\nobjective: {metric: train/reward, direction: maximize, "
                     "window: 1}\n")
    refused = run_sweep_file(str(sweep), study="refused", testbed=Testbed(tmp_path / "p.md", OTHER))
    (trial,) = refused.study.get_trials()
    assert trial.state.name == "FAIL" and OTHER[:12] in trial.user_attrs[T.FAIL_REASON]
    run_sweep_file(str(sweep), study="allowed", testbed=Testbed(tmp_path / "p.md", OTHER, allow_change=True))
    seeds = [r for r in _runs(tmp_path / "runs") if r.data.tags.get(T.ROLE) == "seed"]
    assert len(seeds) == 1 and seeds[0].data.tags[T.INITIAL_MODEL_OVERRIDE] == "true"
    assert seeds[0].data.tags[T.INITIAL_MODEL_EXPECTED] == OTHER
    spec = load_sweep(str(sweep), launcher="process")
    import dataclasses

    argv = train_command(dataclasses.replace(spec, testbed=Testbed(tmp_path / "p.md", OTHER, allow_change=True)),
                         ["seed=0"], {})
    assert argv[-3:] == ["--protocol", str(tmp_path / "p.md"), "--allow-initial-model-change"]
    assert "--protocol" not in train_command(spec, ["seed=0"], {})


@pytest.fixture(scope="module")
def small_folder() -> Path:
    """A small warm-started tiny model folder (SMALL; cached once per session)."""
    cfg = compose(None, SMALL)
    return components.model_folder(cfg, load_split(cfg.dataset, cfg.model))


def test_eval_refuses_another_model_in_one_line(tmp_path, small_folder) -> None:
    protocol = _protocol(tmp_path, OTHER)
    runs = tmp_path / "runs"
    result = rlvrlab("eval", "pass-at-k", "--model", str(small_folder), "--dataset", "countdown", "--limit", "2",
                     "--n", "2", "--k", "1", "--output-dir", str(runs), "--out", str(tmp_path / "out"),
                     "--protocol", str(protocol))
    line = one_line_error(result, OTHER[:12], str(protocol), "--allow-initial-model-change", str(small_folder))
    assert components.folder_model(small_folder, torch.float32).sha256[:12] in line
    assert _runs(runs) == [] and not (tmp_path / "out").exists()  # nothing sampled, nothing recorded


def test_an_eval_run_records_its_weights_environment_and_commit(tmp_path, small_folder) -> None:
    from rlvrlab.eval.pipeline import EvalRequest, pass_at_k
    from rlvrlab.tracking.provenance import git_state

    runs = tmp_path / "runs"
    request = EvalRequest(model=small_folder, datasets=("countdown",), limit=2, n=2, k="1", output_dir=runs,
                          out=tmp_path / "out", testbed=Testbed(tmp_path / "p.md", OTHER, allow_change=True))
    (outcome,) = pass_at_k(request)
    tags = _client(runs).get_run(outcome.mlflow_run_id).data.tags
    assert tags[T.INITIAL_MODEL] == components.folder_model(small_folder, torch.float32).sha256
    assert tags[T.INITIAL_MODEL_SOURCE] == f"hf:{small_folder}"
    assert tags[T.INITIAL_MODEL_OVERRIDE] == "true" and tags[T.INITIAL_MODEL_EXPECTED] == OTHER
    assert {T.ENV_PREFIX + key for key in environment()} <= tags.keys()
    sha, dirty, _ = git_state()
    assert tags[T.GIT_SHA] == sha and tags[T.GIT_DIRTY] == str(dirty).lower()


def test_model_digest_prints_what_a_run_records_and_checks_an_expected_digest(tmp_path) -> None:
    digest = _toy_digest(tmp_path)
    shown = rlvrlab("model", "digest", "toy", *TOY, f"output_dir={tmp_path}")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == digest and "source: toy:init=" in shown.stdout
    assert rlvrlab("model", "digest", "toy", *TOY, "--expect", digest[:12]).returncode == 0
    one_line_error(rlvrlab("model", "digest", "toy", *TOY, "--expect", OTHER), digest[:12], OTHER[:12])
    one_line_error(rlvrlab("model", "digest", "toy", "--expect", "xyz"), "--expect 'xyz'")
