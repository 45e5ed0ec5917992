"""Groups of seed runs from any MLflow runs (`rlvrlab report --experiment NAME --group-by KEY --seed-key KEY`):
runs another trainer logged (TRL, verl, a script) are grouped by the values of params or tags and paired by a seed
key, into the same Selection the statistics read for rlvrlab's own runs (rlvrlab.report.collect)."""

from __future__ import annotations

import difflib
import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.collect import Group, SeedRun, Selection, duration_of, identity
from rlvrlab.report.provenance import UNKNOWN
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.runs import client_for, experiment_runs, runs_by_id

# the commit a run was trained from: MLflow's own tag (set by start_run in a git checkout), then rlvrlab's
COMMIT_TAGS = ("mlflow.source.git.commit", T.GIT_SHA)
WHERE = {"params": "param", "tags": "tag", None: "param or tag"}
UNLOGGED = ("RUNNING", "SCHEDULED")  # still being written: neither a result nor a failure
SHOWN_KEYS = 12  # params (and tags) named in the error for a key no run has (TRL logs ~220 params)


@dataclass(frozen=True)
class Key:
    """A --group-by or --seed-key key: `lr` (a param, else a tag), `params.lr` or `tags.lr` (only there)."""

    name: str
    where: Optional[str] = None  # "params" | "tags" | None: params, then tags

    @classmethod
    def parse(cls, text: str) -> Key:
        text = text.strip()
        for where in ("params", "tags"):
            if text.startswith(where + "."):
                return cls(text[len(where) + 1:], where)
        return cls(text)

    def value(self, run) -> Optional[str]:
        params, tags = run.data.params, run.data.tags
        if self.where != "tags" and self.name in params:
            return params[self.name]
        if self.where != "params" and self.name in tags:
            return tags[self.name]
        return None


def parse_keys(text: str, option: str) -> list[Key]:
    keys = [Key.parse(part) for part in text.split(",") if part.strip()]
    if not keys or any(not k.name for k in keys):
        raise RlvrlabError(f"{option} {text!r}: give param or tag names, comma-separated, e.g. {option} lr,beta "
                           f"(params.X or tags.X to say which)")
    return keys


def commit_of(run) -> str:
    """The git commit a run's tags record, "unknown" when none does (unknown provenance)."""
    for tag in COMMIT_TAGS:
        value = run.data.tags.get(tag, "").strip()
        if value and value != UNKNOWN:
            return value
    return UNKNOWN


def select(uri: str, *, experiment: Optional[str], run_ids: Sequence[str], group_by: str,
           seed_key: str = "seed") -> Selection:
    """The FINISHED runs of `experiment` (or `run_ids`) grouped by the values of the `group_by` keys, each run's seed
    its `seed_key` value; FAILED runs count as failed seeds of their group (as collect.select counts rlvrlab's own),
    RUNNING and other unfinished runs are left out and listed in `excluded`. rlvrlab's study, trial and evaluation
    runs are not training runs and are skipped. A finished run without a group key or the seed key is an error:
    dropping it would change a group's seeds without anyone deciding so."""
    keys, seed = parse_keys(group_by, "--group-by"), parse_keys(seed_key, "--seed-key")
    if len(seed) != 1:
        raise RlvrlabError(f"--seed-key {seed_key!r}: give one param or tag, e.g. --seed-key seed")
    seed_k = seed[0]
    if seed_k.name in {k.name for k in keys}:
        raise RlvrlabError(f"--seed-key {seed_k.name!r} is also a --group-by key; a group's runs differ in their seed")
    client = client_for(uri)
    if run_ids:
        runs = runs_by_id(client, run_ids, uri=uri)
        source = "runs"
    else:
        assert experiment is not None  # command.make_report gives one of experiment and run_ids
        runs = experiment_runs(client, experiment, uri=uri)
        source = experiment
    runs = [r for r in runs if r.data.tags.get(T.ROLE) not in ("study", "trial") and r.data.tags.get(T.KIND) != "eval"]
    excluded = [(r.info.run_id, f"status {r.info.status}") for r in runs if r.info.status != "FINISHED"]
    finished = [r for r in runs if r.info.status == "FINISHED"]
    failed = [r for r in runs if r.info.status == "FAILED"]
    if not finished:
        raise RlvrlabError(f"no finished runs in {source!r} at {uri}"
                           + (f" ({len(excluded)} unfinished or failed)" if excluded else ""))
    for option, key in [*(("--group-by", k) for k in keys), ("--seed-key", seed_k)]:
        if all(key.value(r) is None for r in finished):  # in no run: a misspelt key, not a run to fix
            raise _no_such_key(option, key, finished,
                               "the given runs" if run_ids else f"the finished runs of {source!r}")
    for r in finished:
        for key in [*keys, seed_k]:
            if key.value(r) is None:
                raise RlvrlabError(
                    f"run {r.info.run_id} ({r.info.run_name}) has no {WHERE[key.where]} {key.name!r}; "
                    "log it (mlflow.log_param or mlflow.set_tag), delete the run, or report chosen runs with "
                    "--runs ID,ID,...")
    by_values: dict[tuple[str, ...], list[SeedRun]] = defaultdict(list)
    for r in finished:
        by_values[tuple(str(k.value(r)) for k in keys)].append(_seed_run(r, seed_k))
    failed_by: dict[tuple[str, ...], dict[int, SeedRun]] = defaultdict(dict)
    for r in failed:  # a run that crashed before logging its params belongs to no group: excluded, not failed
        if all(k.value(r) is not None for k in [*keys, seed_k]):
            run = _seed_run(r, seed_k)
            failed_by[tuple(str(k.value(r)) for k in keys)].setdefault(run.seed, run)
    names = [k.name for k in keys]
    every: list[Group] = []
    for values in sorted({*by_values, *failed_by}, key=group_order):
        members = sorted(by_values.get(values, []), key=lambda m: m.seed)
        label = " ".join(f"{name}={value}" for name, value in zip(names, values))
        _check_unique_seeds(label, members)
        lost = {s: m for s, m in failed_by.get(values, {}).items() if s not in {m.seed for m in members}}
        every.append(Group(group_hash(names, values), members, label, dict(zip(names, values)),
                           failed=sorted(lost), failed_runs=[lost[s] for s in sorted(lost)]))
    groups = [g for g in every if g.runs]
    failed_only = [f"group {g.label}: all {len(g.failed)} seeds FAILED" for g in every if not g.runs]
    return Selection(uri, source, groups, excluded, failed_only=failed_only, all_groups=every,
                     group_by=[*names], seed_key=seed_k.name)


