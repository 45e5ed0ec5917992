"""The initial model and the environment in every training run's record, and what is bit-identical on one machine
(issue 45, items 1-3): the same toy seed twice gives the same metric series and initial digest; the tiny warm start
does not depend on the thread count; a cached warm start whose weights lost their digest is rebuilt."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rlvrlab import components  # noqa: E402
from rlvrlab.config import compose  # noqa: E402
from rlvrlab.data import load_split, warm_start_targets  # noqa: E402
from rlvrlab.policy import tiny  # noqa: E402
from rlvrlab.tracking import tags as T  # noqa: E402
from rlvrlab.tracking.identity import environment, module_digest  # noqa: E402
from rlvrlab.train.loop import train  # noqa: E402

# the smallest tiny model that still trains (tests/policy/test_warm_start_seed.py): ~1 s a warm start
SMALL = ["model.tiny_layers=1", "model.tiny_hidden=32", "model.tiny_heads=2", "model.warmstart_steps=3",
         "dataset.num_problems=24"]
WALL_CLOCK = ("time/", "rollout/tokens_per_s")  # metrics that measure the machine, not the run


def _tags(output_dir: Path, run_id: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{output_dir.resolve() / 'mlflow.db'}").get_run(run_id).data.tags


def _identity_tags_hold(tags: dict[str, str], cfg) -> None:
    """The run's initial-model tags are what `rlvrlab model digest` computes for its config; every environment key
    is a tag."""
    expected = components.initial_model(cfg, load_split(cfg.dataset, cfg.model))
    assert tags[T.INITIAL_MODEL] == expected.sha256 and tags[T.INITIAL_MODEL_SOURCE] == expected.source
    env = environment()
    assert {T.ENV_PREFIX + key for key in env} <= tags.keys()
    for key in ("python", "torch", "transformers", "numpy", "device", "cpu_capability", "deterministic"):
        assert tags[T.ENV_PREFIX + key] == env[key], key
    assert T.INITIAL_MODEL_OVERRIDE not in tags


def test_the_same_toy_seed_twice_is_bit_identical_with_its_initial_digest(tmp_path, mlflow_history) -> None:
    def run(folder: str) -> tuple[dict, dict]:
        cfg = compose("toy", [f"output_dir={tmp_path / folder}", "steps=6", "seed=3", "trainer.checkpoint_every=0"])
        run_id = train(cfg)
        history = mlflow_history(tmp_path / folder, run_id)
        return {k: v for k, v in history.items() if not k.startswith(WALL_CLOCK)}, _tags(tmp_path / folder, run_id)

    (first, tags_a), (second, tags_b) = run("a"), run("b")
    assert len(first) > 10 and all(len(series) == 6 for name, series in first.items() if name.startswith("train/"))
    assert first == second  # every series, every step, to the bit (floats compared with ==)
    assert tags_a[T.INITIAL_MODEL] == tags_b[T.INITIAL_MODEL] and len(tags_a[T.INITIAL_MODEL]) == 64
    cfg = compose("toy", [f"output_dir={tmp_path / 'a'}", "steps=6", "seed=3"])
    _identity_tags_hold(tags_a, cfg)
    assert tags_a[T.INITIAL_MODEL_SOURCE].startswith("toy:init=")
    assert tags_a[T.ENV_PREFIX + "threads"] == "1"  # the toy tier trains on one thread (rlvrlab.train.lifecycle)


def test_toy_initial_digest_follows_the_initial_table(tmp_path) -> None:
    """Another init or skew is another initial model; the seed is not (the toy table is not random)."""
    def digest(*overrides: str) -> str:
        cfg = compose("toy", [f"output_dir={tmp_path}", *overrides])
        return components.initial_model(cfg, load_split(cfg.dataset, cfg.model)).sha256

    base = digest()
    assert digest("seed=7") == base
    assert digest("model.toy_init_skew=1.0") != base and digest("model.toy_init=uniform") != base


@pytest.mark.slow
def test_tiny_and_real_tier_runs_record_their_initial_model(tmp_path, monkeypatch) -> None:
    """A tiny run's digest is its warm start's (the one digest.json records); a real-tier run on that same folder
    records the same digest, with the folder as its source."""
    monkeypatch.setenv("RLVRLAB_CACHE", str(tmp_path / "cache"))
    common = ["dataset.num_problems=24", "steps=1", "trainer.engine=torch", "trainer.checkpoint_every=0",
              "rollout.prompts_per_step=2", "rollout.group_size=2", f"output_dir={tmp_path / 'runs'}"]
    cfg = compose(None, [*SMALL, *common])
    tags = _tags(tmp_path / "runs", train(cfg))
    _identity_tags_hold(tags, cfg)
    folder = components.model_folder(cfg, load_split(cfg.dataset, cfg.model))
    assert tags[T.INITIAL_MODEL_SOURCE] == f"warm_start:{folder.name}"
    assert json.loads((folder / tiny.DIGEST_FILE).read_text())["sha256"] == tags[T.INITIAL_MODEL]
    real = compose(None, [*common, "model.tier=real", f"model.path={folder}"])
    real_tags = _tags(tmp_path / "runs", train(real))
    assert real_tags[T.INITIAL_MODEL] == tags[T.INITIAL_MODEL]
    assert real_tags[T.INITIAL_MODEL_SOURCE] == f"hf:{folder}"


def _small_build(tmp_path: Path, name: str, steps: int = 3):
    cfg = compose(None, SMALL)
    problems = load_split(cfg.dataset, cfg.model)
    fn = warm_start_targets(cfg.dataset)
    folder = tiny.build_tiny_model(tmp_path / name, corpus=tiny.tokenizer_corpus(problems, fn), layers=1, hidden=32,
                                   heads=2, seed=0)
    return folder, problems, fn


def _folder_digest(folder: Path) -> str:
    return module_digest(components.load_model(folder, torch.float32))


def test_warm_start_digest_does_not_depend_on_threads(tmp_path) -> None:
    """The random init and the warm start with 1 and with 2 torch threads give the same weights to the bit, so the
    cache key leaves the thread count out (rlvrlab.policy.tiny.build_environment). Measured at full size too:
    test_pairs_warm_start_digest_does_not_depend_on_threads."""
    before = torch.get_num_threads()
    digests = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            folder, problems, fn = _small_build(tmp_path, f"t{threads}")
            digests[f"init{threads}"] = _folder_digest(folder)
            tiny.warm_start(folder, problems, steps=20, seed=0, solutions_fn=fn, batch_size=8, threads=threads)
            digests[f"warm{threads}"] = _folder_digest(folder)
    finally:
        torch.set_num_threads(before)
    assert digests["init1"] == digests["init2"] and digests["warm1"] == digests["warm2"] != digests["init1"]


@pytest.mark.slow
def test_pairs_warm_start_digest_does_not_depend_on_threads(tmp_path) -> None:
    """The pairs test bed's warm start (2 x 64, 600 steps; ~20 s a build on 2 cores) trained on 1 and on 2
    threads: the same digest."""
    cfg = compose("pairs", ["seed=0"])
    problems, fn, m = load_split(cfg.dataset, cfg.model), warm_start_targets(cfg.dataset), cfg.model
    corpus = tiny.tokenizer_corpus(problems, fn)
    digests = []
    for threads in (1, 2):
        folder = tiny.build_tiny_model(tmp_path / str(threads), corpus=corpus, layers=m.tiny_layers,
                                       hidden=m.tiny_hidden, heads=m.tiny_heads, seed=0)
        tiny.warm_start(folder, problems, steps=m.warmstart_steps, seed=0, solutions_fn=fn, threads=threads)
        digests.append(_folder_digest(folder))
    assert digests[0] == digests[1]


def test_cache_key_holds_the_build_environment(monkeypatch) -> None:
    cfg = compose(None, SMALL)
    kwargs = dict(layers=1, hidden=32, heads=2, warmstart_steps=3, problems=load_split(cfg.dataset, cfg.model),
                  seed=0, solutions_fn=warm_start_targets(cfg.dataset))
    key = tiny.cache_key(**kwargs)
    assert {"torch", "transformers", "tokenizers", "cpu_capability", "machine"} <= tiny.build_environment().keys()
    for field in tiny.build_environment():
        monkeypatch.setattr(tiny, "build_environment", lambda f=field: {**tiny_environment, f: "other"})
        assert tiny.cache_key(**kwargs) != key, field
        monkeypatch.undo()


tiny_environment = tiny.build_environment()


def test_a_cached_warm_start_whose_digest_does_not_match_is_rebuilt(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLVRLAB_CACHE", str(tmp_path / "cache"))
    cfg = compose(None, SMALL)
    problems = load_split(cfg.dataset, cfg.model)
    folder = components.model_folder(cfg, problems)
    recorded = json.loads((folder / tiny.DIGEST_FILE).read_text())["sha256"]
    assert recorded == _folder_digest(folder)
    info = (folder / "rlvrlab_tiny.json").read_text()

    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1  # the cached weights changed after they were built
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    warnings: list[str] = []
    monkeypatch.setattr(tiny, "_stderr", warnings.append)
    again = components.model_folder(cfg, problems)
    assert again == folder and len(warnings) == 1
    assert "building it again" in warnings[0] and recorded[:12] in warnings[0] and "\n" not in warnings[0]
    assert _folder_digest(again) == recorded  # rebuilt bit for bit
    assert (again / "rlvrlab_tiny.json").read_text() != info  # a new build (its timings differ)
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # the bad one is gone, nothing left beside

    (folder / tiny.DIGEST_FILE).unlink()  # a folder that records no digest is not trusted either
    assert components.model_folder(cfg, problems) == folder and len(warnings) == 2
    assert "no readable digest.json" in warnings[1]
    assert components.model_folder(cfg, problems) == folder and len(warnings) == 2  # intact: used as it is
