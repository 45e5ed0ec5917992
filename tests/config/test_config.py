"""Config composition, validation and hashing.  Run: .venv/bin/pytest -q tests/config/test_config.py"""

import dataclasses
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rlvrlab.algorithms import ADVANTAGES, POLICY_LOSSES
from rlvrlab.config import check_files, compose, config_hash, to_yaml
from rlvrlab.config.rules import KNOB_READERS, RANGES
from rlvrlab.data.tasks import TASKS
from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.rewards import VERIFIERS

WriteTree = Callable[[Path, dict[str, str]], Path]  # the conftest fixture

# --- composition -------------------------------------------------------------------------------------------


@pytest.fixture
def layered(experiments: Path, write_tree: WriteTree) -> Path:
    """An experiment that sets algorithm.tau in its group file (0.3) and again in its body (0.5)."""
    write_tree(
        experiments,
        {
            "algorithms/a.yaml": "name: a\nestimator: ucpo\ntau: 0.3\n",
            "algorithms/b.yaml": "name: b\nestimator: ucpo\ntau: 0.4\nalpha: 1.0\n",
            "layered.yaml": "defaults: {algorithm: a, model: tiny}\nalgorithm: {tau: 0.5}\nsteps: 7\n",
        },
    )
    return experiments


def test_group_file_beats_schema_and_body_beats_group_file(layered: Path) -> None:
    cfg = compose("layered")
    assert (cfg.algorithm.name, cfg.algorithm.tau, cfg.steps) == ("a", 0.5, 7)
    assert cfg.algorithm.alpha == 0.0  # schema default: neither file sets it
    assert cfg.model.tier == "tiny"
    assert cfg.dataset.name == "countdown"  # no dataset in defaults: the schema's


def test_cli_field_override_beats_experiment_body(layered: Path) -> None:
    assert compose("layered", ["algorithm.tau=0.6"]).algorithm.tau == 0.6


def test_cli_group_choice_replaces_the_experiments_choice(layered: Path) -> None:
    cfg = compose("layered", ["algorithm=b"])
    assert (cfg.algorithm.name, cfg.algorithm.alpha) == ("b", 1.0)
    assert cfg.algorithm.tau == 0.5  # the experiment body still beats the group file


def test_field_overrides_apply_after_group_choices_whatever_their_order(layered: Path) -> None:
    assert compose("layered", ["algorithm.tau=0.6", "algorithm=b"]) == compose(
        "layered", ["algorithm=b", "algorithm.tau=0.6"]
    )


def test_default_experiment_is_used_without_a_name(experiments: Path) -> None:
    cfg = compose(None, [])
    assert (cfg.algorithm.estimator, cfg.model.tier, cfg.dataset.name) == ("grpo", "tiny", "countdown")


def test_experiment_path_resolves_groups_next_to_the_file(
    experiments: Path, tmp_path: Path, write_tree: WriteTree
) -> None:
    other = write_tree(
        tmp_path / "elsewhere",
        {"exp.yaml": "defaults: {algorithm: mine}\n", "algorithms/mine.yaml": "name: mine\n"},
    )
    assert compose(other / "exp.yaml").algorithm.name == "mine"
    assert compose(str(other / "exp.yaml")).algorithm.name == "mine"


def test_sections_may_be_given_as_a_mapping_on_the_cli(experiments: Path) -> None:
    assert compose(None, ["rollout={group_size: 4, temperature: 0.7}"]).rollout.group_size == 4


# --- values --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        ("algorithm.eps_high=inf", "eps_high", math.inf),
        ("algorithm.eps_high=.inf", "eps_high", math.inf),
        ("algorithm.eps_high=1", "eps_high", 1.0),
        ("algorithm.dual_clip_c=3", "dual_clip_c", 3.0),
        ("algorithm.dual_clip_c=null", "dual_clip_c", None),
        ("algorithm.unbounded_positive=true", "unbounded_positive", True),
        ("algorithm.kl_coef=1e-3", "kl_coef", 1e-3),  # YAML 1.1 reads 1e-3 as a string; the schema makes it a float
    ],
)
def test_override_values_are_yaml_scalars(experiments: Path, override: str, key: str, expected: object) -> None:
    value = getattr(compose(None, [override]).algorithm, key)
    assert value == expected and type(value) is type(expected)


