"""Datasets: benchmark YAMLs, JSONL / verl parquet rows -> Problem, one-line errors for malformed rows, splits.

Run: .venv/bin/pytest -q tests/data/test_data.py
"""

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rlvrlab.config import compose, experiments_dir
from rlvrlab.config.schema import DatasetConfig, ModelConfig
from rlvrlab.data import load_problems, load_split
from rlvrlab.data.problems import Problem
from rlvrlab.data.tasks import TASKS
from rlvrlab.errors import RlvrlabError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "benchmarks"

# benchmark -> (rows of the real file, the fixture's answers in file order, its ids)
BENCHMARKS = {
    "aime24": (30, ["33", "376", "19"], ["60", "61", "62"]),
    "amc23": (40, ["210", "10", "36", "1.75"], ["0", "1", "2", "3"]),
    "math500": (500, ["15", "4", "\\frac{3}{4}", "720"], ["0", "1", "2", "3"]),
    "minerva": (272, ["60", "9", "3.4"], ["0", "1", "2"]),
    "olympiadbench": (675, ["$12$", "$3$", "$28$"], ["2001", "2002", "2003"]),
}


def load(dataset: DatasetConfig) -> list[Problem]:
    return load_split(dataset, ModelConfig())


def file_dataset(path: Path, **fields) -> DatasetConfig:
    fmt = "parquet" if path.suffix == ".parquet" else "jsonl"
    return DatasetConfig(**{"name": "mine", "format": fmt, "path": str(path), "split": "all", "eval_fraction": 0.0,
                            **fields})


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def verl_row(index: int, question: str = "What is 1+1?", truth: str | None = "2", source: str = "src") -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": question}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"split": "test", "index": index}}


def one_line_error(dataset: DatasetConfig, *fragments: str) -> str:
    with pytest.raises(RlvrlabError) as caught:
        load(dataset)
    message = str(caught.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- the benchmark YAMLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_benchmark_yaml_composes_and_loads_its_fixture(name: str) -> None:
    rows, answers, ids = BENCHMARKS[name]
    fixture = FIXTURES / f"{name}.jsonl"
    cfg = compose(None, [f"dataset={name}", f"dataset.path={fixture}", "dataset.expected_rows=null"])
    d = cfg.dataset
    assert (d.name, d.format, d.split, d.eval_fraction, d.verifier) == (name, "jsonl", "all", 0.0, "math")
    assert d.use_chat_template and "{prompt}" in d.template and "\\boxed{{}}" in d.template
    assert d.provide and d.provide.startswith("a JSONL file with fields")
    problems = load(d)
    assert [p.answer for p in problems] == answers  # file order: split all does not shuffle
    assert [p.id for p in problems] == ids
    assert all(p.prompt.strip() and p.source == name for p in problems)
    assert load_problems(d, cfg.model) == (problems, [])
    # the shipped file pins the real benchmark's size, and says so in its comments
    shipped = compose(None, [f"dataset={name}"]).dataset
    assert shipped.expected_rows == rows and shipped.path == f"data/benchmarks/{name}.jsonl"
    text = (experiments_dir() / "datasets" / f"{name}.yaml").read_text()
    assert f"{rows} rows" in text and f"{rows} " in shipped.provide


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_benchmark_fixture_follows_the_schema_the_yaml_documents(name: str) -> None:
    """Each fixture row has the prompt and answer fields the YAML reads (the rest of the real schema is optional)."""
    spec = yaml.safe_load((experiments_dir() / "datasets" / f"{name}.yaml").read_text())
    for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert isinstance(row[spec["prompt_field"]], str) and spec["answer_field"] in row


def test_a_benchmark_file_of_the_wrong_size_is_one_line_with_both_counts() -> None:
    cfg = compose(None, ["dataset=aime24", f"dataset.path={FIXTURES / 'aime24.jsonl'}"])
    one_line_error(cfg.dataset, "aime24.jsonl has 3 rows but dataset aime24 expects 30 (dataset.expected_rows)",
                   "HuggingFaceH4/aime_2024", "set dataset.expected_rows=null")
    assert len(load(dataclasses.replace(cfg.dataset, expected_rows=3))) == 3


def test_missing_benchmark_file_names_the_path_and_what_to_provide(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = compose(None, ["dataset=aime24"])
    one_line_error(cfg.dataset, "dataset.path data/benchmarks/aime24.jsonl does not exist",
                   f"(relative to {tmp_path})",
                   "provide a JSONL file with fields problem, answer: the 30 AIME 2024 problems "
                   "(HuggingFaceH4/aime_2024")


def test_missing_file_without_a_hint_says_which_format() -> None:
    one_line_error(file_dataset(Path("/nowhere/data.jsonl")), "dataset.path /nowhere/data.jsonl does not exist;",
                   "point dataset.path at a jsonl file")


# --- verl parquet ------------------------------------------------------------------------------------------


def test_verl_parquet_rows_map_to_problems() -> None:
    cfg = compose(None, ["dataset=ucpo_math10k", f"dataset.path={FIXTURES / 'verl_math.parquet'}", "dataset.split=all"])
    problems = load(cfg.dataset)
    assert problems == [
        Problem("10", "What is $3+4$? Put your final answer within \\boxed{}.", "7", source="fixture/math"),
        Problem("11", "Find the remainder when $2^{10}$ is divided by $1000$.", "24", source="fixture/aime"),
        Problem("12", "Simplify $\\frac{6}{8}$.", "\\frac{3}{4}", source="fixture/math"),
    ]


def test_parquet_without_data_source_or_index_uses_the_dataset_name_and_row_number(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "q0", "answer": "a0"}, {"prompt": "q1", "answer": "a1"}]), path)
    assert load(file_dataset(path)) == [Problem("0", "q0", "a0", "mine"), Problem("1", "q1", "a1", "mine")]


