"""`rlvrlab plan`: the design a study needs, from a pilot's committed results folder (per_seed.csv, and
per_problem.csv for the evaluation's problems) or an MLflow study reported into a temporary one; what it estimates,
prints and writes: `command` below and docs/sweeps.md, "Planning a study"."""

from __future__ import annotations

import csv
import json
import math
import shlex
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from itertools import combinations
from pathlib import Path
from typing import Optional

import numpy as np

from rlvrlab.config.flags import option as _opt
from rlvrlab.errors import RlvrlabError
from rlvrlab.stats import ALPHA
from rlvrlab.stats.design import (
    Components,
    Design,
    bernoulli_variance,
    components,
    design_mde,
    pooled,
    seeds_only,
    smallest_design,
)

RATE = "pass@1"  # the per-problem metric that is a mean of 0/1 samples (the Bernoulli term is modelled for it)
MAX_SAMPLES = 4096


MLFLOW_PILOTS = ("study", "experiment")  # a pilot given as study:NAME or experiment:NAME: its runs in MLflow


@dataclass(frozen=True)
class PlanRequest:
    """One `rlvrlab plan` invocation: a pilot folder and the precision the study needs."""

    folder: Path = Path(".")  # the command's argument
    mde: Optional[float] = _opt(None, "--mde", "The minimum detectable |Δ| the study needs (the metric's units), "
                                "at power 0.8.")
    comparisons: int = _opt(1, "--comparisons", "M: the comparisons of the study's Holm family; the design is "
                            "powered at Holm's first-step level alpha/M.", shown=True, minimum=1)
    metric: Optional[str] = _opt(None, "--metric", "The endpoint; default: per_problem.csv's pass@1, else the first "
                                 "metric of per_seed.csv.")
    section: Optional[str] = _opt(None, "--section", "The metric's section (train or a dataset) where it has several.")
    alpha: float = _opt(ALPHA, "--alpha", "The family-wise level.", shown=True)
    max_seeds: int = _opt(100, "--max-seeds", "The most seeds per group to consider.", shown=True, minimum=2)
    max_problems: Optional[int] = _opt(None, "--max-problems", "The most problems the benchmark has; default: the "
                                       "pilot's.", minimum=2)
    max_samples: Optional[int] = _opt(None, "--max-samples", "The most samples per problem; default: the pilot's.",
                                      minimum=1)
    samples: Optional[int] = _opt(None, "--samples", "The pilot's samples per problem; default: read from the "
                                  "pass@1 values (multiples of 1/n).", minimum=2)
    protocol_out: Optional[Path] = _opt(None, "--protocol-out", "Also write a pre-filled protocol (markdown with a "
                                        "```verdict block) to this file.")
    output_dir: Path = _opt(Path("runs"), "--output-dir", "With study:NAME or experiment:NAME, the runs' output_dir.",
                            shown=True)


@dataclass(frozen=True)
class Pilot:
    folder: Path
    section: str
    metric: str
    groups: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]
    pairs_from: str  # "comparisons.csv" or "every pair of groups"
    seeds: tuple[int, ...]
    problems: Optional[int]  # None: per-seed values only
    samples: Optional[int]
    paired: Components  # pooled over the pairs
    group: Components  # pooled over the groups
    seconds_per_run: Optional[float]


@dataclass(frozen=True)
class Plan:
    pilot: Pilot
    request: PlanRequest
    level: float
    design: Design
    pilot_mde: float
    alternatives: tuple[Design, ...]  # the fewest seeds at each number of samples per problem

    @property
    def seed_runs(self) -> int:
        return len(self.pilot.groups) * self.design.seeds


