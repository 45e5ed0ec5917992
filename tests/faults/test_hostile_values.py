"""Hostile values refused before anything runs (issue 44, item 3): text that is not UTF-8 (a lone surrogate from a
non-UTF-8 argv byte or a YAML escape), sizes and skews no run can mean, an experiment name MLflow refuses, an
output_dir that cannot be written. Each is one `error: ` line on stderr, exit status 1, no traceback, and nothing
written; and every run that ends FAILED says why (its rlvrlab.fail_reason tag), whatever raised."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from battery import one_line_error, rlvrlab, snapshot

from rlvrlab.config import compose, memory
from rlvrlab.config.compose import FIELD_TYPES
from rlvrlab.config.ranges import RANGES
from rlvrlab.config.rules import MAX_EXPERIMENT_NAME
from rlvrlab.errors import ConfigError, RlvrlabError
from rlvrlab.outputs import check_dir
from rlvrlab.tracking import tags as T

FF = b"\xff".decode("utf-8", "surrogateescape")  # '\udcff': what Python makes of the argv byte 0xff
E9 = b"\xe9".decode("utf-8", "surrogateescape")  # Latin-1's e-acute


@pytest.fixture
def untouched(tmp_path: Path):
    """The test's folder (the command's cwd, its output_dir below it): nothing in it may change."""
    (tmp_path / "existing.txt").write_text("kept\n")
    before = snapshot(tmp_path)
    yield tmp_path
    assert snapshot(tmp_path) == before


def _out(folder: Path) -> str:
    return f"output_dir={folder / 'runs'}"


# --- text that is not UTF-8 ------------------------------------------------------------------------------------

SURROGATE_ARGS = [
    pytest.param(["train", "toy", "steps=2", f"experiment=a{FF}b"], "the value of experiment", id="train-experiment"),
    pytest.param(["train", "toy", "steps=2", "--tag", f"team=rl{FF}"], "the value of --tag", id="train-tag-value"),
    pytest.param(["train", "toy", "steps=2", "--tag", f"{E9}quipe=rl"], "the value of --tag", id="train-tag-key"),
    pytest.param(["train", "toy", "steps=2", f"--tag=team={FF}"], "the value of --tag", id="train-tag-equals"),
    pytest.param(["train", f"toy{FF}", "steps=2"], "argument 2", id="train-experiment-file"),
    pytest.param(["config", "show", "toy", f"dataset.name={FF}"], "the value of dataset.name", id="show-name"),
    pytest.param(["config", "show", "toy", f"dataset.template=caf{E9} {{prompt}}"], "the value of dataset.template",
                 id="show-template"),
    pytest.param(["config", "show", "toy", f"seed={FF}"], "the value of seed", id="show-int-field"),
    pytest.param(["config", "show", "toy", f"rollout.group{FF}=3"], "argument 4", id="show-key"),
    pytest.param(["sweep", "sweeps/ucpo_tau.yaml", "--name", f"study{FF}"], "the value of --name", id="sweep-name"),
    pytest.param(["report", "--group-by", f"algo{FF}"], "the value of --group-by", id="report-group-by"),
]


@pytest.mark.parametrize(("args", "names"), SURROGATE_ARGS)
def test_argv_bytes_that_are_not_utf8_are_one_line(untouched: Path, args: list[str], names: str) -> None:
    if args[0] == "train":
        args = [*args, _out(untouched)]
    line = one_line_error(rlvrlab(*args, cwd=untouched), names, "is not UTF-8 text", "retype it in UTF-8")
    assert line.isascii()  # printable anywhere: the byte is quoted, never echoed raw
    assert "(the byte 0x" in line


def test_text_not_utf8_in_a_file_or_the_environment_is_refused_at_composition(untouched: Path) -> None:
    """What no argv check sees: a YAML "\\udcff" escape in an experiment file, and an ${oc.env:...} value."""
    experiment = untouched / "bad.yaml"
    experiment.write_text('defaults: {algorithm: grpo, model: toy, dataset: toy}\nexperiment: "x\\udcff"\n')
    try:
        one_line_error(rlvrlab("config", "show", str(experiment), cwd=untouched), "experiment", "is not UTF-8 text")
    finally:
        experiment.unlink()
    result = rlvrlab("config", "show", "toy", "output_dir=${oc.env:HOSTILE_DIR}", cwd=untouched,
                     env={"HOSTILE_DIR": f"/tmp/caf{E9}"})
    one_line_error(result, "output_dir", "'/tmp/caf\\udce9'", "(the byte 0xe9) is not UTF-8 text")


def test_every_text_value_of_the_config_is_checked() -> None:
    """Lists, and mappings' keys and values, too (dataset.fewshot, model.architecture)."""
    for override, key in ([f"dataset.system_prompt=x{FF}", "dataset.system_prompt"],
                          [f"dataset.fewshot=[[q{FF}, a]]", "dataset.fewshot"],
                          [f"model.architecture={{a{FF}: 1}}", "model.architecture"]):
        with pytest.raises(ConfigError, match=rf"^{key}.*is not UTF-8 text"):
            compose("default", [override])


