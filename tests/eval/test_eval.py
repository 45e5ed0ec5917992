"""rlvrlab.eval: pass@k / maj@k / diversity against exact combinatorics, and `rlvrlab eval pass-at-k` end to end."""

from __future__ import annotations

import itertools
import json
import math
import random
import shutil
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from rlvrlab.algorithms.passk import avg_at_n, diversity_of_correct, maj_at_k, pass_at_k
from rlvrlab.data.problems import Problem
from rlvrlab.errors import RlvrlabError
from rlvrlab.eval.run import aggregate, answer_classes, check_ks, evaluate, metric_key, mlflow_metrics, problem_record
from rlvrlab.rewards.base import Verdict
from rlvrlab.rollout.base import Generation

REPO = Path(__file__).resolve().parents[2]
MATH_FIXTURE = REPO / "tests" / "fixtures" / "benchmarks" / "math500.jsonl"


# ---------------------------------------------------------------- pass@k


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_equals_the_combinatorial_formula():
    cases = [(n, c, k) for n in range(1, 13) for c in range(n + 1) for k in range(1, n + 1)]
    for n in (16, 64, 200):
        cs = sorted({0, 1, 2, n // 8, n // 4, n // 2, n - 2, n - 1, n})
        cases += [(n, c, k) for c in cs for k in sorted({1, 2, 8, n // 2, n - 1, n})]
    for n, c, k in cases:
        assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_computed_and_edge_cases():
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-12)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-12)
    assert pass_at_k(16, 2, 4) == pytest.approx(0.45, abs=1e-12)  # the research note's verl comparison
    assert pass_at_k(16, 1, 16) == 1.0
    for n in (1, 7, 64):
        assert pass_at_k(n, 0, 1) == 0.0 and pass_at_k(n, 0, n) == 0.0  # c = 0
        assert pass_at_k(n, n, 1) == 1.0 and pass_at_k(n, n, n) == 1.0  # c = n
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-15)  # pass@1 = c/n
            assert avg_at_n(n, c) == c / n


def test_pass_at_k_refuses_k_above_n_and_bad_counts():
    with pytest.raises(ValueError, match="k=5 must be between 1 and the number of samples n=4"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(RlvrlabError, match="every k must be between 1 and --n 4"):
        check_ks([1, 8], 4)
    assert check_ks([4, 1, 2, 2], 4) == [1, 2, 4]


# ---------------------------------------------------------------- maj@k


def brute_maj_at_k(classes: list[tuple[int, bool]], k: int, unanswered: int = 0) -> Fraction:
    """Enumerate every k-subset: plurality class wins, ties split uniformly, unanswered never vote."""
    labels = [j for j, (m, _) in enumerate(classes) for _ in range(m)] + [None] * unanswered
    total, count = Fraction(0), 0
    for subset in itertools.combinations(range(len(labels)), k):
        count += 1
        votes = Counter(labels[i] for i in subset if labels[i] is not None)
        if not votes:
            continue
        top = max(votes.values())
        tied = [j for j, v in votes.items() if v == top]
        total += Fraction(sum(classes[j][1] for j in tied), len(tied))
    return total / count


def test_maj_at_k_hand_made_examples():
    # A (correct) x2, B (wrong) x1, k=2: {A,A} wins, {A,B} twice a tie at 1/2 -> (1 + 1/2 + 1/2) / 3
    assert maj_at_k([(2, True), (1, False)], 2) == pytest.approx(2 / 3, abs=1e-12)
    # three singleton answers, one right: every subset is a tie -> 1/3 for k = 2 and 3
    assert maj_at_k([(1, True), (1, False), (1, False)], 2) == pytest.approx(1 / 3, abs=1e-12)
    assert maj_at_k([(1, True), (1, False), (1, False)], 3) == pytest.approx(1 / 3, abs=1e-12)
    # responses without an answer never win: {A,u1}, {A,u2} win, {u1,u2} scores 0
    assert maj_at_k([(1, True)], 2, unanswered=2) == pytest.approx(2 / 3, abs=1e-12)
    # a wrong plurality beats a correct minority at k = n; maj@1 is the share of correct responses
    assert maj_at_k([(2, True), (3, False)], 5) == 0.0
    assert maj_at_k([(2, True), (3, False)], 1) == pytest.approx(0.4, abs=1e-15)
    assert maj_at_k([(3, False), (1, False)], 2) == 0.0


def test_maj_at_k_equals_brute_force_enumeration():
    rng = random.Random(7)
    checked = 0
    while checked < 120:
        classes = [(rng.randint(1, 4), rng.random() < 0.4) for _ in range(rng.randint(1, 5))]
        unanswered = rng.randint(0, 3)
        n = sum(m for m, _ in classes) + unanswered
        if n > 13:
            continue
        checked += 1
        for k in range(1, n + 1):
            expected = float(brute_maj_at_k(classes, k, unanswered))
            assert maj_at_k(classes, k, unanswered=unanswered) == pytest.approx(expected, abs=1e-12), \
                (classes, unanswered, k)


def test_maj_at_k_large_n_is_a_probability_and_fast():
    import time

    tic = time.perf_counter()
    value = maj_at_k([(20, True), (15, False)] + [(1, False)] * 20 + [(2, True)] * 3, 64, unanswered=3)
    assert 0.0 <= value <= 1.0 and time.perf_counter() - tic < 2.0
    # symmetric: 30 correct and 30 wrong singletons (plus unanswered) -> 1/2 by symmetry
    assert maj_at_k([(1, True)] * 30 + [(1, False)] * 30, 32, unanswered=4) == pytest.approx(0.5, abs=1e-9)
    with pytest.raises(ValueError):
        maj_at_k([(2, True)], 3)


def test_diversity_of_correct():
    assert diversity_of_correct(["a+b", "b+a", "a+b", "c"]) == (0.75, 3, 4)
    assert diversity_of_correct(["x"] * 5) == (0.2, 1, 5)
    assert diversity_of_correct([]) == (None, 0, 0)


# ---------------------------------------------------------------- answer classes, records, aggregates


class FakePool:
    """same_answer: numeric equality where both parse as numbers (the real pool is used below)."""

    def __init__(self):
        self.pairs: list[tuple[str, str]] = []

    def same_answer(self, pairs):
        self.pairs += pairs

        def num(text):
            try:
                return Fraction(text)
            except ValueError:
                return text

        return [num(a) == num(b) for a, b in pairs]


def test_answer_classes_merge_equivalent_answers_and_split_by_verdict():
    verdicts = [Verdict(1.0, "correct", "1/2", "f1"), Verdict(1.0, "correct", "0.5", "f2"),
                Verdict(0.0, "wrong", "0.5"), Verdict(0.0, "wrong", "3"), Verdict(0.0, "wrong", "6/2"),
                Verdict(0.0, "wrong", "3"), Verdict(0.0, "no_answer"), Verdict(0.0, "timeout")]
    pool = FakePool()
    (classes,) = answer_classes([verdicts], pool)
    # wrong "3" x2 and "6/2" merge; the correct 1/2 and 0.5 merge; the wrong 0.5 stays apart (other verdict)
    assert [(c.answer, c.size, c.correct) for c in classes] == [("3", 3, False), ("0.5", 2, True),
                                                                 ("0.5", 1, False)]
    assert classes[0].variants == ["6/2"]
    # only answers with the same verdict are compared: the correct pair, and the three wrong ones pairwise
    assert sorted(map(frozenset, pool.pairs), key=sorted) == sorted(
        map(frozenset, [("1/2", "0.5"), ("0.5", "3"), ("0.5", "6/2"), ("3", "6/2")]), key=sorted)
    record = problem_record(Problem("p", "q", "1/2", "src"), verdicts, classes, [1, 2, 8], dataset="d")
    assert (record["n"], record["c"], record["no_answer"]) == (8, 2, 2)
    assert record["pass@2"] == pytest.approx(float(exact_pass_at_k(8, 2, 2)), abs=1e-12)
    assert record["maj@8"] == 0.0  # the wrong "3" class (3 votes) beats the right answer (2 votes)
    assert record["maj@2"] == pytest.approx(float(brute_maj_at_k([(3, False), (2, True), (1, False)], 2, 2)))
    assert (record["correct_distinct"], record["diversity"]) == (2, 1.0)
    assert record["reasons"] == {"correct": 2, "no_answer": 1, "timeout": 1, "wrong": 4}


class ScriptedEngine:
    """Returns scripted texts: problem p's j-th response is script[p.id][j]."""

    def __init__(self, script: dict[str, list[str]], ids_of: dict[tuple[int, ...], str]):
        self.script, self.ids_of, self.calls = script, ids_of, []

    def generate(self, prompts, *, n, seed):
        self.calls.append((len(prompts), seed))
        return [[Generation(tuple(p), (1, 0), text, (0.0, 0.0)) for text in self.script[self.ids_of[tuple(p)]][:n]]
                for p in prompts]

    def close(self):
        pass


def test_evaluate_with_a_scripted_engine_and_the_real_pool():
    from rlvrlab.rewards.pool import RewardPool

    problems = [Problem("a", "1+1", "2", "easy"), Problem("b", "2+2", "4", "easy"), Problem("c", "x", "7", "hard")]
    script = {"a": ["2", "2", "3", " "], "b": ["5", "5", "4", "4"], "c": ["1", "2", "3", "4"]}
    engine = ScriptedEngine(script, {(i,): p.id for i, p in enumerate(problems)})
    render = {p.id: [i] for i, p in enumerate(problems)}
    with RewardPool("exact") as pool:
        result = evaluate(engine, problems, lambda p: render[p.id], n=4, ks=[1, 2, 4], seed=3, pool=pool,
                          dataset="toyset", batch_prompts=2, eos_id=0)
    assert engine.calls == [(2, 3), (1, 3 + 7919)]
    a, b, c = result.records
    assert (a["c"], a["no_answer"], a["maj@4"], a["pass@2"]) == (2, 1, 1.0, pytest.approx(5 / 6))
    assert (b["c"], b["maj@4"]) == (2, 0.5)  # a 2-2 tie between "5" and "4"
    assert (c["c"], c["pass@4"], c["diversity"]) == (0, 0.0, None)
    assert len(result.samples) == 12 and result.samples[0]["finished"] is True
    summary = aggregate(result.records, [1, 2, 4])["toyset"]
    assert summary["pass@1"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert summary["diversity_problems"] == 2 and set(summary["by_source"]) == {"easy", "hard"}
    metrics = mlflow_metrics({"toyset": summary})
    assert "eval/toyset/pass_at_4" in metrics and "eval/toyset/hard/maj_at_2" in metrics
    assert not any("@" in key for key in metrics)
    assert metric_key("eval", "MATH 500!", "pass@1") == "eval/MATH 500_/pass_at_1"


# ---------------------------------------------------------------- the command


def rlvrlab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env={**__import__("os").environ, "RLVRLAB_NO_PROGRESS": "1"})


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def tiny_folder() -> Path:
    """The tiny tier's HF folder for the default config (built once per session, cached)."""
    from rlvrlab.components import model_folder
    from rlvrlab.config import compose
    from rlvrlab.data import load_problems

    cfg = compose(None)
    train, _ = load_problems(cfg.dataset, cfg.model)
    return model_folder(cfg, train)


def fake_run(tmp_path: Path, folder: Path, *, steps: tuple[int, ...] = (2,)) -> tuple[Path, str]:
    """A training run's footprint: an MLflow run in <runs>/mlflow.db, its config and checkpoints of `folder`."""
    from rlvrlab.config import compose, to_yaml
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker
    from rlvrlab.tracking.store import default_uri

    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    tracker = MlflowTracker(default_uri(runs), "trainexp", artifact_root=runs / "mlartifacts", run_name="train")
    tracker.finish("FINISHED")
    run_dir = runs / tracker.run_id
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(compose(None, ["experiment=trainexp", f"output_dir={runs}"])))
    for step in steps:
        ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
        shutil.copytree(folder, ckpt / "model")
        (ckpt / "COMPLETE").write_text(f"{step}\n")
    return runs, tracker.run_id


def test_bad_input_is_one_line_before_sampling(tmp_path):
    assert_one_line_error(rlvrlab("eval", "pass-at-k", "--dataset", "countdown"), "exactly one of --model")
    assert_one_line_error(rlvrlab("eval", "pass-at-k", "--model", str(tmp_path / "nope"), "--dataset", "countdown"),
                          "does not exist")
    assert_one_line_error(rlvrlab("eval", "pass-at-k", "--run", "abc123", "--output-dir", str(tmp_path),
                                  "--dataset", "countdown"), "--run abc123", "--output-dir")
    assert_one_line_error(rlvrlab("eval", "pass-at-k", "--model", str(tmp_path), "--n", "4", "--k", "1,8",
                                  "--dataset", "countdown"), "every k must be between 1 and --n 4")
    (tmp_path / "config.json").write_text("{}")
    assert_one_line_error(rlvrlab("eval", "pass-at-k", "--model", str(tmp_path), "--dataset", "no_such"),
                          "unknown dataset 'no_such'")
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 0\n")
    assert_one_line_error(rlvrlab("eval", "pass-at-k", "--run", "r1", "--output-dir", str(tmp_path / "runs"),
                                  "--dataset", "countdown"), "run r1 has no complete checkpoint")
    assert not (tmp_path / "runs" / "mlflow.db").exists()


@pytest.mark.slow
def test_pass_at_k_on_the_tiny_model_writes_records_and_an_mlflow_run(tmp_path, tiny_folder):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "out"
    result = rlvrlab("eval", "pass-at-k", "--model", str(tiny_folder), "--dataset", "countdown", "--limit", "8",
                     "--n", "4", "--k", "1,2,4", "--seed", "5", "--out", str(out),
                     "--output-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr
    assert "pass@4" in result.stdout and "maj@2" in result.stdout
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["n"] == 4 and 0 <= r["c"] <= 4 for r in records)
    for r in records:
        assert r["pass@2"] == pytest.approx(float(exact_pass_at_k(4, r["c"], 2)), abs=1e-12)
        assert sum(a["count"] for a in r["answers"]) + r["no_answer"] == 4
    assert len((out / "samples.jsonl").read_text().splitlines()) == 32
    assert (out / "records.csv").read_text().splitlines()[0].startswith("dataset,id,source,n,c,avg@n,pass@1")
    summary = json.loads((out / "aggregate.json").read_text())
    countdown = summary["datasets"]["countdown"]
    assert countdown["problems"] == 8 and countdown["split"] == "eval" and countdown["sha256"] == "synthetic"
    assert countdown["pass@4"] >= countdown["pass@1"] > 0  # the warm-started model solves some

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("eval").experiment_id])
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    assert tags["rlvrlab.kind"] == "eval" and tags["rlvrlab.seed"] == "5"
    assert tags["rlvrlab.model_path"] == str(tiny_folder) and tags["rlvrlab.dataset_sha256"] == "synthetic"
    assert params["n"] == "4" and params["ks"] == "1,2,4" and params["sampling.engine"] == "hf"
    assert metrics["eval/countdown/pass_at_4"] == pytest.approx(countdown["pass@4"])
    assert metrics["eval/countdown/avg_at_n"] == pytest.approx(countdown["avg@n"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "eval")}
    assert artifacts == {"eval/records.jsonl", "eval/records.csv", "eval/samples.jsonl", "eval/aggregate.json"}


