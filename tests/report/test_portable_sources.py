"""sources.json names what a table's runs started from and where they ran, and no directory of the machine that
wrote it (issue 45): paths portable (rlvrlab.report.provenance.portable), the runs' initial-model digests and
environments (their rlvrlab.initial_model.* and rlvrlab.env.* tags) as blocks, evaluation runs with their commit; a
comparison across different recorded initial models is refused unless --allow-mixed, and the footer names them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlvrlab.errors import RlvrlabError
from rlvrlab.report import provenance
from rlvrlab.report.collect import Group, SeedRun, identity
from rlvrlab.report.provenance import OUTSIDE, REPO_ROOT, portable, portable_text
from rlvrlab.report.render import digest_note, initial_model_note
from rlvrlab.tracking import tags as T

A, B = "a" * 64, "b" * 64
ABSOLUTE = re.compile(r"^(/|\\\\|[A-Za-z]:[\\/])")


def absolute_strings(value, where: str = "") -> list[str]:
    """Every string in a JSON value (keys too) that is an absolute path, with where it is."""
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in [*absolute_strings(k, where), *absolute_strings(v, f"{where}.{k}")]]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in absolute_strings(v, f"{where}[{i}]")]
    return [f"{where}: {value}"] if isinstance(value, str) and ABSOLUTE.match(value) else []


@pytest.mark.parametrize(("given", "written"), [
    (str(REPO_ROOT / "results" / "protocols" / "x.md"), "results/protocols/x.md"),
    (str(REPO_ROOT), "."),
    ("/data/study7/runs", f"{OUTSIDE}/study7/runs"),
    ("/data/study7/../study8/runs/", f"{OUTSIDE}/study8/runs"),
    ("C:\\Users\\me\\runs", f"{OUTSIDE}/me/runs"),
    ("D:/work/study/runs", f"{OUTSIDE}/study/runs"),
    (f"sqlite:///{REPO_ROOT}/runs/mlflow.db", "sqlite:///runs/mlflow.db"),
    ("sqlite:////data/study7/runs/mlflow.db", f"sqlite:///{OUTSIDE}/runs/mlflow.db"),
    ("sqlite:///runs/mlflow.db", "sqlite:///runs/mlflow.db"),
    ("file:///data/x/mlruns", f"file://{OUTSIDE}/x/mlruns"),
    ("http://me:secret@tracking:5000", "http://me:***@tracking:5000"),
    ("--out=/data/a/b/c", f"--out={OUTSIDE}/b/c"),
    ("--baseline", "--baseline"), ("grpo tau=0.2", "grpo tau=0.2"), ("-1e-05", "-1e-05"), ("runs", "runs"),
])
def test_portable_writes_no_absolute_path(given: str, written: str) -> None:
    assert portable(given) == written
    assert portable(written) == written  # already portable: unchanged
    assert not ABSOLUTE.match(portable(given))


def test_a_note_keeps_its_words_and_loses_its_paths() -> None:
    note = ("protocol: /data/report7/results/protocols/ucpo_pairs.md (committed efb7dcf); initial model: model.path "
            "/models/qwen3-8b: 3/5 seeds, a / b, sqlite:////data/x/mlflow.db")
    assert portable_text(note) == (f"protocol: {OUTSIDE}/protocols/ucpo_pairs.md (committed efb7dcf); initial model: "
                                   f"model.path {OUTSIDE}/models/qwen3-8b: 3/5 seeds, a / b, "
                                   f"sqlite:///{OUTSIDE}/x/mlflow.db")
    assert portable_text(portable_text(note)) == portable_text(note)


def _run(label: str, seed: int, digest: str | None = None, **tags: str) -> SeedRun:
    if digest is not None:
        tags[T.INITIAL_MODEL] = digest
    return SeedRun(f"{label}-{seed}", seed, {"seed": str(seed), "model.tier": "tiny",
                                             "model.warm_start_seed": tags.pop("warm_start_seed", "0")},
                   "c" * 40, "FINISHED", **identity(tags))


def _group(label: str, digests: list[str | None], **tags: str) -> Group:
    return Group(f"hash-{label}", [_run(label, s, d, **tags) for s, d in enumerate(digests)], label=label)


def test_the_blocks_list_distinct_digests_and_environments_or_say_they_are_unrecorded() -> None:
    env = {f"{T.ENV_PREFIX}torch": "2.5.1", f"{T.ENV_PREFIX}threads": "2"}
    groups = [_group("grpo", [A, A], **env, **{T.INITIAL_MODEL_SOURCE: "warm_start:/home/me/.cache/tiny/k1"}),
              _group("ucpo", [A, B], **env, **{T.INITIAL_MODEL_OVERRIDE: "true", T.INITIAL_MODEL_EXPECTED: A})]
    block = provenance.initial_models(groups)
    assert block["recorded"] is True and "reason" not in block
    assert [(d["sha256"], d["runs"], d["groups"]) for d in block["digests"]] == [
        (A, 3, {"grpo": 2, "ucpo": 1}), (B, 1, {"ucpo": 1})]
    assert block["digests"][0]["sources"] == [f"warm_start:{OUTSIDE}/tiny/k1"]
    assert block["overrides"] == [{"run_id": f"ucpo-{s}", "sha256": d, "expected": A} for s, d in enumerate([A, B])]
    environment = provenance.environments(groups)
    assert environment == {"recorded": True, "environments": [
        {"environment": {"threads": "2", "torch": "2.5.1"}, "runs": 4, "eval_runs": 0}]}
    old = [_group("grpo", [None, None]), _group("ucpo", [A, None], **env)]
    block, environment = provenance.initial_models(old), provenance.environments(old)
    assert block["recorded"] is False and block["reason"].startswith("3 of 4 runs recorded without")
    assert environment["recorded"] is False and environment["reason"].startswith("2 of 4 runs recorded without")
    assert [e["runs"] for e in environment["environments"]] == [2]


def test_a_comparison_across_initial_models_is_refused_unless_allowed(tmp_path: Path, monkeypatch) -> None:
    """Refused in the published results folder (like dirty or mixed-commit runs); elsewhere the footer says so,
    since groups may start from different models on purpose (another model size, another task's table)."""
    provenance.check(provenance.Provenance(("c" * 40,), 6, 0, initial_mismatch=("grpo", A, "ucpo", B)), tmp_path,
                     allow_dirty=False, allow_mixed=False)  # not results/: written, the footer flags it
    monkeypatch.setenv("RLVRLAB_RESULTS_DIR", str(tmp_path))
    same = [_group("grpo", [A, A, A]), _group("ucpo", [A, A, A])]
    per_seed = [_group(g, [A, B, A], warm_start_seed="None") for g in ("grpo", "ucpo")]  # paired seed by seed
    assert provenance.initial_mismatch(same) == () and provenance.initial_mismatch(per_seed) == ()
    untagged = [_group("grpo", [A, A, A]), _group("ucpo", [None, None, None])]
    assert provenance.initial_mismatch(untagged) == ()  # nothing recorded to compare
    for groups in ([_group("grpo", [A, A, A]), _group("ucpo", [B, B, B])],
                   [_group("grpo", [A, B, A], warm_start_seed="None"),
                    _group("ucpo", [A, A, A], warm_start_seed="None")]):
        mismatch = provenance.initial_mismatch(groups)
        assert mismatch[0::2] == ("grpo", "ucpo") and {mismatch[1], mismatch[3]} == {A, B}
        origin = provenance.Provenance(("c" * 40,), 6, 0, initial_mismatch=mismatch)
        with pytest.raises(RlvrlabError) as refused:
            provenance.check(origin, tmp_path, allow_dirty=False, allow_mixed=False)
        message = str(refused.value)
        assert "\n" not in message and A[:12] in message and B[:12] in message and "--allow-mixed" in message
        provenance.check(origin, tmp_path, allow_dirty=False, allow_mixed=True)


def test_the_footer_names_the_digests_and_says_when_they_are_mixed() -> None:
    assert digest_note([_group("grpo", [None, None])]) == ""
    one = [_group("grpo", [A, A]), _group("ucpo", [A, A])]
    assert initial_model_note(one) == ("fixed warm start seed 0: intervals are conditional on that one initial "
                                       f"model; initial-model sha256 {A[:12]} (4 runs)")
    mixed = initial_model_note([_group("grpo", [A, A]), _group("ucpo", [A, B])])
    assert f"ucpo: 2 digests ({A[:12]}, {B[:12]})" in mixed and "MIXED within ucpo" in mixed
    assert "also vary over initial models" in mixed
    across = initial_model_note([_group("grpo", [A, A]), _group("ucpo", [B, None])])
    assert "DIFFERENT INITIAL MODELS across groups (--allow-mixed)" in across
    assert f"grpo: {A[:12]}; ucpo: {B[:12]}" in across and "no digest recorded for 1 of 4 runs" in across
    varies = initial_model_note([_group(g, [A, B], warm_start_seed="None") for g in ("grpo", "ucpo")])
    assert "MIXED" not in varies and "DIFFERENT" not in varies and "grpo: 2 digests" in varies


def _store(folder: Path, digests: dict[str, str]) -> tuple[str, dict[str, list[str]]]:
    """An experiment `exp` of rlvrlab-style training runs (grpo, ucpo x 3 seeds) with identity tags, each
    evaluated by an eval run whose records are artifacts. Returns the uri and each algorithm's run ids."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("exp", artifact_location=str(folder / "artifacts"))
    env = {f"{T.ENV_PREFIX}torch": "2.5.1", f"{T.ENV_PREFIX}threads": "2"}
    ids: dict[str, list[str]] = {}
    for algorithm, digest in digests.items():
        for seed in range(3):
            rows = [{"dataset": "toy", "id": str(p), "n": 4, "c": (p + seed) % 3, "avg@n": (p + seed) % 3 / 4,
                     "pass@1": (p + seed) % 3 / 4, "diversity": 0.5} for p in range(4)]
            evaluation = client.create_run(experiment, tags={
                T.KIND: "eval", T.GIT_SHA: "d" * 40, T.GIT_DIRTY: "true", T.INITIAL_MODEL: "e" * 64, **env}).info.run_id
            client.log_text(evaluation, "\n".join(json.dumps(r) for r in rows), "eval/records.jsonl")
            client.set_terminated(evaluation)
            tags = {T.CONFIG_HASH: f"hash-{algorithm}", T.SEED: str(seed), T.GIT_SHA: "c" * 40, T.GIT_DIRTY: "false",
                    T.INITIAL_MODEL: digest, T.INITIAL_MODEL_SOURCE: f"warm_start:{folder}/cache/{digest[:6]}",
                    f"{T.EVAL_LINK}{evaluation}": "1", **env}
            run = client.create_run(experiment, tags=tags).info.run_id
            params = {"algorithm.name": algorithm, "seed": seed, "model.tier": "tiny", "model.warm_start_seed": 0}
            reward = [0.3 + 0.1 * (algorithm == "ucpo") + 0.01 * seed * step for step in range(3)]
            client.log_batch(run, params=[Param(k, str(v)) for k, v in params.items()],
                             metrics=[Metric("train/reward", v, 0, step) for step, v in enumerate(reward)])
            client.set_terminated(run)
            ids.setdefault(algorithm, []).append(run)
    return uri, ids


@pytest.mark.slow  # an MLflow store of 12 runs and two reports: about 5 s alone, more on a loaded machine
def test_a_report_with_absolute_paths_writes_a_portable_sources_json(tmp_path: Path, monkeypatch) -> None:
    from mlflow.tracking import MlflowClient

    from rlvrlab.report.command import ReportRequest, make_report

    runs, out = tmp_path / "runs", tmp_path / "out"
    runs.mkdir()
    uri, ids = _store(runs, {"grpo": A, "ucpo": A})
    command = ("rlvrlab", "report", "--experiment", "exp", "--tracking-uri", uri, "--out", str(out),
               f"--output-dir={runs}")
    request = ReportRequest(experiment="exp", baseline="grpo", tracking_uri=uri, out=out, plots=False,
                            formats="md,csv", command=command)
    make_report(request)
    sources = json.loads((out / "sources.json").read_text())
    assert absolute_strings(sources) == []
    assert str(tmp_path) not in json.dumps(sources)
    assert sources["tracking_uri"] == f"sqlite:///{OUTSIDE}/runs/mlflow.db"
    assert sources["command"][-3:] == ["--out", f"{OUTSIDE}/{tmp_path.name}/out", f"--output-dir={OUTSIDE}/"
                                       f"{tmp_path.name}/runs"]
    assert sources["initial_models"]["recorded"] is True
    assert [(d["sha256"], d["groups"]) for d in sources["initial_models"]["digests"]] == [(A, {"grpo": 3, "ucpo": 3})]
    assert sources["initial_models"]["digests"][0]["sources"] == [f"warm_start:{OUTSIDE}/cache/{A[:6]}"]
    assert sources["environment"] == {"recorded": True, "environments": [
        {"environment": {"threads": "2", "torch": "2.5.1"}, "runs": 6, "eval_runs": 6}]}
    for group in sources["groups"]:
        assert all(r["initial_model"] == A for r in group["runs"])
        assert [set(e) for e in group["eval_runs"]] == [{"run_id", "git_sha", "git_dirty", "initial_model"}] * 3
        assert all(e["git_sha"] == "d" * 40 and e["git_dirty"] is True for e in group["eval_runs"])
    assert f"initial-model sha256 {A[:12]} (6 runs)" in (out / "table.md").read_text()

    client = MlflowClient(uri)
    for run in ids["ucpo"]:  # ucpo now started from another initial model
        client.set_tag(run, T.INITIAL_MODEL, B)
    monkeypatch.setenv("RLVRLAB_RESULTS_DIR", str(tmp_path / "published"))
    mixed = ReportRequest(experiment="exp", tracking_uri=uri, out=tmp_path / "published" / "mixed", plots=False,
                          formats="md", evaluations=False, allow_dirty=True)
    with pytest.raises(RlvrlabError, match=f"'grpo' and 'ucpo' started from different initial models .*{A[:12]} "
                                           f"vs {B[:12]}.*--allow-mixed"):
        make_report(mixed)
    assert not (tmp_path / "published" / "mixed").exists()
    make_report(ReportRequest(**{**mixed.__dict__, "allow_mixed": True}))
    table = (tmp_path / "published" / "mixed" / "table.md").read_text()
    assert "DIFFERENT INITIAL MODELS across groups (--allow-mixed)" in table
    make_report(ReportRequest(**{**mixed.__dict__, "out": tmp_path / "elsewhere"}))  # not results/: written, flagged
    assert "DIFFERENT INITIAL MODELS across groups" in (tmp_path / "elsewhere" / "table.md").read_text()


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


COMMITTED = sorted((REPO_ROOT / "results").rglob("sources.json"))


def test_every_committed_sources_json_is_portable_and_says_what_it_did_not_record() -> None:
    """results/portable_sources.py rewrote them (issue 45); each has both blocks, every run and evaluation says
    whether its initial model was recorded, and no string holds an absolute path, whole or inside a note."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("portable_sources", REPO_ROOT / "results" / "portable_sources.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert COMMITTED
    for path in COMMITTED:
        where = path.relative_to(REPO_ROOT)
        text = path.read_text()
        sources = json.loads(text)
        assert absolute_strings(sources) == [], where
        assert [s for s in _strings(sources) if portable_text(s) != s] == [], where
        for block, listing in (("initial_models", "digests"), ("environment", "environments")):
            assert isinstance(sources[block]["recorded"], bool) and isinstance(sources[block][listing], list), where
            assert sources[block]["recorded"] or sources[block]["reason"], where  # unrecorded: it says why
        runs = [r for g in sources["groups"] for r in [*g["runs"], *g["failed_runs"], *g["eval_runs"]]]
        assert all(isinstance(r, dict) and "initial_model" in r for r in runs), where
        assert all({"git_sha", "git_dirty"} <= set(e) for g in sources["groups"] for e in g["eval_runs"]), where
        assert script.text(script.rewrite(sources)) == text, f"{where}: run results/portable_sources.py"


def test_the_rewrite_finds_the_checkout_that_wrote_a_report() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("portable_sources", REPO_ROOT / "results" / "portable_sources.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    old = {"command": ["rlvrlab", "report", "--output-dir", "/data/study7/runs", "--out", "results/x"],
           "tracking_uri": "sqlite:////data/study7/runs/mlflow.db",
           "protocol": {"path": "/data/report7/results/protocols/x.md"},
           "groups": [{"label": "grpo", "values": {}, "runs": [{"run_id": "r", "seed": 0}], "failed_runs": [],
                       "eval_runs": ["e"]}],
           "notes": ["protocol: /data/report7/results/protocols/x.md (committed 1234567)"]}
    new = script.rewrite(old)
    assert new["protocol"]["path"] == "results/protocols/x.md"
    assert new["notes"] == ["protocol: results/protocols/x.md (committed 1234567)"]
    assert new["command"][3] == f"{OUTSIDE}/study7/runs" and new["tracking_uri"] == f"sqlite:///{OUTSIDE}/runs/mlflow.db"
    assert new["groups"][0]["eval_runs"] == [{"run_id": "e", "git_sha": "unknown", "git_dirty": None,
                                              "initial_model": None}]
    assert new["initial_models"]["recorded"] is False and "before issue 45" in new["initial_models"]["reason"]
    assert absolute_strings(new) == [] and script.rewrite(new) == new
