"""model.warm_start_seed: which initial model a tiny run starts from, how it is recorded, hashed and resumed."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors.torch")

from rlvrlab import components  # noqa: E402
from rlvrlab.config import compose, config_hash, legacy_overrides, to_yaml, warm_start_seed  # noqa: E402
from rlvrlab.data import load_split  # noqa: E402
from rlvrlab.errors import ConfigError  # noqa: E402
from rlvrlab.tracking import tags as T  # noqa: E402
from rlvrlab.tracking.provenance import flatten, provenance  # noqa: E402

# the smallest tiny model that still trains: ~1 s a warm start, against ~11 s for the default 4 x 128 x 300 steps
SMALL = ["model.tiny_layers=1", "model.tiny_hidden=32", "model.tiny_heads=2", "model.warmstart_steps=3",
         "dataset.num_problems=24"]


def _initial_weights(monkeypatch: pytest.MonkeyPatch, cache: Path, *overrides: str) -> tuple[Path, dict]:
    """The folder and weights of the initial model a run with these overrides starts from, built in `cache`."""
    monkeypatch.setenv("RLVRLAB_CACHE", str(cache))
    cfg = compose(None, [*SMALL, *overrides])
    folder = components.model_folder(cfg, load_split(cfg.dataset, cfg.model))
    return folder, safetensors.load_file(str(folder / "model.safetensors"))


def test_the_warm_start_seed_picks_the_initial_model_and_defaults_to_the_run_seed(tmp_path, monkeypatch) -> None:
    """Three warm starts (~3 s in all): seeds 1 and 2 give other weights; seed 1 built again in an empty cache gives
    the same weights bit for bit; a run with seed 1 and no warm_start_seed starts from warm start 1."""
    fixed_1, weights_1 = _initial_weights(monkeypatch, tmp_path / "a", "seed=0", "model.warm_start_seed=1")
    fixed_2, weights_2 = _initial_weights(monkeypatch, tmp_path / "a", "seed=0", "model.warm_start_seed=2")
    assert fixed_1 != fixed_2 and weights_1.keys() == weights_2.keys()
    assert all(not torch.equal(weights_1[k], weights_2[k]) for k in weights_1 if "norm" not in k)  # norms start at 1
    # the default (null): the run's seed, rebuilt from scratch in another cache, the same weights to the bit
    default_1, again = _initial_weights(monkeypatch, tmp_path / "b", "seed=1")
    assert default_1.name == fixed_1.name  # the same cache key: seed 1's warm start
    assert again.keys() == weights_1.keys() and all(torch.equal(again[k], weights_1[k]) for k in weights_1)
    # ... and another run seed with the same fixed warm start seed reuses that one model
    assert _initial_weights(monkeypatch, tmp_path / "a", "seed=7", "model.warm_start_seed=2")[0] == fixed_2


def test_the_seed_in_use_is_recorded_and_hashed_where_it_matters() -> None:
    run_seed, fixed = compose(None, ["seed=4"]), compose(None, ["seed=4", "model.warm_start_seed=0"])
    assert (warm_start_seed(run_seed), warm_start_seed(fixed)) == (4, 0)
    # MLflow: the resolved config's param (null -> "None", the run's seed) and a tag with the seed in use
    assert flatten({"model": {"warm_start_seed": run_seed.model.warm_start_seed}}) == {"model.warm_start_seed": None}
    assert provenance(run_seed).tags[T.WARM_START_SEED] == "4" and provenance(fixed).tags[T.WARM_START_SEED] == "0"
    assert T.WARM_START_SEED not in provenance(compose("toy")).tags
    # the seeds of a config still share its hash; null and a fixed seed are two designs
    assert config_hash(run_seed) == config_hash(compose(None, ["seed=5"])) != config_hash(fixed)
    assert config_hash(fixed) != config_hash(compose(None, ["model.warm_start_seed=3"]))
    # where it changes nothing it is not hashed: the toy tier (a table without a seed) and tier=real
    assert config_hash(compose("toy")) == config_hash(compose("toy", ["model.warm_start_seed=3"]))
    real = ["model.tier=real", "model.path=/models/m"]
    assert config_hash(compose(None, real)) == config_hash(compose(None, [*real, "model.warm_start_seed=3"]))


def test_bad_warm_start_seeds_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"model.warm_start_seed=-1 is out of range: it must be in \[0, 4294967295\] "
                                          r"\(or null for the run's seed\)"):
        compose(None, ["model.warm_start_seed=-1"])
    with pytest.raises(ConfigError, match="model.warm_start_seed=run: expected an integer or null"):
        compose(None, ["model.warm_start_seed=run"])


def test_a_resumed_run_resolves_to_its_own_warm_start_seed(tmp_path: Path) -> None:
    """The resumed run's config.yaml gives the seed it started with: its own when it was written with the key, and 0
    (every tiny run's warm start then) when it was written before the key existed."""
    written = tmp_path / "config.yaml"
    written.write_text(to_yaml(compose(None, ["seed=3"])))
    assert legacy_overrides(written) == []
    assert warm_start_seed(compose(written, legacy_overrides(written))) == 3
    older = tmp_path / "older.yaml"
    older.write_text("".join(line for line in written.read_text().splitlines(keepends=True)
                             if "warm_start_seed" not in line))
    assert legacy_overrides(older) == ["model.warm_start_seed=0"]
    resumed = compose(older, legacy_overrides(older))
    assert warm_start_seed(resumed) == 0
    assert config_hash(resumed) == config_hash(compose(None, ["seed=3", "model.warm_start_seed=0"]))
