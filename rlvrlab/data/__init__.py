"""Problems: what a prompt asks and what the verifier checks the response against.

`load_problems(dataset, model)` returns (train, eval) lists of Problem for any dataset config: a synthetic
task (rlvrlab.data.tasks.TASKS) generated from a fixed seed, or a JSONL / Parquet file with a prompt and an
answer field.
`load_split(dataset, model)` returns the one list that `dataset.split` names:

    train  the problems left after holding out the last eval_fraction of a fixed (seeded) shuffle
    eval   the held-out problems
    all    every row in file order, nothing held out (eval_fraction must be 0): what benchmarks use

File rows. A row is a JSON object (one per line of a JSONL file) or a Parquet row, and gives
    dataset.prompt_field   a string, or chat messages [{"role": "user", "content": ...}] (verl's `prompt`;
                           the last user turn is the prompt)
    dataset.answer_field   a string or a number (27.0 is read as "27"), or a list of exactly one of them;
                           dotted names reach into nested fields (verl: reward_model.ground_truth)
    id                     optional, a string or an integer; else verl's extra_info.index; else the row's
                           0-based position among the file's rows. Ids must be unique.
    data_source            optional (verl), the Problem's source; else the dataset's name
Empty prompts or answers are errors. Every malformed row is reported as one line that names the file, the row
(JSONL: its 1-based line; Parquet: its 0-based row index, as pyarrow and pandas count) and the field.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from rlvrlab.data.problems import AnswersFn, DatasetSection, ModelSection, Problem, ResponsesFn
from rlvrlab.data.tasks import TASKS, synthetic_task
from rlvrlab.errors import ConfigError, RlvrlabError

# Synthetic data does not depend on the run seed: seeds of one configuration train on the same problems
# (and the tiny tier on the same warm-started model), as runs from one pretrained checkpoint would.
DATA_SEED = 0


def warm_start_targets(dataset: DatasetSection) -> ResponsesFn:
    """What the tiny tier's warm start fine-tunes on for this dataset (its Task's warm_start). A one-line
    ConfigError, before any model is built, for a file's data, a task that gives none, and prompts the dataset
    formats: the warm start fine-tunes on bare prompts, and RL on formatted ones would start from nothing learnt."""
    task = synthetic_task(dataset)
    if task is None or task.warm_start is None:
        trainable = [f"dataset={name}" for name, t in TASKS.items() if t.warm_start is not None]
        what = (f"task {dataset.name} has none (its Task has warm_start=None)" if task is not None
                else f"dataset {dataset.name} is a {dataset.format} file, which has none")
        raise ConfigError(f"model.tier=tiny builds its model from scratch and warm-starts it on a synthetic task's "
                          f"targets (rlvrlab.data.tasks), and {what}: train the tiny tier on "
                          f"{' or '.join(trainable)}, or a pretrained model (model.tier=real model.path=...) on "
                          f"{dataset.name}")
    formatting = {"dataset.template": (dataset.template is not None, "null"),
                  "dataset.use_chat_template": (dataset.use_chat_template, "false"),
                  "dataset.system_prompt": (dataset.system_prompt is not None, "null"),
                  "dataset.fewshot": (bool(dataset.fewshot), "[]")}
    formatted = {key: off for key, (on, off) in formatting.items() if on}
    if formatted:
        raise ConfigError(f"model.tier=tiny warm-starts its model on the task's bare prompts, but dataset "
                          f"{dataset.name} formats them ({', '.join(formatted)}); add "
                          f"{' '.join(f'{key}={off}' for key, off in formatted.items())} to train the tiny tier on "
                          "it, or use a pretrained model (model.tier=real model.path=...)")
    return task.warm_start


def answer_space(dataset: DatasetSection) -> AnswersFn | None:
    """problem -> every response string the verifier scores correct, for tasks whose correct set can be listed in
    full (Task.answer_space: pairs); None for the others. With it, pass@1, q over the correct set and coverage are
    computed exactly from the policy's probabilities (rlvrlab.policy.exact) instead of estimated from samples."""
    task = synthetic_task(dataset)
    return task.answer_space if task is not None else None