def test_text_fields_keep_the_text_as_typed(experiments: Path) -> None:
    assert compose(None, ["dataset.template=Q: {prompt} A:"]).dataset.template == "Q: {prompt} A:"


def test_lists_parse_and_convert_to_floats(experiments: Path) -> None:
    assert compose(None, ["trainer.betas=[0,0.99]"]).trainer.betas == [0.0, 0.99]


def test_inf_in_a_yaml_file(experiments: Path, write_tree: WriteTree) -> None:
    write_tree(experiments, {"algorithms/nohigh.yaml": "eps_high: .inf\n"})
    assert compose(None, ["algorithm=nohigh"]).algorithm.eps_high == math.inf


def test_to_yaml_round_trips(experiments: Path) -> None:
    cfg = compose(None, ["algorithm.eps_high=inf", "seed=3"])
    assert yaml.safe_load(to_yaml(cfg)) == dataclasses.asdict(cfg)


def test_the_fast_yaml_is_omegaconfs_on_every_shipped_experiment_and_algorithm() -> None:
    """yaml_and_tree writes config.yaml and the params from dataclasses.asdict; they must be OmegaConf's own, text and
    tree, for every shipped experiment with its own algorithm and with each shipped algorithm that composes into it."""
    from rlvrlab.config import experiments_dir
    from rlvrlab.config.compose import GROUP_FOLDERS, omegaconf_yaml_and_tree, yaml_and_tree

    folder = experiments_dir()  # the shipped folder (conftest unsets RLVRLAB_EXPERIMENTS_DIR)
    algorithms = [p.stem for p in sorted((folder / GROUP_FOLDERS["algorithm"]).glob("*.yaml"))]
    compared = 0
    for experiment in sorted(folder.glob("*.yaml")):
        for overrides in [[], *([f"algorithm={a}"] for a in algorithms)]:
            try:
                cfg = compose(experiment, [*overrides, "algorithm.eps_high=inf"])
            except ConfigError:  # a pair that does not fit together
                continue
            assert yaml_and_tree(cfg) == omegaconf_yaml_and_tree(cfg), (experiment.name, overrides)
            compared += 1
    assert compared > 2 * len(algorithms)


def test_a_config_value_that_is_not_plain_takes_omegaconfs_path() -> None:
    """A value yaml.dump would write as a Python object (a Path where the schema says str) goes through OmegaConf,
    which writes it as the schema's type."""
    from rlvrlab.config.compose import _NotPlain, _plain, omegaconf_yaml_and_tree, yaml_and_tree

    assert _plain({"a": (1, 2.5), "b": {"c": None, "d": [True, "x"]}}) == {"a": [1, 2.5],
                                                                           "b": {"c": None, "d": [True, "x"]}}
    for value in ({"a": {"b": Path("x")}}, {"a": [1, Path("x")]}):
        with pytest.raises(_NotPlain):
            _plain(value)
    cfg = dataclasses.replace(compose(None, ["seed=3"]), output_dir=Path("/somewhere/runs"))
    text, tree = yaml_and_tree(cfg)
    assert (text, tree) == omegaconf_yaml_and_tree(cfg)
    assert tree["output_dir"] == "/somewhere/runs" and "output_dir: /somewhere/runs\n" in text


# --- hash ----------------------------------------------------------------------------------------------------


def test_hash_is_12_hex_digits(experiments: Path) -> None:
    digest = config_hash(compose())
    assert len(digest) == 12 and int(digest, 16) >= 0


def test_hash_ignores_seed_output_dir_and_tracking(experiments: Path) -> None:
    base = config_hash(compose())
    unscientific = ["seed=7", "output_dir=/tmp/elsewhere", "tracking.uri=sqlite:///x.db", "tracking.log_every=5"]
    varied = compose(None, unscientific)
    assert config_hash(varied) == base


def test_hash_changes_with_a_knob(experiments: Path) -> None:
    ucpo = ["algorithm=ucpo"]
    assert config_hash(compose(None, ucpo)) != config_hash(compose(None, [*ucpo, "algorithm.tau=0.3"]))