# --- sizes, counts and skews that cannot be meant ------------------------------------------------------------------


def _above(key: str) -> str:
    """A value just above RANGES[key]'s upper bound, as typed in an override."""
    high = RANGES[key].high
    return str(int(high) + 1) if FIELD_TYPES[key] in (int, int | None) else repr(high * 2)


BOUNDED = sorted(key for key, allowed in RANGES.items() if math.isfinite(allowed.high))


@pytest.mark.parametrize("key", BOUNDED)
def test_every_bounded_knob_refuses_a_value_above_its_bound(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}=\S+ is out of range: it must be in [\[(].*[\])]"):
        compose("toy", [f"{key}={_above(key)}"])


def test_every_integer_knob_is_bounded() -> None:
    """A count or size without an upper bound asks for what cannot exist (1e30 rows, 1e11 responses)."""
    integers = [key for key in RANGES if FIELD_TYPES[key] in (int, int | None)]
    assert integers and [key for key in integers if not math.isfinite(RANGES[key].high)] == []


ISSUE_VALUES = [  # issue 44's, and their neighbours
    pytest.param("rollout.group_size=" + "1" + "0" * 30, "rollout.group_size=1000000000000000000000000000000 is out "
                 "of range: it must be in [1, 65536]", id="group_size-1e30"),
    pytest.param("rollout.group_size=1e30", "rollout.group_size=1e30: expected an integer", id="group_size-1e30-float"),
    pytest.param("model.toy_num_responses=100000000000", "model.toy_num_responses=100000000000 is out of range: it "
                 "must be in [2, 1048576]", id="toy_num_responses-1e11"),
    pytest.param("model.toy_init_skew=1e308", "model.toy_init_skew=1e+308 is out of range: it must be in [0, 100]",
                 id="toy_init_skew-1e308"),
    pytest.param("model.toy_init_skew=.inf", "model.toy_init_skew=inf is out of range", id="toy_init_skew-inf"),
    pytest.param("rollout.prompts_per_step=65537", "must be in [1, 65536]", id="prompts_per_step"),
    pytest.param("steps=1000000000", "steps=1000000000 is out of range: it must be in [1, 100000000]", id="steps"),
    pytest.param("dataset.num_problems=100000000", "must be in [1, 16777216]", id="num_problems"),
    pytest.param("rollout.group_size=" + "9" * 5000, "a number of more than 4300 digits", id="5000-digits"),
    pytest.param("seed=2020-13-45", "seed=2020-13-45: cannot read it (month must be in 1..12)", id="not-a-date"),
]


@pytest.mark.parametrize(("override", "message"), ISSUE_VALUES)
def test_issue_values_are_refused_before_training(untouched: Path, override: str, message: str) -> None:
    one_line_error(rlvrlab("train", "toy", "steps=2", _out(untouched), override, cwd=untouched), message)


def test_a_toy_table_larger_than_the_machine_is_refused(untouched: Path) -> None:
    """Each size within its bound, their product (2^44 cells) beyond any machine's memory."""
    result = rlvrlab("train", "toy", "steps=2", _out(untouched), "model.toy_num_responses=1048576",
                     "dataset.num_problems=16777216", cwd=untouched)
    one_line_error(result, "the toy tier needs ~", "dataset.num_problems=16777216 x model.toy_num_responses=1048576",
                   "GiB of memory; lower one of them")


def test_the_toy_estimate_is_held_to_the_memory_given() -> None:
    cfg = compose("toy")
    need = memory.check_toy_fits(cfg, available=2**40)
    assert 0 < need < 2**20  # the shipped toy run: well under a MiB
    with pytest.raises(ConfigError, match="the toy tier needs"):
        memory.check_toy_fits(cfg, available=need - 1)
    assert memory.toy_bytes(compose("toy", ["rollout.group_size=64"])) > need


# --- experiment names -------------------------------------------------------------------------------------------


def test_the_experiment_name_limit_is_mlflows() -> None:
    from mlflow.utils.validation import MAX_EXPERIMENT_NAME_LENGTH

    assert MAX_EXPERIMENT_NAME == MAX_EXPERIMENT_NAME_LENGTH
    assert compose("toy", ["experiment=" + "x" * MAX_EXPERIMENT_NAME]).experiment == "x" * MAX_EXPERIMENT_NAME