def load_problems(dataset: DatasetSection, model: ModelSection) -> tuple[list[Problem], list[Problem]]:
    """(train, eval): the last eval_fraction of the problems, after a fixed shuffle, is held out.
    With dataset.split=all: (every problem in file order, [])."""
    task = synthetic_task(dataset)
    if task is None and dataset.format == "synthetic":  # the config rules refuse this; a section built in code not
        raise ConfigError(f"unknown synthetic dataset.name {dataset.name!r}; available: {', '.join(sorted(TASKS))}")
    problems = task.problems(dataset, model, DATA_SEED) if task is not None else _read_file(dataset)
    problems = [p if p.source else dataclasses.replace(p, source=dataset.name) for p in problems]
    if task is not None and task.toy:
        return problems, []  # toy problems are rows of the policy table; all are trained
    if dataset.split == "all":
        return problems, []  # the config rules keep eval_fraction at 0 here
    order = np.random.default_rng(DATA_SEED).permutation(len(problems))
    held = int(len(problems) * dataset.eval_fraction)
    shuffled = [problems[i] for i in order]
    train, held_out = shuffled[: len(problems) - held], shuffled[len(problems) - held :]
    if not train:
        raise RlvrlabError(f"dataset {dataset.name}: no training problems left after eval_fraction "
                           f"{dataset.eval_fraction}; lower dataset.eval_fraction")
    return train, held_out


def load_split(dataset: DatasetSection, model: ModelSection) -> list[Problem]:
    """The problems dataset.split names: train, eval (the held-out part) or all (every row, file order)."""
    train, held_out = load_problems(dataset, model)
    if dataset.split != "eval":
        return train
    if not held_out:
        raise RlvrlabError(f"dataset {dataset.name} split eval is empty: eval_fraction {dataset.eval_fraction} "
                           f"holds out none of its {len(train)} problems; raise dataset.eval_fraction or set "
                           "dataset.split=all")
    return held_out


def _read_file(dataset: DatasetSection) -> list[Problem]:
    if dataset.path is None:  # the config rules refuse this; a section built in code not
        raise ConfigError(f"dataset.format={dataset.format} needs dataset.path; set dataset.path=/path/to/data."
                          f"{dataset.format}")
    path = Path(dataset.path).expanduser()
    if not path.is_file():
        raise RlvrlabError(_missing_file(dataset, path))
    rows = _read_rows(path, dataset.format)
    if not rows:
        raise RlvrlabError(f"{path} holds no records; a {dataset.format} file with one problem per record is needed")
    if dataset.expected_rows is not None and len(rows) != dataset.expected_rows:
        hint = f" ({dataset.provide})" if dataset.provide else ""
        raise RlvrlabError(
            f"{path} has {len(rows)} rows but dataset {dataset.name} expects {dataset.expected_rows} "
            f"(dataset.expected_rows); point dataset.path at the complete file{hint}, or set "
            "dataset.expected_rows=null to use this file as it is"
        )
    problems: list[Problem] = []
    first_seen: dict[str, str] = {}  # id -> the row that used it first
    for index, (where, row) in enumerate(rows):
        at = f"{path} {where}"
        prompt = _prompt_text(_field(row, dataset.prompt_field, at, "dataset.prompt_field"), dataset.prompt_field, at)
        answer = _answer_text(_field(row, dataset.answer_field, at, "dataset.answer_field"), dataset.answer_field, at)
        problem_id = _row_id(row, index, at)
        if problem_id in first_seen:
            raise RlvrlabError(
                f"{at} repeats id {problem_id!r} of {first_seen[problem_id]}; ids (the id field, else "
                "extra_info.index, else the row number) must be unique: fix or remove the duplicate row"
            )
        first_seen[problem_id] = where
        problems.append(Problem(id=problem_id, prompt=prompt, answer=answer, source=_source(row, at)))
    return problems


def _missing_file(dataset: DatasetSection, path: Path) -> str:
    relative = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    if path.is_dir():
        return (f"dataset.path {path} is a folder, not a {dataset.format} file; point dataset.path at the file "
                "inside it")
    if dataset.provide:
        return (f"dataset.path {path} does not exist{relative}; provide {dataset.provide}, "
                "or set dataset.path to where it is")
    return f"dataset.path {path} does not exist{relative}; point dataset.path at a {dataset.format} file"


def _field(row: dict, name: str, at: str, knob: str) -> object:
    """row["a"]["b"] for name "a.b" (verl parquet files keep the answer in reward_model.ground_truth)."""
    value: object = row
    parts = name.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(value, dict) or part not in value:
            inside = ".".join(parts[:depth])
            keys = ", ".join(map(str, value)) if isinstance(value, dict) else f"none: {inside} is {_kind(value)}"
            fields = f"fields of {inside}: {keys}" if inside else f"fields: {keys}"
            raise RlvrlabError(f"{at} has no field {name!r} ({fields}); set {knob} to the field that holds it")
        value = value[part]
    if value is None:
        raise RlvrlabError(f"{at} has a null {name!r}; give the row a value or remove it")
    return value


