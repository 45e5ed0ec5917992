"""Seed runs from TensorBoard event files (`rlvrlab report --source tensorboard:DIR`): what a lab on TRL, OpenRLHF or
its own script logged with `report_to="tensorboard"` or a SummaryWriter, read with TensorBoard's own event reader
(tensorboard.backend.event_processing: its run discovery, EventAccumulator and HParams protos), never a parser of
ours.

The rule, from DIR down:

- **A run is a folder holding event files** (`events.out.tfevents.*` directly in it), as TensorBoard lists runs; its
  name is the folder's path relative to DIR (`.` for DIR itself). One exception: a folder whose event files hold an
  HParams session and, besides it, only the metric values that session names is the hparams record of its parent
  run when the parent holds event files too (torch's `SummaryWriter.add_hparams` writes one such sub-folder, named
  by the time, per call): its hparams and values belong to the parent.
- **Params** are the run's HParams (the TensorBoard HParams plugin's session hparams: `add_hparams`,
  `hparams.api.hparams`) when it logged any; else the folder-name parts `key=value`, the run's name being split
  into parts at every `/` and `,` (never at `_`, `-` or `.`, which keys and values hold: `learning_rate=1e-05`), the
  key before the first `=`. A part without `=` (`runs`, a date) names nothing; the same key twice with two values
  is an error. HParams numbers read as Python prints them (`3`, `0.1`, `1e-05`), as MLflow logs params; booleans as
  `True`/`False`.
- **The seed** is the HParams `seed`; else a folder-name part `seed=N`, `seed_N`, `seed-N` or `seedN` (the whole
  part, any case); else the `seed` of the `args` text that transformers' TensorBoardCallback logs (TRL's
  `report_to="tensorboard"`: its TrainingArguments as JSON). The seed is never one of the params. A run without a
  seed is an error naming the run and the fix.
- **Series**: every scalar tag -> its (step, value) pairs in step order, one value a step (the last written wins;
  TensorBoard's reader already drops the steps a restarted writer logged again). Old-style scalars
  (`add_scalar`, TRL's) are float32 as stored; new-style ones written with `double_precision=True` are float64.
- **Names**: a tag is the metric's name, except in a run whose event files hold transformers' `args` text (the
  runs of a transformers Trainer: TRL, ...): there the prefix TensorBoardCallback's `rewrite_logs` adds is undone,
  `train/X` -> `X`, `eval/X` -> `eval_X`, `test/X` -> `test_X`, so that a metric has the name transformers'
  MLflowCallback logs it under (`reward`, `entropy`, `eval_loss`) and `--metric` is the same for both stores.
- **Start**: the wall time of the run's first event (its writer's creation), for a protocol's "first run started".
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.tracking.tags import NONFINITE_STEP

SEED_PART = re.compile(r"seed[=_-]?(\d+)", re.IGNORECASE)  # a whole folder-name part: seed=3, seed_3, seed-3, seed3
PART_SEPARATORS = re.compile(r"[/,]")
ARGS_TAGS = ("args", "args/text_summary")  # transformers' add_text("args", ...): TF's name, torch's legacy name
SEED_KEY = "seed"
TRANSFORMERS_PREFIXES = {"train/": "", "eval/": "eval_", "test/": "test_"}  # TensorBoardCallback's, undone
INSTALL = "pip install 'rlvrlab[tensorboard]'"


@dataclass(frozen=True)
class TBRun:
    """One seed run: the module docstring says where each field comes from."""

    name: str                                   # the run folder, relative to DIR
    params: dict[str, str]                      # hparams (HParams plugin), else key=value parts of the folder name
    seed: Optional[int]                         # hparams "seed", else a "seed=N" / "seed_N" / "seedN" folder part
    series: dict[str, list[tuple[int, float]]]  # metric name (its tag) -> (step, value), in step order
    started: Optional[float] = None             # wall time (s) of the run's first event


@dataclass
class _Folder:
    """What one folder's event files hold."""

    name: str
    hparams: dict[str, str]
    metric_tags: set[str]                       # the values the HParams session names (its experiment's metrics)
    args: Optional[dict]                        # transformers' TrainingArguments, when it logged them
    series: dict[str, dict[int, float]]         # tag -> step -> value
    started: Optional[float] = None

    @property
    def is_hparams_record(self) -> bool:
        return bool(self.hparams) and set(self.series) <= self.metric_tags