@pytest.mark.parametrize("name", ["x" * (MAX_EXPERIMENT_NAME + 1), "é" * 5000])
def test_an_experiment_name_mlflow_refuses_is_refused_at_composition(untouched: Path, name: str) -> None:
    one_line_error(rlvrlab("train", "toy", "steps=2", _out(untouched), f"experiment={name}", cwd=untouched),
                   f"experiment is {len(name)} characters long, more than the 500 MLflow allows")


def test_an_empty_experiment_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="experiment is empty"):
        compose("toy", ["experiment=''"])


# --- output folders that cannot be written ----------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["/proc/rlvrlab-runs", "/proc/self/rlvrlab/runs", "/sys/rlvrlab-runs"])
def test_an_output_dir_that_cannot_be_written_is_refused_at_the_start(untouched: Path, folder: str) -> None:
    top = Path("/", folder.split("/")[1])
    if not top.is_dir():
        pytest.skip(f"no {top} here")
    result = rlvrlab("train", "toy", "steps=2", f"output_dir={folder}", cwd=untouched)
    one_line_error(result, f"output_dir={folder}: cannot write in /", "give a folder you can write in")
    assert not Path(folder).exists()


def test_the_write_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "kept").write_text("x")
    before = snapshot(tmp_path)
    assert check_dir(tmp_path, "output_dir") == tmp_path.resolve()
    assert check_dir(tmp_path / "new" / "deeper", "output_dir") == (tmp_path / "new" / "deeper").resolve()
    assert snapshot(tmp_path) == before  # no probe file left, no folder created


# --- every FAILED run says why --------------------------------------------------------------------------------


def _run_tags(output_dir: Path) -> tuple[str, dict[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{output_dir.resolve() / 'mlflow.db'}")
    runs = [run for experiment in client.search_experiments() for run in
            client.search_runs([experiment.experiment_id])]
    assert len(runs) == 1
    return runs[0].info.status, runs[0].data.tags


def test_an_unexpected_error_inside_a_step_leaves_the_run_failed_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvrlab.train import loop

    real_step = loop.train_step

    def breaks_at_step_one(run, state, step, **kwargs):
        if step == 1:
            raise ValueError("something nobody foresaw\nand a second line")
        return real_step(run, state, step, **kwargs)

    monkeypatch.setattr(loop, "train_step", breaks_at_step_one)
    cfg = compose("toy", ["steps=3", f"output_dir={tmp_path / 'runs'}"])
    with pytest.raises(ValueError, match="something nobody foresaw"):
        loop.train(cfg)
    status, tags = _run_tags(tmp_path / "runs")
    assert status == "FAILED"
    assert tags[T.FAIL_REASON] == "ValueError: something nobody foresaw"


def test_a_setup_that_fails_after_the_run_is_recorded_leaves_it_failed_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's MLflow record exists before the last of its setup (held-out evaluation, the verifier pool): an error
    there ends it FAILED with its reason, not RUNNING for ever."""
    from rlvrlab.train import loop, setup

    def broken(cfg, policy):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(setup, "_heldout", broken)
    cfg = compose("toy", ["steps=3", f"output_dir={tmp_path / 'runs'}"])
    with pytest.raises(OSError, match="Input/output error"):
        loop.train(cfg)
    status, tags = _run_tags(tmp_path / "runs")
    assert status == "FAILED"
    assert tags[T.FAIL_REASON] == "OSError: [Errno 5] Input/output error"


def test_a_failure_rlvrlab_words_itself_also_tags_the_reason(tmp_path: Path) -> None:
    """The non-finite check's one line (a value that passes validation and breaks the weights) and the tag agree."""
    line = one_line_error(rlvrlab("train", "toy", "steps=2", _out(tmp_path), "trainer.weight_decay=1e308",
                                  cwd=tmp_path), "weight norm after the update is nan", "marked FAILED")
    status, tags = _run_tags(tmp_path / "runs")
    assert status == "FAILED"
    assert tags[T.FAIL_REASON] == "RlvrlabError: " + line.removeprefix("error: ")
    assert tags[T.NONFINITE_STEP] == "0"


def test_the_reason_is_one_line_of_bounded_length() -> None:
    from rlvrlab.tracking.tags import FAIL_REASON_CHARS, failure_reason

    assert failure_reason(RuntimeError("x" * 10_000 + "\nmore")) == ("RuntimeError: " + "x" * 10_000)[:FAIL_REASON_CHARS]
    assert failure_reason(KeyError()) == "KeyError"
    assert failure_reason(RlvrlabError("  \n")) == "RlvrlabError"