def command(folder: Path, **given) -> None:
    """Estimate a pilot's seed, problem and sampling variance (FOLDER: a results folder with per_seed.csv and
    per_problem.csv; study:NAME or experiment:NAME for MLflow runs) and print the cheapest seeds × samples per problem ×
    problems reaching --mde at Holm's first-step level alpha/M, with its cost in seed runs and seconds (docs/sweeps.md,
    "Planning a study").

    [dim]rlvrlab plan results/tiny_tau_eps_staleness_grid --mde 0.03 --comparisons 10 \\
        --protocol-out results/protocols/NAME.md
    rlvrlab plan results/ucpo_tau --mde 0.02 --metric policy/toy_correct_uniformity
    rlvrlab plan study:toy_confirm --output-dir runs --mde 0.01[/dim]
    """
    request = PlanRequest(folder=Path(folder), **given)
    with pilot_folder(request) as pilot:
        result = plan(replace(request, folder=pilot))
        result = replace(result, pilot=replace(result.pilot, folder=request.folder))  # study:NAME, not a temp folder
        done = write_protocol(result, command_line(request))
        for line in lines(result) + ([done] if done else []):
            print(line)


@contextmanager
def pilot_folder(request: PlanRequest) -> Iterator[Path]:
    """The pilot's results folder: FOLDER itself, or for study:NAME (experiment:NAME) the report of its runs written to
    a temporary folder (per_seed.csv, per_problem.csv and sources.json with each run's duration_s), as `rlvrlab report
    --study NAME --output-dir DIR` (--experiment NAME) writes it."""
    kind, _, name = str(request.folder).partition(":")
    if kind not in MLFLOW_PILOTS or not name:
        yield request.folder
        return
    from rlvrlab.report.command import ReportRequest, make_report

    with tempfile.TemporaryDirectory(prefix="rlvrlab-plan-") as tmp:
        out = Path(tmp) / name
        make_report(ReportRequest(study=name if kind == "study" else None,
                                  experiment=name if kind == "experiment" else None,
                                  output_dir=request.output_dir, plots=False, out=out))
        yield out


def command_line(request: PlanRequest) -> str:
    """The `rlvrlab plan` command that makes this request (its options that differ from the defaults)."""
    words = ["rlvrlab", "plan", str(request.folder)]
    for f in fields(PlanRequest):
        value = getattr(request, f.name)
        if "cli" in f.metadata and value != f.default and f.name != "protocol_out":
            words += [f.metadata["cli"].flag, shlex.quote(str(value))]
    return " ".join(words)


def plan(request: PlanRequest) -> Plan:
    """The design of `request` from its pilot folder; one-line RlvrlabError for a bad folder or option."""
    if request.mde is None or not request.mde > 0 or not math.isfinite(request.mde):
        raise RlvrlabError(f"--mde must be a number > 0 (the smallest |Δ| the study must detect), got {request.mde}")
    if not 0 < request.alpha < 1:
        raise RlvrlabError(f"--alpha must be in (0, 1), got {request.alpha}")
    pilot = read_pilot(request)
    problems = request.max_problems or pilot.problems
    samples = request.max_samples or pilot.samples
    level = request.alpha / request.comparisons
    design = smallest_design(pilot.paired, request.mde, comparisons=request.comparisons, samples=samples,
                             problems=problems, alpha=request.alpha, max_seeds=request.max_seeds)
    if design is None:
        best = design_mde(pilot.paired, request.max_seeds, samples, problems, alpha=level)
        raise RlvrlabError(f"no design of <= {request.max_seeds} seeds reaches an MDE of {request.mde:g} at level "
                           f"{level:.3g} ({request.max_seeds} seeds reach {best:.3g}); raise --max-seeds, "
                           "--max-problems or --max-samples, or plan for a larger --mde")
    alternatives: list[Design] = []
    if problems is not None and samples is not None:
        for n in sorted({min(n, samples) for n in (1, 4, 16, samples)}):
            alt = smallest_design(pilot.paired, request.mde, comparisons=request.comparisons, samples=n,
                                  problems=problems, alpha=request.alpha, max_seeds=request.max_seeds)
            if alt is not None and alt not in alternatives:
                alternatives.append(alt)
    pilot_mde = design_mde(pilot.paired, len(pilot.seeds), pilot.samples, pilot.problems, alpha=level)
    return Plan(pilot, request, level, design, pilot_mde, tuple(alternatives))