def write_verl(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parquet_null_answer_names_the_0_based_row(tmp_path: Path) -> None:
    path = write_verl(tmp_path / "v.parquet", [verl_row(0), verl_row(1, truth=None)])
    one_line_error(file_dataset(path, answer_field="reward_model.ground_truth"),
                   f"{path} row 1 (0-based) has a null 'reward_model.ground_truth'")


def test_parquet_wrong_nested_field_lists_the_fields_there(tmp_path: Path) -> None:
    path = write_verl(tmp_path / "v.parquet", [verl_row(0)])
    one_line_error(file_dataset(path, answer_field="reward_model.answer"),
                   f"{path} row 0 (0-based) has no field 'reward_model.answer' (fields of reward_model: style, "
                   "ground_truth); set dataset.answer_field to the field that holds it")


def test_parquet_duplicate_index_is_one_line(tmp_path: Path) -> None:
    path = write_verl(tmp_path / "v.parquet", [verl_row(5), verl_row(6), verl_row(5)])
    one_line_error(file_dataset(path, answer_field="reward_model.ground_truth"),
                   f"{path} row 2 (0-based) repeats id '5' of row 0 (0-based)", "must be unique")


def test_unreadable_parquet_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.parquet"
    path.write_text("not parquet\nat all\n")
    one_line_error(file_dataset(path), f"{path} is not a readable parquet file")


# --- malformed JSONL rows ----------------------------------------------------------------------------------

GOOD = {"prompt": "What is 1+1?", "answer": "2"}

MALFORMED = [
    ("missing field", [GOOD, {"prompt": "2+2"}],
     "line 2 has no field 'answer' (fields: prompt); set dataset.answer_field to the field that holds it"),
    ("missing prompt", [{"question": "2+2", "answer": "4"}],
     "line 1 has no field 'prompt' (fields: question, answer); set dataset.prompt_field"),
    ("null answer", [GOOD, {"prompt": "2+2", "answer": None}], "line 2 has a null 'answer'"),
    ("object answer", [{"prompt": "2+2", "answer": {"value": 4}}],
     "line 1 field 'answer' is an object ({'value': 4}), not a string or a number"),
    ("boolean answer", [{"prompt": "2+2", "answer": True}], "line 1 field 'answer' is a boolean (True)"),
    ("two answers", [{"prompt": "x^2=1", "answer": ["1", "-1"]}], "line 1 field 'answer' is a list (['1', '-1'])"),
    ("number prompt", [{"prompt": 4, "answer": "4"}], "line 1 field 'prompt' is a number (4), not a string or chat"),
    ("bad chat prompt", [{"prompt": [{"role": "user"}], "answer": "4"}],
     "line 1 field 'prompt' is a list but not chat messages"),
    ("empty answer", [GOOD, GOOD | {"id": 9}, {"prompt": "2+2", "answer": "  "}], "line 3 has an empty 'answer'"),
    ("empty prompt", [{"prompt": "", "answer": "4"}], "line 1 has an empty 'prompt'"),
    ("empty chat prompt", [{"prompt": [{"role": "user", "content": " "}], "answer": "4"}],
     "line 1 has an empty 'prompt'"),
    ("duplicate id", [GOOD | {"id": 7}, GOOD | {"id": 8}, GOOD | {"id": 7}],
     "line 3 repeats id '7' of line 1; ids (the id field, else extra_info.index, else the row number) must be unique"),
    ("id clashes with a row number", [GOOD | {"id": "1"}, GOOD], "line 2 repeats id '1' of line 1"),
    ("bad id", [GOOD | {"id": [1]}], "line 1 field 'id' is a list ([1]), not a non-empty string or an integer"),
    ("bad data_source", [GOOD | {"data_source": 3}], "line 1 field 'data_source' is a number (3), not a string"),
    ("bad JSON", [GOOD, "{not json"], "line 2 is not JSON (Expecting property name enclosed in double quotes)"),
    ("not an object", ["[1, 2]"], "line 1 is a list ([1, 2]), not a JSON object"),
    ("blank lines count", ["", GOOD, "", {"prompt": "2+2"}], "line 4 has no field 'answer'"),
]


@pytest.mark.parametrize(("rows", "message"), [(r, m) for _, r, m in MALFORMED], ids=[n for n, _, _ in MALFORMED])
def test_malformed_row_is_one_line_naming_file_line_and_field(tmp_path: Path, rows: list, message: str) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    one_line_error(file_dataset(path), f"{path} {message}")


def test_non_utf8_jsonl_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"prompt": "\xff", "answer": "1"}\n')
    one_line_error(file_dataset(path), f"{path} is not UTF-8 text")