def _prompt_text(prompt: object, name: str, at: str) -> str:
    """A string, or chat messages ([{"role": "user", "content": ...}], verl's format) -> the last user turn."""
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt):
            raise RlvrlabError(f"{at} field {name!r} is a list but not chat messages with string content "
                               "([{\"role\": \"user\", \"content\": \"...\"}]); fix the row or dataset.prompt_field")
        users = [m["content"] for m in prompt if m.get("role", "user") == "user"]
        prompt = users[-1] if users else prompt[-1]["content"]
    if not isinstance(prompt, str):
        raise RlvrlabError(f"{at} field {name!r} is {_kind(prompt)}, not a string or chat messages; "
                           "fix the row or set dataset.prompt_field to the question's field")
    if not prompt.strip():
        raise RlvrlabError(f"{at} has an empty {name!r}; give the row its question or remove it")
    return prompt


def _answer_text(answer: object, name: str, at: str) -> str:
    """A string or a number (an integral float such as 27.0 -> "27"); a one-element list -> its element."""
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]  # OlympiadBench keeps its final answer in a one-element list
    if isinstance(answer, float) and math.isfinite(answer) and answer.is_integer():
        answer = int(answer)
    if isinstance(answer, (int, float)) and not isinstance(answer, bool) and math.isfinite(answer):
        answer = str(answer)
    if not isinstance(answer, str):
        raise RlvrlabError(f"{at} field {name!r} is {_kind(answer)}, not a string or a number; "
                           "give one reference answer per row or set dataset.answer_field to the answer's field")
    if not answer.strip():
        raise RlvrlabError(f"{at} has an empty {name!r}; give the row its reference answer or remove it")
    return answer


def _row_id(row: dict, index: int, at: str) -> str:
    """The id field, else verl's extra_info.index, else the row's 0-based position among the rows."""
    extra = row.get("extra_info")
    index_field = extra.get("index") if isinstance(extra, dict) else None
    for name, value in (("id", row.get("id")), ("extra_info.index", index_field)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
            raise RlvrlabError(f"{at} field {name!r} is {_kind(value)}, not a non-empty string or an integer; "
                               "fix it or remove the field (rows are then numbered)")
        return str(value)
    return str(index)


def _source(row: dict, at: str) -> str:
    source = row.get("data_source")
    if source is None:
        return ""  # load_problems fills in the dataset's name
    if not isinstance(source, str):
        raise RlvrlabError(f"{at} field 'data_source' is {_kind(source)}, not a string; fix it or remove the field")
    return source


def _kind(value: object) -> str:
    """How a value's type reads in an error: 'a list ([1, 2])'."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    preview = repr(value)
    preview = preview if len(preview) <= 40 else preview[:37] + "..."
    return f"{names.get(type(value), type(value).__name__)} ({preview})"


# The longest JSONL line (one problem) read: a prompt beyond it is longer than any model's context, and the memory a
# longer one takes is unbounded (a 50 MB line took an evaluation past 8 GiB before it was killed).
MAX_LINE_BYTES = 1 << 20


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each line, split at "\\n" only (JSON may hold U+2028), each read with a bound:
    a line longer than MAX_LINE_BYTES is one error naming it, before it is held in memory whole."""
    offset = 0
    with path.open("rb") as handle:
        for number in itertools.count(1):
            raw = handle.readline(MAX_LINE_BYTES + 2)  # the line, its "\\n" and one byte to tell it is longer
            if not raw:
                return
            if len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                raise RlvrlabError(f"{path} line {number} is longer than {MAX_LINE_BYTES >> 20} MiB, the most one "
                                   "problem's row may hold (its prompt alone would be hundreds of thousands of "
                                   "tokens); fix or remove the line")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise RlvrlabError(f"{path} is not UTF-8 text (byte {offset + error.start}); a JSONL file is UTF-8 "
                                   "JSON, one object per line") from None
            offset += len(raw)
            yield number, text


def _read_rows(path: Path, fmt: str) -> list[tuple[str, dict]]:
    """(where, row) pairs: where is "line N" (JSONL, 1-based) or "row N (0-based)" (Parquet)."""
    if fmt == "jsonl":
        rows = []
        for number, line in _jsonl_lines(path):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise RlvrlabError(f"{path} line {number} is not JSON ({error.msg}); "
                                   "each line must be one JSON object") from None
            if not isinstance(row, dict):
                raise RlvrlabError(f"{path} line {number} is {_kind(row)}, not a JSON object; "
                                   "each line must be one JSON object")
            rows.append((f"line {number}", row))
        return rows
    try:
        import pyarrow.parquet as pq

        table = pq.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises several types for unreadable files
        detail = f"{type(error).__name__}: {' '.join(str(error).split())}"  # one line, whatever pyarrow says
        raise RlvrlabError(f"{path} is not a readable parquet file ({detail})") from None
    return [(f"row {index} (0-based)", row) for index, row in enumerate(table)]
