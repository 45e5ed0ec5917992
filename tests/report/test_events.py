"""Events in training curves (rlvrlab.report.events) and the pre-registration check of `--protocol`
(rlvrlab.report.provenance.protocol): parsing, the first qualifying stretch, exact intervals and tests against
hand-worked values, and a protocol committed before, after or never."""

import subprocess
import time

import pytest
from scipy import stats as sps

from rlvrlab.errors import RlvrlabError
from rlvrlab.report.events import (
    NONFINITE,
    clopper_pearson,
    exact_test,
    first_stretch,
    parse_event,
)
from rlvrlab.report.provenance import protocol


def test_parse_events() -> None:
    event = parse_event("failure: eval/heldout/reward < 0.5*initial for 5 | nonfinite | loss/approx_kl > 3")
    assert event.name == "failure" and len(event.conditions) == 3
    first, second, third = event.conditions
    assert (first.metric, first.op, first.value, first.relative, first.k) == ("eval/heldout/reward", "<", 0.5, True, 5)
    assert second.metric == "" and second.text == NONFINITE
    assert third.text == "loss/approx_kl > 3"
    for bad in ("no colon", "x: reward << 3", "x: reward > 3 for 0", "x: reward > nan", ": reward > 1"):
        with pytest.raises(RlvrlabError, match="--event") as caught:
            parse_event(bad)
        assert "\n" not in str(caught.value)


def test_the_first_qualifying_stretch() -> None:
    event = parse_event("e: r < 0.5*initial for 3").conditions[0]
    steps = [0, 2, 4, 6, 8, 10, 12]
    assert first_stretch(steps, [0.4, 0.1, 0.1, 0.3, 0.1, 0.1, 0.1], event) == 8  # 2-4 is too short; 8-12 qualifies
    assert first_stretch(steps, [0.4, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3], event) is None
    assert first_stretch(steps[:3], [0.4, float("nan"), 0.1], parse_event("e: r < 0.1").conditions[0]) == 2
    assert first_stretch([0, 1], [1.0, 5.0], parse_event("e: kl >= 5").conditions[0]) == 1
    assert first_stretch([], [], event) is None


def test_exact_intervals_and_tests() -> None:
    low, high = clopper_pearson(0, 6)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 6))
    low, high = clopper_pearson(3, 6)
    assert (low, high) == pytest.approx((0.1181, 0.8819), abs=1e-4)
    # paired seeds: McNemar exact = a two-sided binomial test on the discordant pairs (6 of 6 one way: p = 1/32)
    a = {s: True for s in range(6)}
    b = {s: False for s in range(6)}
    assert exact_test(a, b) == ("McNemar exact", pytest.approx(0.03125))
    assert exact_test(a, a) == ("McNemar exact", 1.0)
    mixed = {0: True, 1: True, 2: False, 3: False}
    assert exact_test(mixed, {0: True, 1: False, 2: True, 3: False})[1] == pytest.approx(1.0)
    # different seeds: Fisher's exact test
    test, p = exact_test({0: True, 1: True, 2: True}, {5: False, 6: False, 7: False})
    assert test == "Fisher exact" and p == pytest.approx(sps.fisher_exact([[3, 0], [0, 3]]).pvalue)


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_protocol_counts_as_pre_registered_only_when_committed_before_the_first_run(tmp_path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    path = repo / "protocol.md"
    path.write_text("question\n")
    _git(repo, "add", "protocol.md")
    _git(repo, "commit", "-qm", "protocol")
    registered = _git(repo, "rev-parse", "HEAD")
    time.sleep(1.1)  # commit times have one-second resolution
    started = int(time.time() * 1000) + 1000
    record = protocol(path, (registered,), started)
    assert record.pre_registered and record.first_commit == registered and record.reason == ""
    assert "pre-registered" in record.note()
    # runs from a commit that does not contain the protocol
    other = tmp_path / "other"
    other.mkdir()
    assert not protocol(path, ("0" * 40,), started).pre_registered
    # the protocol changed after the first run started
    time.sleep(2.2)
    path.write_text("question, edited\n")
    assert protocol(path, (registered,), started).reason == "the file has uncommitted changes"
    _git(repo, "commit", "-qam", "edit")
    late = protocol(path, (_git(repo, "rev-parse", "HEAD"),), started)
    assert not late.pre_registered and "not before the first run started" in late.reason
    assert "NOT pre-registered" in late.note() and late.first_commit == registered
    # never committed
    loose = repo / "loose.md"
    loose.write_text("x\n")
    assert protocol(loose, (registered,), started).reason == "the file is not committed"
    with pytest.raises(RlvrlabError, match="--protocol"):
        protocol(repo / "missing.md", (registered,), started)


def test_a_dated_appendix_after_the_runs_keeps_a_protocol_pre_registered(tmp_path) -> None:
    """A later `## Appendix (date)` (e.g. the rules as a ```verdict block) changes no rule: the registration is the
    text above it. An edit above it, committed or not, still unregisters the study."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (("init", "-q"), ("config", "user.email", "t@t"), ("config", "user.name", "t")):
        _git(repo, *args)
    path = repo / "protocol.md"
    path.write_text("# question\n\nrule: reproduced if p < 0.05\n")
    _git(repo, "add", "protocol.md")
    _git(repo, "commit", "-qm", "protocol")
    registered = _git(repo, "rev-parse", "HEAD")
    time.sleep(1.1)
    started = int(time.time() * 1000) + 1000
    time.sleep(2.2)
    path.write_text(path.read_text() + "\n## Appendix (2026-12-07): machine-read verdict rules\n\n```verdict\n```\n")
    assert protocol(path, (registered,), started).pre_registered  # uncommitted appendix
    _git(repo, "commit", "-qam", "appendix")
    record = protocol(path, (registered,), started)
    assert record.pre_registered and record.last_commit == registered and record.reason == ""
    path.write_text(path.read_text().replace("p < 0.05", "p < 0.10"))
    assert protocol(path, (registered,), started).reason == "the file has uncommitted changes"
    _git(repo, "commit", "-qam", "rule edited")
    late = protocol(path, (_git(repo, "rev-parse", "HEAD"),), started)
    assert not late.pre_registered and "not before the first run started" in late.reason