def notes(selection: Selection) -> list[str]:
    """Footer lines: how --group-by grouped the runs, and the runs left out that no seeds column counts."""
    lines = []
    if selection.group_by:
        source = "the given runs" if selection.experiment == "runs" else f"runs of {selection.experiment!r}"
        lines.append(f"groups: {source} by {', '.join(selection.group_by)} "
                     f"(--group-by), seeds by {selection.seed_key} (--seed-key); FINISHED runs only")
    counted = {r.run_id for g in selection.all_groups for r in g.failed_runs}
    left = [(run_id, why) for run_id, why in selection.excluded if run_id not in counted]
    by_why: dict[str, list[str]] = defaultdict(list)
    for run_id, why in left:
        by_why[why.removeprefix("status ")].append(run_id[:7])
    for status, ids in sorted(by_why.items()):
        what = "still running" if status in UNLOGGED else "in no seeds column (no group or seed key, or a " \
            "FINISHED run of the same seed)" if status == "FAILED" else "not finished"
        lines.append(f"excluded: {len(ids)} run{'s' * (len(ids) > 1)} {status}, {what} ({', '.join(ids[:6])}"
                     f"{', ...' if len(ids) > 6 else ''}): not in the table")
    return lines


def _no_such_key(option: str, key: Key, runs: Sequence, which: str) -> RlvrlabError:
    """`--group-by 'lrr': the finished runs of 'trl' have no param or tag 'lrr'; did you mean 'lr'? ...`: the
    suggestion from the params and tags those runs have (difflib, as for metrics and experiments), the same name in
    the other place when `params.`/`tags.` chose the wrong one; MLflow's own `mlflow.*` tags are not offered."""
    params = sorted({name for r in runs for name in r.data.params})
    tags = sorted({name for r in runs for name in r.data.tags if not name.startswith("mlflow.")})
    given = f"{key.where}.{key.name}" if key.where else key.name
    if key.where is None:
        places = [("", sorted({*params, *tags}))]
    else:  # where it was asked for, then the other place
        places = [(key.where + ".", {"params": params, "tags": tags}[key.where])]
        places.append(("tags.", tags) if key.where == "params" else ("params.", params))
    close = [prefix + name for prefix, names in places for name in difflib.get_close_matches(key.name, names, n=1)]
    hint = f"did you mean {close[0]!r}? " if close else ""
    shown = [*params[:SHOWN_KEYS], *(f"tags.{t}" for t in tags[:SHOWN_KEYS])]
    more = len(params) + len(tags) - len(shown)
    listing = ", ".join(shown) + (f" and {more} more" if more > 0 else "") if shown else "none"
    return RlvrlabError(f"{option} {given!r}: {which} have no {WHERE[key.where]} "
                        f"{key.name!r}; {hint}they have: {listing}")


def _seed_run(run, key: Key) -> SeedRun:
    text = str(key.value(run))
    try:
        number = float(text)
        if number != int(number):
            raise ValueError
        seed = int(number)
    except (ValueError, OverflowError):
        raise RlvrlabError(f"run {run.info.run_id} has {key.name}={text!r}, not an integer seed; give --seed-key "
                           "the param or tag that holds each run's seed") from None
    tags = run.data.tags
    return SeedRun(run.info.run_id, seed, dict(run.data.params), commit_of(run), run.info.status,
                   tags.get(T.GIT_DIRTY, "false") == "true", dirty_known=T.GIT_DIRTY in tags, **identity(tags),
                   duration_s=duration_of(run))


def _check_unique_seeds(label: str, runs: list[SeedRun]) -> None:
    for a, b in zip(runs, runs[1:]):
        if a.seed == b.seed:
            raise RlvrlabError(f"runs {a.run_id} and {b.run_id} of group {label!r} both have seed {a.seed}; delete "
                               "one, add the key that tells them apart to --group-by, or choose runs with --runs")


def group_order(values: tuple[str, ...]) -> tuple:
    """Groups in numeric order where a value is a number (lr=1e-06 before lr=1e-05), else by text."""
    def one(text: str) -> tuple:
        try:
            return (0, float(text), text)
        except ValueError:
            return (1, 0.0, text)
    return tuple(one(v) for v in values)


def group_hash(names: list[str], values: tuple[str, ...]) -> str:
    """A group's id in table.csv's config_hash column: the --group-by keys and values, hashed."""
    return hashlib.sha256(json.dumps(dict(zip(names, values)), sort_keys=True).encode()).hexdigest()[:12]