def _tensorboard() -> Any:
    """TensorBoard's event-processing modules (the tensorboard extra)."""
    try:
        from tensorboard.backend.event_processing import event_accumulator, io_wrapper
        from tensorboard.plugins.hparams import plugin_data_pb2
        from tensorboard.util import tensor_util
    except ImportError as e:
        raise RlvrlabError(f"reading TensorBoard event files needs the tensorboard package ({e}): {INSTALL}") from e
    return event_accumulator, io_wrapper, plugin_data_pb2, tensor_util


def hparam_text(value) -> str:
    """An HParams value (tensorboard.plugins.hparams.api_pb2 via google.protobuf.Value) as the string MLflow would
    log for it: str() of the Python value, integral numbers as ints (add_hparams stores every number as a double)."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        return str(int(number)) if float(number).is_integer() else repr(number)
    if kind == "bool_value":
        return str(value.bool_value)
    if kind == "string_value":
        return value.string_value
    return ""


def folder_name_parts(name: str) -> tuple[dict[str, str], Optional[int]]:
    """(params, seed) from a run's name: the module docstring's rule."""
    params: dict[str, str] = {}
    seeds: set[int] = set()
    for part in PART_SEPARATORS.split(name):
        if match := SEED_PART.fullmatch(part):
            seeds.add(int(match.group(1)))
            continue
        key, eq, value = part.partition("=")
        if not eq or not key:
            continue
        if params.get(key, value) != value:
            raise RlvrlabError(f"TensorBoard run {name!r} names {key} twice ({params[key]} and {value}): rename "
                               f"its folders so that each key=value appears once")
        params[key] = value
    if len(seeds) > 1:
        raise RlvrlabError(f"TensorBoard run {name!r} names {len(seeds)} seeds ({sorted(seeds)}): rename its folders "
                           f"so that one part says seed=N")
    return params, next(iter(seeds), None)


def _seed_of(name: str, text: str, where: str) -> int:
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not number.is_integer():
        raise RlvrlabError(f"TensorBoard run {name!r}: its {where} seed {text!r} is not an integer: log the seed as "
                           f"a whole number")
    return int(number)


def _args(accumulator, tensor_util, tags: list[str]) -> Optional[dict]:
    """transformers' `args` text (TrainingArguments.to_json_string()) as a dict, if the folder logged it."""
    for tag in ARGS_TAGS:
        if tag in tags and (events := accumulator.Tensors(tag)):
            text = tensor_util.make_ndarray(events[-1].tensor_proto).reshape(-1)[0]
            try:
                args = json.loads(text.decode() if isinstance(text, bytes) else str(text))
            except ValueError:
                return None
            return args if isinstance(args, dict) else None
    return None


def _args_seed(args: Optional[dict]) -> Optional[int]:
    seed = (args or {}).get(SEED_KEY)
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def mlflow_name(tag: str) -> str:
    """A tag of transformers' TensorBoardCallback as its MLflowCallback names the metric: rewrite_logs undone."""
    prefix = next((p for p in TRANSFORMERS_PREFIXES if tag.startswith(p)), None)
    return tag if prefix is None else TRANSFORMERS_PREFIXES[prefix] + tag[len(prefix):]


def _read_folder(path: Path, name: str, modules) -> _Folder:
    event_accumulator, _, plugin_data_pb2, tensor_util = modules
    # 0 keeps every event: the default keeps a reservoir sample of 1,000 scalars a tag
    guidance = {event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    accumulator = event_accumulator.EventAccumulator(str(path), size_guidance=guidance)
    accumulator.Reload()
    hparams: dict[str, str] = {}
    metric_tags: set[str] = set()
    try:
        hparams_contents = accumulator.PluginTagToContent("hparams").values()
    except KeyError:  # the folder logged no hparams
        hparams_contents = []
    for content in hparams_contents:
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            hparams.update({k: hparam_text(v) for k, v in data.session_start_info.hparams.items()})
        elif data.HasField("experiment"):
            metric_tags |= {info.name.tag for info in data.experiment.metric_infos}
    tags = accumulator.Tags()
    series = {tag: {e.step: float(e.value) for e in accumulator.Scalars(tag)} for tag in tags["scalars"]}
    for tag in tags["tensors"]:  # new-style scalars (tf.summary.scalar, add_scalar(new_style=True))
        if accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars":
            series[tag] = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in accumulator.Tensors(tag)}
    try:
        started: Optional[float] = accumulator.FirstEventTimestamp()
    except ValueError:  # no event at all
        started = None
    return _Folder(name, hparams, metric_tags, _args(accumulator, tensor_util, tags["tensors"]), series, started)


