"""Sample n responses per problem, verify them, and turn the verdicts into per-problem records and aggregates.

    sampler = open_sampler(folder, Sampling(engine="hf", temperature=1.0, top_p=1.0, max_new_tokens=32))
    with RewardPool("countdown") as pool:
        result = evaluate(sampler, problems, render, n=64, ks=[1, 4, 16, 64], seed=0, pool=pool)
    summary = aggregate(result.records, ks=[1, 4, 16, 64])

A response is correct when its Verdict.reason is "correct". maj@k votes on answer classes built in two steps:
identical Verdict.answer strings are one group; groups whose representatives the verifier's `same_answer`
calls equivalent are merged (transitively). Classes are then split by verdict, so a correct and a wrong
response never vote together even when their extracted answers agree (Countdown: "24" reached with a number
that was not given). Responses without an answer (Verdict.answer None) never vote. The statistics themselves
are in rlvrlab.algorithms.passk; docs/evaluation.md describes all of it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvrlab import components, outputs
from rlvrlab.algorithms.passk import avg_at_n, diversity_of_correct, maj_at_k, mean, pass_at_k, problem_interval
from rlvrlab.components import Sampling
from rlvrlab.data.problems import Problem
from rlvrlab.errors import RlvrlabError
from rlvrlab.rewards.base import Verdict
from rlvrlab.rollout.base import Generation, RolloutEngine

# Responses per generate call when Sampling.batch_prompts is not given: prompts * n stays near this.
HF_BATCH_RESPONSES = 256
VLLM_BATCH_RESPONSES = 8192


@dataclass
class Sampler:
    """A rollout engine with the tokenizer of its model (for prompts and the eos id)."""

    engine: RolloutEngine
    tokenizer: Any
    sampling: Sampling

    @property
    def eos_id(self) -> int | None:
        return getattr(self.tokenizer, "eos_token_id", None)

    def close(self) -> None:
        self.engine.close()


def open_sampler(folder: Path, sampling: Sampling, *, seed: int = 0, device: str | None = None) -> Sampler:
    """Load the HF model folder into the chosen rollout engine (the hf engine on `device`: cuda or cpu, default the
    GPU when torch sees one). RlvrlabError when it cannot be loaded."""
    folder = components.check_model_folder(folder)
    components.torch_dtype(sampling.dtype)  # checked before anything is loaded
    tokenizer = components.load_tokenizer(folder)
    import torch

    return Sampler(components.rollout_engine(sampling, folder, tokenizer, seed=seed,
                                             device=torch.device(device) if device else None), tokenizer, sampling)


@dataclass
class EvalResult:
    records: list[dict]  # one per problem (see problem_record)
    samples: list[dict]  # one per response: text, verdict, length


def check_ks(ks: Sequence[int], n: int) -> list[int]:
    """Sorted distinct ks; RlvrlabError unless 1 <= k <= n for each (pass@k is undefined for k > n)."""
    if n < 1:
        raise RlvrlabError(f"--n {n}: need at least one sample per problem")
    bad = [k for k in ks if not 1 <= k <= n]
    if bad or not ks:
        raise RlvrlabError(f"--k {','.join(map(str, ks)) or '(none)'}: every k must be between 1 and --n {n} "
                           f"(pass@k needs k <= n samples); lower k or raise --n")
    return sorted(set(ks))


def evaluate(sampler: Sampler | RolloutEngine, problems: Sequence[Problem], render: Callable[[Problem], list[int]],
             *, n: int, ks: Sequence[int], seed: int, pool, dataset: str = "", eos_id: int | None = None,
             batch_prompts: int | None = None, progress: Callable[[int, int], None] | None = None) -> EvalResult:
    """Sample n responses per problem (prompts batched), verify them with `pool` (a RewardPool) and compute
    each problem's statistics. progress(done, total) is called after each batch.

    Batch b is generated with seed `seed + 7919 * b`: the same seed, batch size and weights give the same
    samples (HF engine: on the same hardware).
    """
    ks = check_ks(ks, n)
    engine = sampler.engine if isinstance(sampler, Sampler) else sampler
    if isinstance(sampler, Sampler):
        eos_id = sampler.eos_id if eos_id is None else eos_id
        default_batch = (VLLM_BATCH_RESPONSES if sampler.sampling.engine == "vllm" else HF_BATCH_RESPONSES)
        batch_prompts = batch_prompts or sampler.sampling.batch_prompts or max(1, default_batch // n)
    batch_prompts = batch_prompts or max(1, HF_BATCH_RESPONSES // n)
    records: list[dict] = []
    samples: list[dict] = []
    total = len(problems)
    for b, start in enumerate(range(0, total, batch_prompts)):
        batch = list(problems[start:start + batch_prompts])
        generations = engine.generate([render(p) for p in batch], n=n, seed=seed + 7919 * b)
        texts = [g.text for gens in generations for g in gens]
        truths = [p.answer for p, gens in zip(batch, generations) for _ in gens]
        verdicts = pool.score(texts, truths)
        per_problem = [verdicts[i * n:(i + 1) * n] for i in range(len(batch))]
        classes = answer_classes(per_problem, pool)
        for problem, gens, verdicts_p, classes_p in zip(batch, generations, per_problem, classes):
            records.append(problem_record(problem, verdicts_p, classes_p, ks, dataset=dataset,
                                          generations=gens, eos_id=eos_id))
            samples.extend(_sample_rows(problem, gens, verdicts_p, dataset, eos_id))
        if progress is not None:
            progress(min(start + batch_prompts, total), total)
    return EvalResult(records, samples)


def _finished(gen: Generation, eos_id: int | None) -> bool:
    return bool(gen.response_ids) and eos_id is not None and gen.response_ids[-1] == eos_id


def _sample_rows(problem: Problem, gens: Sequence[Generation], verdicts: Sequence[Verdict], dataset: str,
                 eos_id: int | None) -> list[dict]:
    return [{"dataset": dataset, "id": problem.id, "sample": j, "response": g.text, "reason": v.reason,
             "score": v.score, "answer": v.answer, "form": v.form, "n_tokens": len(g.response_ids),
             "finished": _finished(g, eos_id)} for j, (g, v) in enumerate(zip(gens, verdicts))]


@dataclass
class AnswerClass:
    """Responses of one problem that vote together in maj@k."""

    answer: str  # the most frequent answer string of the class (its representative)
    correct: bool
    size: int
    variants: list[str] = field(default_factory=list)  # the other answer strings merged into it


def answer_classes(per_problem: Sequence[Sequence[Verdict]], pool) -> list[list[AnswerClass]]:
    """Answer classes of each problem: identical (answer, correct) first, then groups of equal correctness whose
    answers pool.same_answer calls equivalent are merged (union-find, so equivalence is made transitive).
    One same_answer call for all the problems given."""
    groups: list[Counter] = []  # per problem: (answer, correct) -> count
    pairs: list[tuple[str, str]] = []
    owners: list[tuple[int, tuple, tuple]] = []
    for index, verdicts in enumerate(per_problem):
        counts = Counter((v.answer, v.reason == "correct") for v in verdicts if v.answer is not None)
        groups.append(counts)
        keys = list(counts)
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                if a[1] == b[1]:  # a correct and a wrong response never vote together
                    pairs.append((a[0], b[0]))
                    owners.append((index, a, b))
    same = pool.same_answer(pairs) if pairs else []
    parents: list[dict] = [{key: key for key in counts} for counts in groups]

    def root(index: int, key: tuple) -> tuple:
        parent = parents[index]
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for (index, a, b), equal in zip(owners, same):
        if equal:
            ra, rb = root(index, a), root(index, b)
            if ra != rb:
                parents[index][rb] = ra
    out: list[list[AnswerClass]] = []
    for index, counts in enumerate(groups):
        members: dict[tuple, list[tuple]] = defaultdict(list)
        for key in counts:
            members[root(index, key)].append(key)
        classes = []
        for keys in members.values():
            keys.sort(key=lambda key: (-counts[key], key[0]))
            classes.append(AnswerClass(keys[0][0], keys[0][1], sum(counts[key] for key in keys),
                                       [key[0] for key in keys[1:]]))
        classes.sort(key=lambda c: (-c.size, not c.correct, c.answer))
        out.append(classes)
    return out


def problem_record(problem: Problem, verdicts: Sequence[Verdict], classes: Sequence[AnswerClass], ks: Sequence[int],
                   *, dataset: str = "", generations: Sequence[Generation] | None = None,
                   eos_id: int | None = None) -> dict:
    """The statistics of one problem from its n verdicts and answer classes."""
    n = len(verdicts)
    correct = [v for v in verdicts if v.reason == "correct"]
    c = len(correct)
    unanswered = sum(v.answer is None for v in verdicts)
    pairs = [(cls.size, cls.correct) for cls in classes]
    forms = [v.form if v.form is not None else (v.answer or "") for v in correct]
    diversity, distinct, _ = diversity_of_correct(forms)
    record: dict[str, Any] = {"dataset": dataset, "id": problem.id, "source": problem.source or dataset,
                              "n": n, "c": c, "avg@n": avg_at_n(n, c)}
    record.update({f"pass@{k}": pass_at_k(n, c, k) for k in ks})
    record.update({f"maj@{k}": maj_at_k(pairs, k, unanswered=unanswered) for k in ks})
    record.update({"correct_distinct": distinct, "diversity": diversity, "no_answer": unanswered,
                   # how many correct responses share each solution form (rarefaction needs the counts)
                   "correct_forms": sorted(Counter(forms).values(), reverse=True),
                   "reasons": dict(sorted(Counter(v.reason for v in verdicts).items())),
                   "answers": [{"answer": cls.answer, "count": cls.size, "correct": cls.correct,
                                **({"variants": cls.variants} if cls.variants else {})} for cls in classes]})
    if generations is not None:
        record["mean_tokens"] = sum(len(g.response_ids) for g in generations) / max(1, len(generations))
        record["truncated"] = sum(not _finished(g, eos_id) for g in generations) if eos_id is not None else None
    return record


STAT_PREFIXES = ("avg@n", "pass@", "maj@")


def _summary(records: Sequence[dict], ks: Sequence[int]) -> dict:
    names = ["avg@n", *(f"pass@{k}" for k in ks), *(f"maj@{k}" for k in ks)]
    out: dict[str, Any] = {"problems": len(records), "responses": sum(r["n"] for r in records)}
    out.update({name: mean([r[name] for r in records]) for name in names})
    # per-problem standard error and 95% t-interval of each mean (passk.problem_interval): one run, so the
    # variation is the benchmark's problems (with their sampling noise), not training seeds
    # (None for fewer than 2 problems: aggregate.json stays strict JSON)
    out["intervals"] = {name: {key: None if math.isnan(v) else v for key, v in
                               zip(("se", "low", "high"), problem_interval([r[name] for r in records])[1:])}
                        for name in names}
    diversities = [r["diversity"] for r in records if r["diversity"] is not None]
    out["diversity"] = mean(diversities)  # over problems with at least one correct response
    out["diversity_problems"] = len(diversities)
    out["correct_distinct"] = mean([r["correct_distinct"] for r in records])
    reasons: Counter = Counter()
    for r in records:
        reasons.update(r["reasons"])
    out["reasons"] = dict(sorted(reasons.items()))
    out["no_answer_rate"] = sum(r["no_answer"] for r in records) / max(1, out["responses"])
    return out


def aggregate(records: Sequence[dict], ks: Sequence[int]) -> dict:
    """Unweighted means over problems, per dataset, and per source within a dataset when its sources differ."""
    by_dataset: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_dataset[r["dataset"]].append(r)
    out: dict[str, Any] = {}
    for name, rows in by_dataset.items():
        entry = _summary(rows, ks)
        sources: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            sources[r["source"]].append(r)
        if len(sources) > 1:
            entry["by_source"] = {source: _summary(group, ks) for source, group in sorted(sources.items())}
        out[name] = entry
    return out


def metric_key(*parts: str) -> str:
    """An MLflow-safe metric name: '@' -> '_at_', other characters outside [A-Za-z0-9_./ -:] -> '_'."""
    import re

    text = "/".join(p.replace("@", "_at_") for p in parts if p)
    return re.sub(r"[^A-Za-z0-9_./ :-]", "_", text)


def mlflow_metrics(summary: dict) -> dict[str, float]:
    """eval/<dataset>[/<source>]/{avg_at_n,pass_at_k,maj_at_k,diversity,...} -> value (None skipped)."""
    out: dict[str, float] = {}

    def add(prefix: tuple[str, ...], entry: dict) -> None:
        for name, value in entry.items():
            if name.startswith(STAT_PREFIXES) or name in ("diversity", "diversity_problems", "correct_distinct",
                                                          "no_answer_rate", "problems"):
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    out[metric_key("eval", *prefix, name)] = float(value)

    for dataset, entry in summary.items():
        add((dataset,), entry)
        for source, sub in entry.get("by_source", {}).items():
            add((dataset, source), sub)
    return out


CSV_SCALARS = ("dataset", "id", "source", "n", "c", "avg@n")


def write_outputs(out: Path, records: Sequence[dict], samples: Sequence[dict], summary: dict,
                  ks: Sequence[int]) -> list[Path]:
    """records.jsonl, records.csv (scalars; answers as the top answer), samples.jsonl, aggregate.json. Each is whole
    or as it was (rlvrlab.outputs.replacing): a full disk leaves no empty or partial file, and a one-line error."""
    import csv
    import json

    out.mkdir(parents=True, exist_ok=True)
    files = [out / "records.jsonl", out / "records.csv", out / "samples.jsonl", out / "aggregate.json"]
    with outputs.replacing(files[0]) as tmp, tmp.open("w", encoding="utf-8") as handle:
        for r in records:
            handle.write(json.dumps(r, ensure_ascii=False) + "\n")
    columns = [*CSV_SCALARS, *(f"pass@{k}" for k in ks), *(f"maj@{k}" for k in ks), "correct_distinct",
               "diversity", "no_answer", "top_answer", "top_answer_count", "top_answer_correct", "reasons"]
    with outputs.replacing(files[1]) as tmp, tmp.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for r in records:
            top = r["answers"][0] if r["answers"] else {"answer": "", "count": 0, "correct": ""}
            row = {name: r.get(name) for name in columns}
            row.update(top_answer=top["answer"], top_answer_count=top["count"], top_answer_correct=top["correct"],
                       reasons=";".join(f"{k}={v}" for k, v in r["reasons"].items()),
                       diversity="" if r["diversity"] is None else r["diversity"])
            writer.writerow(row)
    with outputs.replacing(files[2]) as tmp, tmp.open("w", encoding="utf-8") as handle:
        for s in samples:
            handle.write(json.dumps(s, ensure_ascii=False) + "\n")
    outputs.write_replacing(files[3], json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return files