def read_pilot(request: PlanRequest) -> Pilot:
    """The pilot's values of the planned metric, its pairs and its pooled variance components."""
    folder = Path(request.folder)
    if not folder.is_dir():
        raise RlvrlabError(f"pilot folder {folder} does not exist; give a results folder that `rlvrlab report` "
                           "wrote (e.g. results/tiny_tau_eps_staleness_grid)")
    if not (folder / "per_seed.csv").is_file():
        raise RlvrlabError(f"{folder} has no per_seed.csv; give a results folder that `rlvrlab report` wrote")
    per_problem = _rows(folder / "per_problem.csv") if (folder / "per_problem.csv").is_file() else []
    per_seed = _rows(folder / "per_seed.csv")
    section, metric, by_problem = _endpoint(request, per_seed, per_problem)
    rows = [r for r in (per_problem if by_problem else per_seed) if r["section"] == section and r["metric"] == metric]
    values: dict[str, dict[int, dict[str, float]]] = {}
    for r in rows:
        values.setdefault(r["group"], {}).setdefault(int(r["seed"]), {})[r.get("problem", "")] = float(r["value"])
    groups = tuple(values)
    pairs, pairs_from = _pairs(folder, section, metric, groups)
    samples = (request.samples or _samples(rows, folder)) if by_problem else None
    tables = {g: _table(values[g]) for g in groups}
    paired = [c for a, b in pairs if (c := _components(tables[a], tables[b], samples)) is not None]
    if not paired:
        raise RlvrlabError(f"{folder}: no pair of groups shares >= 2 seeds on {metric}; a plan needs a paired pilot")
    own = [components(t[2], bernoulli_variance(t[2], samples), samples) if samples else seeds_only(t[2].mean(axis=1))
           for t in tables.values() if len(t[0]) >= 2]
    seeds = sorted({s for t in tables.values() for s in t[0]})
    problems = len(next(iter(tables.values()))[1]) if by_problem else None
    return Pilot(folder, section, metric, groups, pairs, pairs_from, tuple(seeds), problems, samples, pooled(paired),
                 pooled(own), _seconds(folder))