@pytest.mark.slow
def test_pass_at_k_of_a_run_checkpoint_on_countdown_and_a_math_fixture(tmp_path, tiny_folder):
    from mlflow.tracking import MlflowClient

    runs, run_id = fake_run(tmp_path, tiny_folder, steps=(2, 4))
    out = tmp_path / "out"
    result = rlvrlab("eval", "pass-at-k", "--run", run_id, "--checkpoint", "2", "--output-dir", str(runs),
                     "--dataset", "countdown", "--dataset", "math500",
                     "--set", f"math500:dataset.path={MATH_FIXTURE}", "--set", "math500:dataset.expected_rows=null",
                     "--limit", "2", "--n", "2", "--k", "1,2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "aggregate.json").read_text())
    assert summary["meta"]["source_run"] == run_id and summary["meta"]["checkpoint_step"] == 2
    math500 = summary["datasets"]["math500"]
    assert math500["problems"] == 2 and math500["verifier"] == "math" and math500["split"] == "all"
    assert 0.0 <= math500["pass@2"] <= 1.0  # the tiny model scores ~0 on MATH: this checks the plumbing
    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("trainexp-eval").experiment_id])
    tags = run.data.tags
    assert tags["rlvrlab.source_run"] == run_id and tags["rlvrlab.checkpoint_step"] == "2"
    assert tags["rlvrlab.dataset_sha256.math500"] == __import__("hashlib").sha256(MATH_FIXTURE.read_bytes()).hexdigest()
    assert tags["rlvrlab.dataset_sha256.countdown"] == "synthetic"
    assert set(run.data.metrics) >= {"eval/countdown/pass_at_2", "eval/math500/maj_at_2", "eval/math500/avg_at_n"}
    assert all(m.step == 2 for m in client.get_metric_history(run.info.run_id, "eval/countdown/pass_at_1"))
    assert client.get_run(run_id).data.tags[f"rlvrlab.eval.{run.info.run_id}"] == "step 2: countdown,math500"