def _merge_record(run: _Folder, record: _Folder) -> None:
    """An add_hparams sub-folder's hparams and metric values into its parent run."""
    for key, value in record.hparams.items():
        if run.hparams.get(key, value) != value:
            raise RlvrlabError(f"TensorBoard run {run.name!r} logged hparam {key} twice ({run.hparams[key]} and "
                               f"{value}, in {record.name!r}): log each run's hparams once")
        run.hparams[key] = value
    for tag, values in record.series.items():
        run.series.setdefault(tag, {}).update(values)


def _run(folder: _Folder) -> TBRun:
    named, named_seed = folder_name_parts(folder.name)
    params = dict(folder.hparams) if folder.hparams else named
    seed = _seed_of(folder.name, params[SEED_KEY], "hparams") if SEED_KEY in params else None
    seed = next((s for s in (seed, named_seed, _args_seed(folder.args)) if s is not None), None)
    if seed is None:
        raise RlvrlabError(f"TensorBoard run {folder.name!r} has no seed: log it as an hparam (add_hparams "
                           f"{{'seed': N, ...}}) or name the run's folder seed=N")
    params = {key: value for key, value in sorted(params.items()) if key != SEED_KEY}
    series = {tag: sorted(values.items()) for tag, values in sorted(folder.series.items())}
    if folder.args is not None:  # a transformers Trainer's run: the names its MLflowCallback logs
        named_as = {tag: mlflow_name(tag) for tag in series}
        clash = next((tag for tag in series if tag != named_as[tag] and named_as[tag] in series), None)
        if clash is not None:
            raise RlvrlabError(f"TensorBoard run {folder.name!r} logs both {clash!r} and {named_as[clash]!r}, one "
                               f"metric name once transformers' {clash.split('/')[0]}/ prefix is undone: log the "
                               "second under another name")
        series = {named_as[tag]: values for tag, values in sorted(series.items(), key=lambda i: named_as[i[0]])}
    return TBRun(folder.name, params, seed, series, folder.started)


def read_runs(directory: Path) -> list[TBRun]:
    """Every run under `directory`, by the module docstring's rule, in name order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise RlvrlabError(f"--source tensorboard:{directory}: no such folder: give the folder the runs logged "
                           f"TensorBoard event files into")
    modules = _tensorboard()
    root = directory.resolve()
    paths = tuple(sorted(Path(p) for p in modules[1].GetLogdirSubdirectories(str(root))))
    if not paths:
        raise RlvrlabError(f"--source tensorboard:{directory}: no TensorBoard event files (events.out.tfevents.*) "
                           f"under it: give the folder SummaryWriter or report_to='tensorboard' logged into")
    folders = {}
    for path in paths:
        relative = path.relative_to(root).parts
        name = PurePosixPath(*relative).as_posix() if relative else "."
        folders[name] = _read_folder(path, name, modules)
    for name, folder in list(folders.items()):
        parent = PurePosixPath(name).parent.as_posix()
        if name != "." and parent in folders and folder.is_hparams_record:
            _merge_record(folders[parent], folders.pop(name))
    return [_run(folder) for _, folder in sorted(folders.items())]


class Histories:
    """The runs' series served as the part of MLflow's client that the report's curves, events and protocol read
    (`get_metric_history`, `get_run`), keyed by run name: rlvrlab.report.plots, rlvrlab.report.events and
    rlvrlab.report.provenance then read TensorBoard runs as they read MLflow runs. A run's tags hold `nonfinite_step`
    (rlvrlab's tag for the `nonfinite` event) at the first step where any of its scalars is NaN or infinite."""

    def __init__(self, runs: list[TBRun]):
        self.runs = {run.name: run for run in runs}

    def get_metric_history(self, run_id: str, key: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(key=key, step=step, value=value, timestamp=0)
                for step, value in self.runs[run_id].series.get(key, [])]

    def get_run(self, run_id: str) -> SimpleNamespace:
        run = self.runs[run_id]
        bad = [step for points in run.series.values() for step, value in points if not math.isfinite(value)]
        tags = {NONFINITE_STEP: str(min(bad))} if bad else {}
        start = round(run.started * 1000) if run.started is not None else None  # ms, as MLflow's start_time
        return SimpleNamespace(data=SimpleNamespace(tags=tags), info=SimpleNamespace(run_id=run_id, start_time=start))