def test_hash_does_not_depend_on_key_order(experiments: Path, write_tree: WriteTree) -> None:
    write_tree(
        experiments,
        {
            "ab.yaml": "defaults: {algorithm: ucpo, model: tiny}\nsteps: 9\nalgorithm: {tau: 0.4, alpha: 0.5}\n",
            "ba.yaml": "algorithm: {alpha: 0.5, tau: 0.4}\nsteps: 9\ndefaults: {model: tiny, algorithm: ucpo}\n",
        },
    )
    assert config_hash(compose("ab")) == config_hash(compose("ba"))


# --- shipped files -------------------------------------------------------------------------------------------


def test_every_shipped_experiment_and_group_file_validates() -> None:
    checks = check_files()
    assert {check.file.name for check in checks} >= {"default.yaml", "toy.yaml", "tiny.yaml", "countdown.yaml"}
    assert [(check.file.name, check.error) for check in checks if check.error] == []


def test_toy_experiment_trains_the_toy_tier_with_plain_torch() -> None:
    cfg = compose("toy")
    assert (cfg.model.tier, cfg.dataset.name, cfg.trainer.engine, cfg.experiment) == ("toy", "toy", "torch", "toy")


def test_a_real_model_is_chosen_on_the_command_line() -> None:
    assert compose(None, ["model.tier=real", "model.path=/models/qwen"]).model.path == "/models/qwen"


def test_every_algorithm_knob_in_the_schema_is_read_by_something() -> None:
    """Knob readers come from the function signatures; a schema field no function reads would be dead config."""
    import dataclasses

    from rlvrlab import algorithms
    from rlvrlab.config.schema import AlgorithmConfig

    read = {k for registry in (algorithms.ADVANTAGES, algorithms.POLICY_LOSSES) for entry in registry.values()
            for k in entry.knobs}
    for term in (algorithms.entropy_advantage_bonus, algorithms.kl_loss, algorithms.entropy_bonus):
        read |= set(algorithms.knobs(term))
    selectors_and_trainer_terms = {"name", "estimator", "loss", "agg", "loss_scale_factor", "unbounded_positive",
                                   # read by the trainer itself (rlvrlab/train/loop.py): DAPO's rollout side and
                                   # the rollout-trainer mismatch correction
                                   "tis_level", "tis_cap", "dynamic_sampling", "max_gen_batches", "overlong_buffer",
                                   "overlong_penalty", "overlong_filter",
                                   "tis_lower", "tis_batch_normalize", "rollout_rs", "rollout_rs_threshold"}
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    assert fields - selectors_and_trainer_terms == read
    assert set(KNOB_READERS).isdisjoint({f"algorithm.{k}" for k in read})  # derived, never listed twice


def test_every_numeric_algorithm_knob_has_a_range() -> None:
    """A new estimator's or loss's knob needs its RANGES entry; only knobs whose every real value is valid are
    exempt (the clip_cov covariance bounds, which a cross-field rule orders)."""
    import dataclasses

    from rlvrlab import algorithms
    from rlvrlab.config.schema import AlgorithmConfig

    any_real = {"clip_cov_lb", "clip_cov_ub"}
    read = {k for registry in (algorithms.ADVANTAGES, algorithms.POLICY_LOSSES) for entry in registry.values()
            for k in entry.knobs}
    for term in (algorithms.entropy_advantage_bonus, algorithms.kl_loss, algorithms.entropy_bonus):
        read |= set(algorithms.knobs(term))
    numeric = {k for k in read if isinstance(getattr(AlgorithmConfig(), k), (int, float, type(None)))
               and not isinstance(getattr(AlgorithmConfig(), k), bool)}
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    assert numeric <= fields
    assert {k for k in numeric - any_real if f"algorithm.{k}" not in RANGES} == set()


