"""`rlvrlab report --reanalyse FOLDER`: a results folder's tables re-computed from the values it records, without the
MLflow store behind it (docs/report.md, "Re-analysing a committed folder"). The folder is the select stage's source
(`select_folder`): the groups, metric columns and options rebuilt from sources.json, the value arrays read back from
per_seed.csv / per_problem.csv in the order rlvrlab.report.table.values_from_runs feeds them; then the same
analysis (table.analyse) and render (write.tables). Events are kept as recorded; a protocol's ```verdict block is
evaluated on the new comparisons."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import numpy as np

from rlvrlab import outputs
from rlvrlab.errors import RlvrlabError
from rlvrlab.report import request, verdict, write
from rlvrlab.report.collect import Group, SeedRun, Selection
from rlvrlab.report.columns import REDUCTIONS, MetricSpec, parse_equivalence, parse_metrics, parse_pairs
from rlvrlab.report.events import EventResult, GroupEvents, RunEvent, parse_event
from rlvrlab.report.provenance import results_dir
from rlvrlab.report.request import FORMATS
from rlvrlab.report.sources import Selected
from rlvrlab.report.table import analyse

# `rlvrlab report`'s options as rlvrlab.report.request defines them: those that take a value (repeatable ones collect
# every value) and the flags; a recorded command holding any other is refused (tests check both against the CLI)
VALUE_OPTIONS = tuple(flag for flag in request.value_options() if flag != "--reanalyse")
FLAGS = request.switch_flags()
NOT_A_SECTION = ("train", "event")  # per_seed.csv sections that are no evaluation dataset
REANALYSED = "re-analysed from the committed per-seed values"  # the note this module adds (and drops when redone)
EVENTS_KEPT = "events: as first counted from the runs' training curves"
_WINDOW = re.compile(r"^(?P<label>.+): (?P<reduce>" + "|".join(REDUCTIONS) + r") of the last (?P<last>\d+) "
                     r"logged steps$")
_STEIN = re.compile(r"adaptive seeds, Stein two-stage, n0 = (\d+)")
_FAILED_ONLY = re.compile(r"^(config|group) .+: all \d+ seeds FAILED$")


def parse_command(command: Sequence[str]) -> dict[str, list[str]]:
    """The options of a recorded `rlvrlab report ...` command: option -> its values in order (a flag: [])."""
    args = list(command)[2:] if list(command)[:2] == ["rlvrlab", "report"] else list(command)
    options: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        if name in FLAGS and not sep:
            options[name] = []
        elif name in VALUE_OPTIONS and (sep or i + 1 < len(args)):
            if not sep:
                i += 1
                value = args[i]
            options.setdefault(name, []).append(value)
        else:
            raise RlvrlabError(f"the recorded command has {args[i]!r}, which `rlvrlab report` takes no longer (or "
                               "without its value); re-run rlvrlab report on the runs instead of --reanalyse")
        i += 1
    return options


def reanalyse(folder: Path, out: Optional[Path] = None, protocol: Optional[Path] = None,
              command: Sequence[str] = ("rlvrlab", "report", "--reanalyse"), simultaneous: bool = False,
              interaction: Sequence[tuple[str, str]] = ()) -> write.ReportOutcome:
    """Re-compute FOLDER's tables from its recorded values (module docstring) into `out` (default FOLDER itself);
    `protocol`: evaluate this protocol's verdict rules instead of the recorded protocol's. The report's stages:
    select (the folder is the source: select_folder), analyse (table.analyse), render (write.tables)."""
    folder = Path(folder)
    selected, sources, options = select_folder(folder)
    one = {name: values[-1] for name, values in options.items() if values}
    simultaneous, interaction = _added(sources, options, simultaneous, interaction)
    result = analyse(selected.selection, selected.data, metrics=selected.specs, eval_stats=selected.eval_stats,
                     baseline=one.get("--baseline"), pairs=parse_pairs(options.get("--compare", [])),
                     target_halfwidth=float(one["--target-halfwidth"]) if "--target-halfwidth" in one else None,
                     equivalence=parse_equivalence(one.get("--equivalence")), stage_one=selected.stage_one,
                     simultaneous=simultaneous, interaction=interaction)
    result.notes = selected.values_noted(result.notes)
    protocol_path = Path(protocol) if protocol is not None else _protocol(sources, one.get("--protocol"), folder)
    sha, dirty = _state(folder, protocol_path)
    today = datetime.now(timezone.utc).date().isoformat()
    events = _events(sources.get("events") or [])
    result.notes = _notes(result.notes, sources.get("notes", []), bool(events),
                          f"at commit {sha[:7]} ({today}{', dirty tree' if dirty else ''})")
    verdicts = None
    if protocol_path is not None:
        if not protocol_path.is_file():
            raise RlvrlabError(f"--protocol {protocol_path}: no such file; give the protocol's path")
        shown = Path(_portable(protocol_path))  # table.md names it from the repository root, not this machine's
        verdicts = verdict.evaluate(shown, verdict.load(protocol_path), result, folder=folder,
                                    events=sources.get("events") or (), root=results_dir().parent)

    target = Path(out) if out is not None else folder
    outputs.check_dir(target, f"--out {target}")
    target.mkdir(parents=True, exist_ok=True)
    chosen = [f.strip() for f in one.get("--format", "md,tex,csv").split(",") if f.strip()]
    written = write.tables(target, [f for f in chosen if f in FORMATS], one.get("--interval", "bracket"),
                           write.Analysed(result, events, verdicts))
    sources["notes"] = result.notes
    sources["outputs"] = list(dict.fromkeys([*sources.get("outputs", []), *(p.name for p in written)]))
    sources["reanalysed"] = {"commit": sha, "dirty": dirty, "command": list(command), "date": today,
                             "statistics": statistics_version(),
                             "protocol": _portable(protocol_path) if protocol_path is not None else None,
                             "from": _portable(folder),
                             **({"simultaneous": True} if simultaneous else {}),
                             **({"interaction": [",".join(keys) for keys in interaction]} if interaction else {})}
    outputs.write_replacing(target / "sources.json", json.dumps(sources, indent=2) + "\n")
    return write.ReportOutcome(result, target, [*written, target / "sources.json"], verdicts)


def select_folder(folder: Path) -> tuple[Selected, dict, dict[str, list[str]]]:
    """The select stage of a results folder: its groups and recorded values (as table.values_from_runs orders
    them), with its sources.json and recorded options."""
    sources, per_seed, per_problem = _read(folder)
    options = parse_command(sources.get("command") or [])
    one = {name: values[-1] for name, values in options.items() if values}
    selection = _selection(sources)
    windows = _windows(sources.get("notes", []))
    train = list(dict.fromkeys(row["metric"] for row in per_seed if row["section"] == "train"))
    specs = _specs(options.get("--metric", []), one, windows, train, folder)
    sections = list(dict.fromkeys(row["section"] for row in per_seed if row["section"] not in NOT_A_SECTION))
    eval_stats = _eval_stats(per_seed, sections, one.get("--eval-stats"), folder)
    data = _data(folder, selection.groups, specs, sections, eval_stats, per_seed, per_problem)
    stein = next((int(m.group(1)) for note in sources.get("notes", []) if (m := _STEIN.search(note))), None)
    kind, _, path = one.get("--source", "").partition(":")
    values_note = f"the value in {Path(path).name}" if kind == "csv" else None  # rlvrlab.report.files.from_csv
    return Selected(selection, specs, data, eval_stats, stage_one=stein, values_note=values_note), sources, options


def _added(sources: dict, options: dict[str, list[str]], simultaneous: bool,
           interaction: Sequence[tuple[str, str]]) -> tuple[bool, tuple[tuple[str, str], ...]]:
    """--simultaneous and --interaction A,B (each pair): as given now, the recorded command and an earlier
    re-analysis (its `reanalysed` block records them) gave them, so that re-analysing again keeps them."""
    before = sources.get("reanalysed") or {}
    recorded = request.interaction_pairs((*options.get("--interaction", []), *before.get("interaction", [])))
    return (simultaneous or "--simultaneous" in options or bool(before.get("simultaneous")),
            tuple(dict.fromkeys((*recorded, *interaction))))


def _notes(computed: list[str], recorded: Sequence[str], events: bool, when: str) -> list[str]:
    """The new notes, then the recorded ones of kinds the analysis does not write (provenance, groups, ...)."""
    heads = {_head(note) for note in computed}
    notes = computed + [note for note in recorded if _head(note) not in heads and not _FAILED_ONLY.match(note)
                        and not note.startswith((REANALYSED, EVENTS_KEPT))]
    if events:
        notes.append(f"{EVENTS_KEPT} (they are not re-computable from the per-seed values): their counts, "
                     "exact tests and Holm p are those of the first report")
    return notes + [f"{REANALYSED} {when}; plots and per-seed values as first written"]


def statistics_version() -> str:
    """The statistics code that computed the tables: a digest of rlvrlab/stats/*.py (changes with any edit,
    committed or not) and of rlvrlab/report/table.py."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in [*sorted((here.parent / "stats").glob("*.py")), here / "table.py"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"rlvrlab/stats sha256:{digest.hexdigest()[:16]}"


def _read(folder: Path) -> tuple[dict, list[dict], list[dict]]:
    missing = [name for name in ("sources.json", "per_seed.csv") if not (folder / name).is_file()]
    if missing:
        raise RlvrlabError(f"--reanalyse {folder}: no {missing[0]} there; give a folder written by rlvrlab report "
                           "(it records the values in per_seed.csv and the runs in sources.json)")
    try:
        sources = json.loads((folder / "sources.json").read_text())
    except ValueError as e:
        raise RlvrlabError(f"--reanalyse {folder}: sources.json is not JSON ({e}); restore it from git") from None
    per_problem: list[dict] = []
    if (folder / "per_problem.csv").is_file():
        with open(folder / "per_problem.csv", newline="") as f:
            per_problem = list(csv.DictReader(f))
    with open(folder / "per_seed.csv", newline="") as f:
        return sources, list(csv.DictReader(f)), per_problem


def _selection(sources: dict) -> Selection:
    """The groups as the first report had them (label, config hash, differing values, runs in order, failed runs)."""
    def run(r: dict, status: str) -> SeedRun:
        return SeedRun(r["run_id"], int(r["seed"]), {}, r.get("git_sha", "unknown"), status,
                       bool(r.get("git_dirty", False)), duration_s=r.get("duration_s"))

    groups = []
    for g in sources.get("groups", []):
        runs = [run(r, "FINISHED") for r in g.get("runs", [])]
        for r in runs:  # find_group matches algorithm names too: the differing values are the params known
            r.params = {str(k): str(v) for k, v in g.get("values", {}).items()}
        failed = [run(r, "FAILED") for r in g.get("failed_runs", [])]
        groups.append(Group(g["config_hash"], runs, g["label"], dict(g.get("values", {})), [r.seed for r in failed],
                            failed))
    if not groups or not all(g.runs for g in groups):
        raise RlvrlabError("--reanalyse: sources.json lists no groups with runs; give a folder written by rlvrlab "
                           "report")
    failed_only = [note for note in sources.get("notes", []) if _FAILED_ONLY.match(note)]
    excluded = [(e["run_id"], e["why"]) for e in sources.get("excluded_runs", [])]
    return Selection(sources.get("tracking_uri", ""), sources.get("source", ""), groups, excluded,
                     study=sources.get("study"), failed_only=failed_only, all_groups=groups)


def _windows(notes: Sequence[str]) -> dict[str, tuple[str, int]]:
    """label -> (reduction, last) as the recorded training-metric note states them (table._notes)."""
    prefix = "training metrics, per run: "
    found: dict[str, tuple[str, int]] = {}
    for note in (n for n in notes if n.startswith(prefix)):
        for part in note[len(prefix):].split("; "):
            if m := _WINDOW.match(part):
                found[m["label"]] = (m["reduce"], int(m["last"]))
    return found


def _specs(given: list[str], one: dict[str, str], windows: dict[str, tuple[str, int]], train: list[str],
           folder: Path) -> list[MetricSpec]:
    """The metric columns: the recorded --metric (its defaults --reduce, --last), else the per_seed.csv training
    columns (a study's objective); each spec's reduction and window as the recorded note states them (a study's
    default window is its study run's param, which the folder does not hold)."""
    reduce = one.get("--reduce", "mean")
    specs = parse_metrics(given, reduce=reduce, last=int(one.get("--last", 10))) if given else \
        [MetricSpec(label.split(":")[0], reduce, int(one.get("--last", 10)), label) for label in train]
    specs = [MetricSpec(s.name, *windows.get(s.label, (s.reduce, s.last)), s.label) for s in specs]
    if [s.label for s in specs] != train:
        raise RlvrlabError(f"--reanalyse {folder}: per_seed.csv has the training columns {train}, the recorded "
                           f"command {[s.label for s in specs]}; restore per_seed.csv and sources.json from git")
    return specs


def _eval_stats(per_seed: list[dict], sections: list[str], given: Optional[str], folder: Path) -> list[str]:
    """The evaluation columns, the same in every evaluation section (per_seed.csv order; the recorded --eval-stats)."""
    by_section = {s: list(dict.fromkeys(r["metric"] for r in per_seed if r["section"] == s)) for s in sections}
    stats = next(iter(by_section.values()), [])
    wanted = [c.strip() for c in given.split(",") if c.strip()] if given else stats
    if any(columns != wanted for columns in by_section.values()):
        raise RlvrlabError(f"--reanalyse {folder}: per_seed.csv's evaluation columns {by_section} differ from "
                           f"{wanted}; restore per_seed.csv from git")
    return wanted


def _data(folder: Path, groups: list[Group], specs: list[MetricSpec], sections: list[str], eval_stats: list[str],
          per_seed: list[dict], per_problem: list[dict]) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """(section, metric) -> group label -> [S] (per_seed.csv) or [S, P] (per_problem.csv), seeds in each group's
    run order and problems in per_problem.csv order: the order table.values_from_runs gives. A training value is
    read as the one problem "" of its seed."""
    cells: dict[tuple[str, str, str], dict[tuple[int, str], float]] = {}
    problems: dict[str, list[str]] = {"train": [""]}
    for r in [*(r for r in per_seed if r["section"] == "train"), *per_problem]:
        problem = r.get("problem", "")
        cells.setdefault((r["section"], r["metric"], r["group"]), {})[(int(r["seed"]), problem)] = float(r["value"])
        problems.setdefault(r["section"], []).append(problem)
    problems = {s: list(dict.fromkeys(p)) for s, p in problems.items()}
    known = {g.label: set(g.seeds) for g in groups}
    extra = [(key, found) for key, found in ((key, {s for s, _ in by}) for key, by in cells.items())
             if key[2] not in known or found - known[key[2]]]
    if extra:
        (section, metric, label), found = extra[0]
        raise RlvrlabError(f"--reanalyse {folder}: the values of group {label!r}, {section} {metric} (seeds "
                           f"{sorted(found)}) are not of a group or seed sources.json lists "
                           f"({sorted(known.get(label, []))}); the values do not match the groups: restore both "
                           "from git")
    data: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    for section, metric in [("train", s.label) for s in specs] + [(s, m) for s in sections for m in eval_stats]:
        data[(section, metric)] = {}
        for g in groups:
            try:
                by_cell = cells[(section, metric, g.label)]
                matrix = np.array([[by_cell[(s, p)] for p in problems[section]] for s in g.seeds], dtype=np.float64)
            except KeyError as e:
                where = "per_seed.csv" if section == "train" else "per_problem.csv"
                raise RlvrlabError(f"--reanalyse {folder}: {where} has no value for group {g.label!r}, {section} "
                                   f"{metric} ({e.args[0]}) of the seeds sources.json lists {g.seeds}; the values "
                                   "do not match the groups: restore both from git") from None
            data[(section, metric)][g.label] = matrix[:, 0] if section == "train" else matrix
    return data


def _events(recorded: list[dict]) -> list[EventResult]:
    """The recorded events (rlvrlab.report.events.as_dict) as results to render: counts, tests and Holm p as
    first computed."""
    return [EventResult(parse_event(e["event"]),
                        [GroupEvents(label, [RunEvent(int(r["seed"]), r["run_id"], r["step"], r.get("cause", ""))
                                             for r in runs]) for label, runs in e["groups"].items()],
                        list(e.get("comparisons", []))) for e in recorded]


def _protocol(sources: dict, given: Optional[str], folder: Path) -> Optional[Path]:
    """The recorded protocol file in this repository (the command's --protocol, or the recorded path from results/
    on: a folder written on another machine records that machine's path), else as recorded."""
    recorded = (sources.get("protocol") or {}).get("path")
    if recorded is None and given is None:
        return None
    root = results_dir().parent
    tail = [Path(*Path(recorded).parts[Path(recorded).parts.index("results"):])] \
        if recorded and "results" in Path(recorded).parts else []
    candidates = [root / p for p in (given, *tail) if p] + [Path(p) for p in (recorded, given) if p]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise RlvrlabError(f"--reanalyse {folder}: its protocol {recorded or given} is not on this machine; give "
                           "it with --protocol FILE")
    return found


def _head(note: str) -> str:
    """A note's kind: its first word ("provenance:", "comparisons", "training", ...)."""
    return (note.split() or [""])[0]


def _portable(path: Path) -> str:
    """A path as sources.json records it: from the repository root when inside it (no machine's own path)."""
    root = results_dir().parent
    resolved = Path(path).resolve()
    return str(resolved.relative_to(root)) if root in resolved.parents else str(path)


def _state(folder: Path, protocol: Optional[Path]) -> tuple[str, bool]:
    """(commit, dirty) of what a re-analysis rests on: the code (every tracked file outside results/), the folder's
    values (per_seed.csv, per_problem.csv) and its protocol. Other results folders, and this folder's own outputs
    (tables, comparisons.csv, sources.json, which it rewrites), are not: re-analysing 18 folders in a row is from
    a clean tree when the code and the values are committed."""
    from rlvrlab.tracking.provenance import git_state

    sha, _, _ = git_state()
    if sha == "unknown":
        return sha, False
    root = Path(__file__).resolve().parents[2]  # the checkout holding this package
    inputs = [folder / "per_seed.csv", folder / "per_problem.csv", *([Path(protocol)] if protocol else [])]
    paths = [str(p.resolve()) for p in inputs if p.exists() and root in p.resolve().parents]
    done = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".",
                           ":(exclude)results", *paths], capture_output=True, text=True, check=False)
    return sha, done.returncode != 0 or bool(done.stdout.strip())