def _rows(path: Path) -> list[dict]:
    """A CSV the report wrote, its rows with a finite value (a failed run's nan is no evidence)."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        needed = {"group", "section", "seed", "metric", "value"} | ({"problem"} if path.name == "per_problem.csv"
                                                                    else set())
        if path.name.startswith("per_") and not needed <= set(reader.fieldnames or ()):
            raise RlvrlabError(f"{path} lacks the columns {', '.join(sorted(needed - set(reader.fieldnames or ())))}; "
                               "give a results folder that `rlvrlab report` wrote")
        return [row for row in reader if "value" not in row or math.isfinite(float(row["value"] or "nan"))]


def _endpoint(request: PlanRequest, per_seed: list[dict], per_problem: list[dict]) -> tuple[str, str, bool]:
    """(section, metric, whether per_problem.csv's values are used) of the planned metric."""
    metric = request.metric or (RATE if any(r["metric"] == RATE for r in per_problem) else
                                per_seed[0]["metric"] if per_seed else None)
    if metric is None:
        raise RlvrlabError(f"{request.folder}/per_seed.csv holds no values; give a pilot folder with values")
    source = per_problem if metric == RATE and any(r["metric"] == RATE for r in per_problem) else per_seed
    sections = list(dict.fromkeys(r["section"] for r in source if r["metric"] == metric))
    if request.section is not None:
        sections = [s for s in sections if s == request.section]
    if len(sections) != 1:
        known = sorted({r["metric"] for r in per_seed})
        raise RlvrlabError(f"{request.folder}: metric {metric!r}" + (
            f" is in sections {', '.join(sections)}; pick one with --section" if sections else
            f"{' in section ' + request.section if request.section else ''} is not in the pilot; its metrics: "
            f"{', '.join(known)}"))
    return sections[0], metric, source is per_problem


def _pairs(folder: Path, section: str, metric: str, groups: tuple[str, ...]):
    """The pilot's comparisons of this metric (comparisons.csv), else every pair of its groups."""
    listed = []
    if (folder / "comparisons.csv").is_file():
        listed = list(dict.fromkeys((r["a"], r["b"]) for r in _rows(folder / "comparisons.csv")
                                    if r["metric"] == metric and r["section"] == section
                                    and r["a"] in groups and r["b"] in groups))
    if listed:
        return tuple(listed), "comparisons.csv"
    return tuple(combinations(groups, 2)), "every pair of groups"


def _table(by_seed: dict[int, dict[str, float]]) -> tuple[tuple[int, ...], tuple[str, ...], np.ndarray]:
    """(seeds, problems, x [S, P]) over the seeds that have every problem the first seed has."""
    problems = tuple(sorted(next(iter(by_seed.values()))))
    seeds = tuple(sorted(s for s, row in by_seed.items() if set(problems) <= set(row)))
    return seeds, problems, np.array([[by_seed[s][p] for p in problems] for s in seeds], dtype=np.float64)


def _components(a, b, samples: Optional[int]) -> Optional[Components]:
    """The components of the paired difference a - b on their shared seeds (and problems)."""
    seeds = sorted(set(a[0]) & set(b[0]))
    if len(seeds) < 2 or a[1] != b[1]:
        return None
    xa, xb = (t[2][[t[0].index(s) for s in seeds]] for t in (a, b))
    if samples is None:
        return seeds_only((xa - xb).mean(axis=1))
    return components(xa - xb, bernoulli_variance(xa, samples) + bernoulli_variance(xb, samples), samples)


def _samples(rows: list[dict], folder: Path) -> int:
    """The pilot's samples per problem: the smallest n for which every pass@1 value is a multiple of 1/n."""
    values = np.array([float(r["value"]) for r in rows])
    for n in range(2, MAX_SAMPLES + 1):
        if np.all(np.abs(values * n - np.round(values * n)) < 1e-6 * n):
            return n
    raise RlvrlabError(f"{folder}/per_problem.csv: cannot tell the samples per problem from its pass@1 values; "
                       "give them with --samples N")


def _seconds(folder: Path) -> Optional[float]:
    """The mean seconds of a seed run where sources.json records every run's duration_s (else None)."""
    try:
        sources = json.loads((folder / "sources.json").read_text())
    except (OSError, ValueError):
        return None
    runs = [run for group in sources.get("groups", []) for run in group.get("runs", [])]
    durations = [run.get("duration_s") for run in runs]
    if not runs or not all(isinstance(d, (int, float)) and d >= 0 for d in durations):
        return None
    return float(np.mean(durations))


def lines(result: Plan) -> list[str]:
    """What `rlvrlab plan` prints: the pilot, its components, the design and its cost, the alternatives."""
    p, d, r = result.pilot, result.design, result.request
    pc, gc = p.paired, p.group
    shape = (f"{len(p.seeds)} seeds × {p.samples} samples × {p.problems} problems" if p.problems is not None else
             f"{len(p.seeds)} seeds (per-seed values only: samples and problems are not planned)")
    out = [f"pilot: {p.folder}: {len(p.groups)} groups, {shape}; {p.section} {p.metric}; "
           f"{len(p.pairs)} paired differences ({p.pairs_from})",
           "variance components (sd; paired differences pooled over the pairs, a group's own in brackets):",
           f"  seed            {_sd(pc.seed)}  [{_sd(gc.seed)}]   shrinks with seeds only"]
    if p.problems is not None:
        out += [f"  problem         {_sd(pc.problem)}  [{_sd(gc.problem)}]   the same for every seed: cancels in "
                "a seed's differences; / √problems in the crossed comparison",
                f"  seed×problem    {_sd(pc.seed_problem)}  [{_sd(gc.seed_problem)}]   / √problems per seed",
                f"  sampling        {_sd(pc.bernoulli)}  [{_sd(gc.bernoulli)}]   per sample; / √(samples·problems) "
                "per seed"]
    out += [f"  a seed's score  {_sd(pc.per_seed_var(p.samples, p.problems))}  "
            f"[{_sd(gc.per_seed_var(p.samples, p.problems))}]   at the pilot's design",
            f"level: Holm's first step, alpha/M = {r.alpha:g}/{r.comparisons} = {result.level:.3g}; power 0.8; "
            f"two-sided {_test(p)}; noncentral t on seeds - 1 df",
            f"pilot's design: MDE {result.pilot_mde:.4g}",
            f"design: {_shape(d)} → MDE {d.mde:.4g} (target {r.mde:g})",
            f"cost: {len(p.groups)} groups × {d.seeds} seeds = {result.seed_runs} seed runs; " + (
                f"{result.seed_runs * p.seconds_per_run:,.0f} s measured ({p.seconds_per_run:,.3g} s a seed run in "
                "the pilot)" if p.seconds_per_run is not None else
                "seconds unknown (the pilot's sources.json records no run durations)")]
    if d.problems is not None and d.samples is not None:
        out.append(f"evaluation: {result.seed_runs * d.samples * d.problems:,} sampled responses "
                   f"({result.seed_runs} runs × {d.samples} × {d.problems})")
    if len(result.alternatives) > 1:
        out.append("alternatives (the fewest seeds with at most 1, 4, 16 or the pilot's samples per problem):")
        out += [f"  {_shape(a)} → MDE {a.mde:.4g}; {len(p.groups) * a.seeds} seed runs" for a in result.alternatives]
    return out


def _test(p: Pilot) -> str:
    return ("paired crossed comparison (seeds × problems, as the report's for evaluations)" if p.problems is not None
            else "paired t by seed")


def _sd(var: float) -> str:
    return "n/a" if not math.isfinite(var) else f"{math.sqrt(var):.4g}"


def _shape(d: Design) -> str:
    return (f"{d.seeds} seeds × {d.samples} samples × {d.problems} problems" if d.problems is not None else
            f"{d.seeds} seeds")


def protocol(result: Plan, command: str) -> str:
    """A pre-filled protocol (results/protocols/*.md): question, test bed, design, test and a ```verdict block whose
    conditions are the pilot's comparisons; commit it before the first run of the study."""
    p, d, r = result.pilot, result.design, result.request
    fresh = max(p.seeds) + 1
    evaluation = (f"; evaluation: {d.samples} samples per problem on {d.problems} problems of {p.section}"
                  if p.problems is not None else "")
    pairs = [f"{a} vs {b}" for a, b in p.pairs]
    leaves = "\n".join(f"      - {{comparison: {json.dumps(c)}, section: {json.dumps(p.section)}, metric: "
                       f"{json.dumps(p.metric)}, where: [p_holm < {r.alpha:g}]}}" for c in pairs)
    return "\n".join([
        f"# Protocol: {p.metric} ({p.section}) on the groups of {p.folder.name}, planned from its pilot",
        "",
        f"Pre-filled by `{command}`; commit it before the first run of the study (its verdict rules are then "
        "pre-registered).",
        "",
        "## Question",
        "",
        f"Does {p.metric} ({p.section}) differ, by at least {r.mde:g}, in any of the {len(pairs)} comparisons below?",
        "",
        "## Test bed",
        "",
        f"The pilot's groups ({', '.join(p.groups)}), each on seeds {fresh}–{fresh + d.seeds - 1} (paired, disjoint "
        f"from the pilot's {min(p.seeds)}–{max(p.seeds)}){evaluation}. This plan fixes no initial model: add a "
        "testbed block (`rlvrlab model digest EXPERIMENT` prints its digest) to fix one.",
        "",
        "## Design (rlvrlab plan)",
        "",
        *[f"    {line}" for line in lines(result)],
        "",
        "## Endpoints and tests",
        "",
        f"- **Primary**: {p.metric} ({p.section}), in each comparison: " + "; ".join(pairs) + ".",
        f"- Test: {_test(p)}, two-sided, α = {r.alpha:g}; Holm over the {r.comparisons} comparisons of the "
        f"family (the design detects |Δ| = {d.mde:.4g} with power 0.8 at the first step, α/{r.comparisons}).",
        "",
        "## Verdicts",
        "",
        "```verdict",
        f"question: {json.dumps(p.metric + ' differs')}",
        "precedence: first",
        "rules:",
        "  - verdict: shown",
        "    any:",
        leaves,
        "  - verdict: not shown",
        "```",
        "",
    ])


def write_protocol(result: Plan, command: str) -> Optional[str]:
    """Write the protocol to --protocol-out; the line saying so (None without --protocol-out)."""
    path = result.request.protocol_out
    if path is None:
        return None
    try:
        Path(path).write_text(protocol(result, command))
    except OSError as error:
        raise RlvrlabError(f"--protocol-out {path} cannot be written ({error.strerror or error}); give a writable "
                           "path") from None
    return f"done: wrote the protocol {path} (commit it before the study's first run)"
