"""A study's fingerprint is over meaning (rlvrlab/sweep/fingerprint.py): every sweep in sweeps/ keeps the value that
studies in storage carry (tests/sweep/fingerprints.json, computed before the module by make_fingerprints.py), a new
optional field at its default changes none, a value that changes results changes it, and a refused study is still
told what differs (rlvrlab/sweep/mismatch.py).
Run: .venv/bin/pytest -q tests/sweep/test_fingerprint.py"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlvrlab.sweep import fingerprint as F
from rlvrlab.sweep.mismatch import mismatch_message
from rlvrlab.sweep.objective import Objective
from rlvrlab.sweep.seeds import AdaptiveSeeds
from rlvrlab.sweep.space import Param
from rlvrlab.sweep.spec import Pruner, SweepSpec, load_sweep

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STORED: dict[str, str] = json.loads((HERE / "fingerprints.json").read_text())
CLASSES = {cls.__name__: cls for cls in (SweepSpec, Objective, Param, Pruner, AdaptiveSeeds)}


@pytest.fixture(scope="module")
def specs() -> dict[str, SweepSpec]:
    return {name: load_sweep(str(ROOT / name)) for name in STORED}


def test_every_stored_fingerprint_is_unchanged(specs: dict[str, SweepSpec]) -> None:
    files = sorted(p.relative_to(ROOT).as_posix() for folder in (ROOT / "sweeps", HERE / "fingerprint_sweeps")
                   for p in folder.rglob("*.yaml"))
    assert sorted(STORED) == files  # a new sweep file: add it with make_fingerprints.py
    assert {name: spec.fingerprint() for name, spec in specs.items()} == STORED


@pytest.mark.parametrize("part", F.PARTS, ids=lambda part: part.name)
def test_every_field_of_every_part_is_named_once(part: F.Part) -> None:
    """A new field must be placed: written (added, left out at its default) or ignored with why."""
    named = [*part.fields, *part.added, *part.ignored]
    assert sorted(named) == sorted(f.name for f in dataclasses.fields(CLASSES[part.name]))
    assert all(f in CLASSES[part.name].__dataclass_fields__ for f in part.added)


def _with_new_field(value, name: str = "smoothing", default=0.0, **given):
    """`value` as an instance of a copy of its dataclass with one more optional field."""
    kind = dataclasses.make_dataclass(f"Newer{type(value).__name__}", [(name, float, default)], bases=(type(value),),
                                      frozen=True)
    return kind(**{**{f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, **given})


@pytest.mark.parametrize("name", sorted(STORED)[::4])
def test_a_new_optional_field_at_its_default_changes_no_fingerprint(specs: dict[str, SweepSpec], name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    spec = specs[name]
    newer = _with_new_field(spec, objective=_with_new_field(spec.objective), pruner=_with_new_field(spec.pruner))
    newer = dataclasses.replace(newer, space=tuple(_with_new_field(p) for p in spec.space))
    assert newer.fingerprint() == STORED[name]
    # once it changes results it is registered as added: at its default it is still left out, set it counts
    monkeypatch.setattr(F, "OBJECTIVE", dataclasses.replace(F.OBJECTIVE, added=("smoothing",)))
    monkeypatch.setitem(F.SPEC.write, "objective", F.OBJECTIVE.document)
    assert newer.fingerprint() == STORED[name]
    smoothed = dataclasses.replace(newer, objective=_with_new_field(spec.objective, smoothing=0.5))
    assert smoothed.fingerprint() != STORED[name]


def test_a_value_that_changes_results_changes_it(specs: dict[str, SweepSpec]) -> None:
    spec = specs["tests/sweep/fingerprint_sweeps/grid.yaml"]
    first = spec.space[0]
    changed = [
        dataclasses.replace(spec, seeds=(0, 2)),
        dataclasses.replace(spec, objective=dataclasses.replace(spec.objective, window=5)),
        dataclasses.replace(spec, space=(dataclasses.replace(first, values=(0.0, 0.5)), *spec.space[1:])),
        dataclasses.replace(spec, overrides=(*spec.overrides, "steps=13")),
        dataclasses.replace(spec, pruner=Pruner("median")),
        dataclasses.replace(spec, adaptive=AdaptiveSeeds(5, 10, 0.1)),
        dataclasses.replace(spec, variants={"a": ("algorithm=grpo",)}),
    ]
    assert len({spec.fingerprint(), *(c.fingerprint() for c in changed)}) == len(changed) + 1
    same = [dataclasses.replace(spec, name="other", trials=9, timeout=5.0),
            dataclasses.replace(spec, overrides=(*spec.overrides, "output_dir=x", "tracking.log_every=3"))]
    assert {s.fingerprint() for s in same} == {spec.fingerprint()}


def test_a_new_version_changes_every_fingerprint(specs: dict[str, SweepSpec], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "FINGERPRINT_VERSION", 2)
    assert not {spec.fingerprint() for spec in specs.values()} & set(STORED.values())


class _Client:
    """A study run that recorded other overrides and seeds, and no copy of the file."""

    def get_run(self, run_id: str) -> SimpleNamespace:
        return SimpleNamespace(data=SimpleNamespace(params={"overrides": "algorithm=grpo output_dir=x",
                                                            "seeds": "[0, 1, 2]"}))

    def download_artifacts(self, run_id: str, path: str, folder: str) -> str:
        raise OSError("no artifact")


def test_a_refused_study_is_told_what_differs(specs: dict[str, SweepSpec]) -> None:
    spec = specs["tests/sweep/fingerprint_sweeps/grid.yaml"]
    said = mismatch_message(spec, "sqlite:///s.db", "000000000000", _Client(), "run")
    assert f"fingerprint 000000000000, now {STORED['tests/sweep/fingerprint_sweeps/grid.yaml']}" in said
    assert "the overrides (the study was started with algorithm=grpo; this command gives algorithm=ucpo" in said
    assert "the seeds (started with [0, 1, 2], now [0, 1]" in said and "\n" not in said
    assert "the fingerprint covers" in mismatch_message(spec, "s", "0", None, None)
