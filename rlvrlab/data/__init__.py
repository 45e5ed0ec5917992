"""Problems: what a prompt asks and what the verifier checks the response against.

`load_problems(dataset, model)` returns (train, eval) lists of Problem for any dataset config: a synthetic
task generated from a fixed seed, or a JSONL / Parquet file with a prompt and an answer field.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rlvrlab.config.schema import DatasetConfig, ModelConfig
from rlvrlab.data.problems import Problem
from rlvrlab.errors import RlvrlabError

# Synthetic data does not depend on the run seed: seeds of one configuration train on the same problems
# (and the tiny tier on the same warm-started model), as runs from one pretrained checkpoint would.
DATA_SEED = 0


def _toy(dataset: DatasetConfig, model: ModelConfig) -> list[Problem]:
    from rlvrlab.policy.toy import make_problems

    return make_problems(dataset.num_problems, num_responses=model.toy_num_responses,
                         num_correct=model.toy_num_correct, seed=DATA_SEED)


def _countdown(dataset: DatasetConfig, model: ModelConfig) -> list[Problem]:
    from rlvrlab.data.countdown import make_problems

    return make_problems(dataset.num_problems, seed=DATA_SEED)


SYNTHETIC_TASKS = {"toy": _toy, "countdown": _countdown}


def load_problems(dataset: DatasetConfig, model: ModelConfig) -> tuple[list[Problem], list[Problem]]:
    """(train, eval): the last eval_fraction of the problems, after a fixed shuffle, is held out."""
    if dataset.format == "synthetic":
        problems = SYNTHETIC_TASKS[dataset.name](dataset, model)
    else:
        problems = _read_file(dataset)
    if dataset.format == "synthetic" and dataset.name == "toy":
        return problems, []  # toy problems are rows of the policy table; all are trained
    order = np.random.default_rng(DATA_SEED).permutation(len(problems))
    held = int(len(problems) * dataset.eval_fraction)
    shuffled = [problems[i] for i in order]
    train, held_out = shuffled[: len(problems) - held], shuffled[len(problems) - held :]
    if not train:
        raise RlvrlabError(f"dataset {dataset.name}: no training problems left after eval_fraction "
                           f"{dataset.eval_fraction}; lower dataset.eval_fraction")
    return train, held_out


def _read_file(dataset: DatasetConfig) -> list[Problem]:
    path = Path(dataset.path).expanduser()
    if not path.is_file():
        raise RlvrlabError(f"dataset.path {path} does not exist; point dataset.path at a {dataset.format} file")
    rows = _read_rows(path, dataset.format)
    problems = []
    for number, row in enumerate(rows, start=1):
        prompt, answer = (_field(row, name, path, number) for name in (dataset.prompt_field, dataset.answer_field))
        problems.append(Problem(id=str(row.get("id", number - 1)), prompt=_prompt_text(prompt), answer=str(answer)))
    if not problems:
        raise RlvrlabError(f"{path} holds no records; a {dataset.format} file with one problem per record is needed")
    return problems


def _field(row: dict, name: str, path: Path, number: int) -> object:
    """row["a"]["b"] for name "a.b" (verl parquet files keep the answer in reward_model.ground_truth)."""
    value: object = row
    for part in name.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            raise RlvrlabError(
                f"{path} record {number} has no field {name!r} (fields: {', '.join(map(str, row))}); "
                "set dataset.prompt_field / dataset.answer_field to the right names"
            )
        value = value[part]
    return value


def _prompt_text(prompt: object) -> str:
    """A prompt given as chat messages ([{"role": "user", "content": ...}], verl's format) -> the last user turn."""
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        users = [m["content"] for m in prompt if m.get("role", "user") == "user"]
        return str(users[-1] if users else prompt[-1]["content"])
    return str(prompt)


def _read_rows(path: Path, fmt: str) -> list[dict]:
    if fmt == "jsonl":
        rows = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise RlvrlabError(f"{path} line {number} is not JSON ({error.msg}); "
                                       "each line must be one JSON object") from None
                if not isinstance(row, dict):
                    raise RlvrlabError(f"{path} line {number} is a {type(row).__name__}, not a JSON object")
                rows.append(row)
        return rows
    try:
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises several types for unreadable files
        raise RlvrlabError(f"{path} is not a readable parquet file ({type(error).__name__}: {error})") from None