def test_empty_file_is_one_line(tmp_path: Path) -> None:
    one_line_error(file_dataset(write_jsonl(tmp_path / "data.jsonl", [""])), "holds no records")


def test_row_values_become_text(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "answer": 27.0}, {"prompt": "b", "answer": 1.5}, {"prompt": "c", "answer": 12},
            {"prompt": "d", "answer": ["$\\frac12$"]},
            {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "e"}], "answer": "5"},
            {"prompt": "f", "answer": "6", "extra_info": {"index": 40}}, {"prompt": "g", "answer": "7", "id": "g-1"}]
    problems = load(file_dataset(write_jsonl(tmp_path / "data.jsonl", rows)))
    assert [(p.id, p.prompt, p.answer) for p in problems] == [
        ("0", "a", "27"), ("1", "b", "1.5"), ("2", "c", "12"), ("3", "d", "$\\frac12$"), ("4", "e", "5"),
        ("40", "f", "6"), ("g-1", "g", "7")]


# --- splits --------------------------------------------------------------------------------------------------


def test_split_all_train_eval(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)])
    every = load(file_dataset(path))
    assert [p.id for p in every] == [str(i) for i in range(20)]
    train = load(file_dataset(path, split="train", eval_fraction=0.25))
    held_out = load(file_dataset(path, split="eval", eval_fraction=0.25))
    assert (len(train), len(held_out)) == (15, 5)
    assert sorted(train + held_out, key=lambda p: int(p.id)) == every
    assert load_problems(file_dataset(path, split="eval", eval_fraction=0.25), ModelConfig()) == (train, held_out)
    assert load(file_dataset(path, split="train", eval_fraction=0.25)) == train  # seeded: the same every time
    assert len(load(file_dataset(path, split="train", eval_fraction=DatasetConfig.eval_fraction))) == 18  # 0.1
    assert len(load(file_dataset(path, split="train"))) == 20  # eval_fraction 0: train is every row, shuffled


def test_empty_eval_split_is_one_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", [GOOD])
    one_line_error(file_dataset(path, split="eval"), "dataset mine split eval is empty: eval_fraction 0.0",
                   "raise dataset.eval_fraction")


def test_split_is_validated() -> None:
    with pytest.raises(RlvrlabError, match="unknown dataset.split 'test'; .*available: train, eval, all$"):
        compose(None, ["dataset.split=test"])
    with pytest.raises(RlvrlabError, match="dataset.split=all reads every row and holds none out, but "
                                           "dataset.eval_fraction=0.1"):
        compose(None, ["dataset.split=all"])
    assert compose(None, ["dataset.split=all", "dataset.eval_fraction=0"]).dataset.split == "all"


# --- synthetic tasks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TASKS))
def test_synthetic_tasks_are_deterministic(name: str) -> None:
    overrides = ["model=toy"] if TASKS[name].toy else []
    cfg = compose(None, [f"dataset={name}", "dataset.num_problems=16", *overrides])
    first = load_problems(cfg.dataset, cfg.model)
    assert first == load_problems(cfg.dataset, cfg.model)
    train, held_out = first
    assert all(p.source == name for p in train + held_out)
    assert len({p.id for p in train + held_out}) == 16
    if name == "countdown":
        assert (len(train), len(held_out)) == (15, 1)  # eval_fraction 0.1 of 16
        assert load_split(dataclasses.replace(cfg.dataset, split="eval"), cfg.model) == held_out


def test_problem_keeps_its_positional_fields() -> None:
    problem = Problem("id-1", "prompt", "answer")
    assert (problem.id, problem.prompt, problem.answer, problem.source) == ("id-1", "prompt", "answer", "")