def test_switching_the_loss_supersedes_the_files_knobs_but_an_explicit_knob_must_be_read() -> None:
    cfg = compose(None, ["algorithm=grpo", "algorithm.loss=sapo", "algorithm.agg=seq-mean-token-mean"])
    assert (cfg.algorithm.loss, cfg.algorithm.dual_clip_c) == ("sapo", 3.0)  # grpo.yaml's c is simply unused
    with pytest.raises(ConfigError, match="algorithm.dual_clip_c has no effect with algorithm.loss 'sapo'"):
        compose(None, ["algorithm=grpo", "algorithm.loss=sapo", "algorithm.dual_clip_c=2"])
    with pytest.raises(ConfigError, match="algorithm.tau has no effect"):
        compose(None, ["algorithm=grpo", "algorithm.tau=0.5"])


def test_config_errors_found_before_the_registries_do_not_import_torch(experiments: Path) -> None:
    code = (
        "import sys\nfrom rlvrlab.config import compose\nimport rlvrlab.cli.main\n"
        "for bad in (['rollout.top_p=0'], ['algorithm.tua=1'], ['algorithm.tau=x']):\n"
        "    try: compose(None, bad)\n    except Exception: pass\n"
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- bad input: one line, naming the key ---------------------------------------------------------------------

BAD_OVERRIDES = [
    (["algorithm.tua=0.3"], "unknown key 'algorithm.tua'; did you mean 'algorithm.tau'?"),
    (["algo.tau=0.3"], "did you mean 'algorithm.tau'?"),
    (["rollout.groupsize=4"], "did you mean 'rollout.group_size'?"),
    (["algorithm.tau=abc"], "algorithm.tau=abc: expected a float"),
    (["seed=1.5"], "seed=1.5: expected an integer"),
    (["algorithm.unbounded_positive=maybe"], "algorithm.unbounded_positive=maybe: expected true or false"),
    (["algorithm=ucpo", "algorithm.tau=-0.1"], "algorithm.tau=-0.1 is out of range: it must be in [0, 1]"),
    (["algorithm=ucpo", "algorithm.tau=1.5"], "algorithm.tau=1.5 is out of range: it must be in [0, 1]"),
    (["algorithm.eps_low=-0.1"], "algorithm.eps_low=-0.1 is out of range"),
    (["algorithm.eps_low=1.5"], "algorithm.eps_low=1.5 makes the lower ratio bound 1 - eps_low negative"),
    (["algorithm.eps_high=-1"], "algorithm.eps_high=-1.0 is out of range: it must be >= 0"),
    (["trainer.staleness=-1"], "trainer.staleness=-1 is out of range: it must be in [0, 64]"),
    (["rollout.top_p=0"], "rollout.top_p=0.0 is out of range: it must be in (0, 1]"),
    (["algorithm.dual_clip_c=1"], "algorithm.dual_clip_c=1.0 is out of range: it must be > 1 (or null"),
    (["rollout.group_size=1"], "rollout.group_size=1 is too small for algorithm.estimator 'grpo'"),
    (["algorithm.estimator=passk", "algorithm.passk_k=16"], "algorithm.passk_k=16 exceeds rollout.group_size=8"),
    (["algorithm.estimator=grpoo"], "unknown algorithm.estimator 'grpoo'; did you mean 'grpo'? available: grpo, "),
    (["algorithm.loss=ppo"], "unknown algorithm.loss 'ppo'"),
    (["algorithm.agg=token_mean"], "unknown algorithm.agg 'token_mean'; did you mean 'token-mean'?"),
    (["algorithm.kl_estimator=k4"], "unknown algorithm.kl_estimator 'k4'"),
    (["algorithm=ucp"], "unknown algorithm 'ucp' in "),
    (["model=huge"], "unknown model 'huge' in "),
    (["algorithm.tau=0.3"], "algorithm.tau has no effect with algorithm.estimator 'grpo' (it is read by: "
     f"{', '.join(name for name, e in ADVANTAGES.items() if 'tau' in e.knobs)}); set algorithm.estimator to one of "
     "them or drop the override"),
    (["algorithm.sapo_tau_pos=2"], "algorithm.sapo_tau_pos has no effect with algorithm.loss 'clip'"),
    (["algorithm.loss=sapo", "algorithm.unbounded_positive=true"],
     "algorithm.unbounded_positive has no effect with algorithm.loss 'sapo' (it is read by: "
     f"{', '.join(sorted(name for name, loss in POLICY_LOSSES.items() if loss.up_compatible))})"),
    (["trainer.engine=torch", "trainer.zero_stage=2"], "trainer.zero_stage has no effect with trainer.engine 'torch'"),
    (["trainer.zero_stage=4"], "unknown trainer.zero_stage '4'"),
    (["dataset.verifier=maths"],
     f"unknown dataset.verifier 'maths'; did you mean 'math'? available: {', '.join(VERIFIERS)}"),
    (["rollout.engine=sglang"], "unknown rollout.engine 'sglang'; available: hf, vllm"),
    (["trainer.engine=fsdp"], "unknown trainer.engine 'fsdp'; available: deepspeed, torch"),
    (["dataset.name=countdwn"], f"unknown synthetic dataset.name 'countdwn'; did you mean 'countdown'? available: "
     f"{', '.join(sorted(TASKS))}; a file's data needs dataset.format=jsonl or parquet and dataset.path"),
    (["model.tier=real"], "model.tier=real needs model.path"),
    (["model.path=/models/qwen"], "model.path has no effect with model.tier 'tiny'"),
    (["dataset.format=jsonl"], "dataset.format=jsonl needs dataset.path"),
    (["dataset.split=bogus"], "unknown dataset.split 'bogus'; available: train, eval, all"),
    (["dataset.split=all"], "dataset.split=all reads every row and holds none out, but dataset.eval_fraction=0.1"),
    (["dataset.expected_rows=30"], "dataset.expected_rows has no effect with dataset.format 'synthetic'"),
    (["dataset.provide=a file"], "dataset.provide has no effect with dataset.format 'synthetic'"),
    (["dataset.format=jsonl", "dataset.path=x.jsonl", "dataset.expected_rows=0"],
     "dataset.expected_rows=0 is out of range: it must be in [1, 1000000000000] (or null to turn it off)"),
    (["dataset.template=Q: {question}"], "dataset.template has no {prompt} placeholder"),
    (["model=toy"], "model.tier=toy with dataset countdown: the toy policy answers only the toy dataset"),
    (["model.dtype=bfloat16", "trainer.engine=torch"], "model.dtype=bfloat16 trains with DeepSpeed's bf16 mixed precision"),
    (["model.dtype=bfloat16", "trainer.grad_accum_fp32=true"], "trainer.grad_accum_fp32=true at trainer.zero_stage=0: "
     "DeepSpeed 0.19.8 cannot accumulate fp32 gradients of a bf16 model without ZeRO (NotImplementedError); set "
     "trainer.zero_stage to 1, 2 or 3, or trainer.grad_accum_fp32=false"),
    (["model=toy", "dataset=toy", "model.toy_num_correct=16"], "model.toy_num_correct=16 must be below model.toy_num_responses=16"),
    (["trainer.mini_batches=3"], "trainer.mini_batches=3 does not divide the 64 responses per step"),
    (["trainer.betas=[0.9]"], "trainer.betas=[0.9] must be two values"),
    (["algorithm.loss=clip_cov", "algorithm.clip_cov_lb=6"], "algorithm.clip_cov_ub=5.0 must be greater than"),
    (["algorithm.tau"], "override 'algorithm.tau' is not key=value"),
    (["algorithm.tau=[1"], "algorithm.tau=[1: not a YAML value"),
    (["rollout=3"], "rollout is a section, not a value"),
    (["algorithm.name=${nope}"], "cannot resolve algorithm.name"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_OVERRIDES, ids=[" ".join(o) for o, _ in BAD_OVERRIDES])
def test_bad_override_is_one_line_naming_the_key(experiments: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(RlvrlabError) as caught:
        compose(None, overrides)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unknown_key_in_a_group_file_names_the_file(experiments: Path, write_tree: WriteTree) -> None:
    write_tree(experiments, {"algorithms/typo.yaml": "name: typo\ntua: 0.3\n"})
    with pytest.raises(RlvrlabError, match=r"unknown key 'algorithm.tua' in .*typo.yaml; did you mean 'algorithm.tau'"):
        compose(None, ["algorithm=typo"])


def test_wrong_type_in_an_experiment_file_names_the_file(experiments: Path, write_tree: WriteTree) -> None:
    write_tree(experiments, {"bad.yaml": "rollout: {group_size: many}\n"})
    with pytest.raises(RlvrlabError, match=r"rollout.group_size=many in .*bad.yaml: expected an integer"):
        compose("bad")


def test_invalid_yaml_is_one_line_with_the_line_number(experiments: Path, write_tree: WriteTree) -> None:
    write_tree(experiments, {"broken.yaml": "steps: 3\nrollout: [oops\n"})
    with pytest.raises(RlvrlabError, match=r"broken.yaml is not valid YAML: .* at line \d+$"):
        compose("broken")


def test_unknown_experiment_lists_what_exists(experiments: Path) -> None:
    expected = r"unknown experiment 'defualt' in .*; did you mean 'default'\? available: default, toy$"
    with pytest.raises(RlvrlabError, match=expected):
        compose("defualt")


def test_defaults_must_name_known_groups(experiments: Path, write_tree: WriteTree) -> None:
    write_tree(experiments, {"typo.yaml": "defaults: {modle: toy}\n"})
    with pytest.raises(RlvrlabError, match="unknown group 'modle' in defaults of .*; did you mean 'model'"):
        compose("typo")


def test_missing_experiments_folder_says_how_to_point_at_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLVRLAB_EXPERIMENTS_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(RlvrlabError, match="set RLVRLAB_EXPERIMENTS_DIR"):
        compose()


def test_check_files_reports_each_broken_file(experiments: Path, write_tree: WriteTree) -> None:
    write_tree(experiments, {"algorithms/typo.yaml": "tua: 0.3\n"})
    failures = {check.file.name: check.error for check in check_files() if check.error}
    assert list(failures) == ["typo.yaml"]
    assert "did you mean 'algorithm.tau'" in failures["typo.yaml"]


def test_micro_batches_packed_by_tokens_only_for_losses_that_sum_over_micro_batches() -> None:
    """trainer.micro_batch_tokens regroups rows; a loss that picks tokens within each micro-batch would change."""
    for name, loss in POLICY_LOSSES.items():
        args = [f"algorithm.loss={name}", "trainer.micro_batch_tokens=512"]
        if loss.micro_batch_exact:
            assert compose(None, args).trainer.micro_batch_tokens == 512
        else:
            with pytest.raises(ConfigError, match=f"algorithm.loss '{name}' picks tokens within each micro-batch"):
                compose(None, args)
    with pytest.raises(ConfigError, match="trainer.micro_batch_tokens=0 is out of range"):
        compose(None, ["trainer.micro_batch_tokens=0"])


def test_packing_by_length_is_the_default_experiments_and_yields_where_it_must() -> None:
    """The default experiment packs rows by length (trainer.pack_by_length); a loss that picks tokens within each
    micro-batch is refused with the fix; an explicit budget on the command line takes its place, and setting both
    on one layer is the error of a knob nothing reads."""
    from rlvrlab.config.schema import RunConfig

    assert compose(None).trainer.pack_by_length and not RunConfig().trainer.pack_by_length
    for name, loss in POLICY_LOSSES.items():
        if loss.micro_batch_exact:
            assert compose(None, [f"algorithm.loss={name}"]).trainer.pack_by_length
        else:
            with pytest.raises(ConfigError, match=f"'{name}' picks tokens .* add trainer.pack_by_length=false"):
                compose(None, [f"algorithm.loss={name}"])
            assert not compose(None, [f"algorithm.loss={name}", "trainer.pack_by_length=false"]).trainer.pack_by_length
    assert compose(None, ["trainer.micro_batch_tokens=300"]).trainer.micro_batch_tokens == 300
    with pytest.raises(ConfigError, match="trainer.pack_by_length has no effect with trainer.micro_batch_tokens "
                                          "'300'.*set trainer.micro_batch_tokens=null or drop the override"):
        compose(None, ["trainer.micro_batch_tokens=300", "trainer.pack_by_length=true"])
