"""Why an existing study is not this sweep: its fingerprint differs, and the message says what differs (the
overrides, the seeds, the sweep file's text) from what the study's MLflow run recorded when it started, instead of
blaming a file that did not change."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rlvrlab.sweep.space import NOT_SCIENCE
from rlvrlab.sweep.spec import SweepSpec


def _science(overrides: list[str] | tuple[str, ...]) -> list[str]:
    return [o for o in overrides if not o.startswith(NOT_SCIENCE)]


def differences(spec: SweepSpec, client, study_run_id: str | None) -> list[str]:
    """What differs between this invocation and the study's start, as recorded on its MLflow study run."""
    if client is None or not study_run_id:
        return []
    try:
        params = client.get_run(study_run_id).data.params
    except Exception:  # noqa: BLE001 - no record to compare with: the generic message stays
        return []
    found = []
    started = _science(params.get("overrides", "").split())
    given = _science(spec.overrides)
    if started != given:
        found.append(f"the overrides (the study was started with {' '.join(started) or 'none'}; this command gives "
                     f"{' '.join(given) or 'none'})")
    seeds = params.get("seeds")
    if seeds is not None and seeds != str(list(spec.seeds)):
        found.append(f"the seeds (started with {seeds}, now {list(spec.seeds)}: --seeds)")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            text = Path(client.download_artifacts(study_run_id, "sweep.yaml", tmp)).read_text()
        if text != spec.file.read_text():
            found.append(f"the sweep file {spec.file} (changed since the study started)")
    except Exception:  # noqa: BLE001, S110 - no copy of the file: it is not blamed
        pass
    return found


def mismatch_message(spec: SweepSpec, storage: str, recorded: str, client, study_run_id: str | None) -> str:
    found = differences(spec, client, study_run_id)
    what = "; ".join(found) if found else (
        "its space, seeds, objective or base config (the fingerprint covers the sweep file's space, seeds, "
        "objective and the overrides)")
    return (f"study {spec.name!r} in {storage} was started from a different sweep (fingerprint {recorded}, now "
            f"{spec.fingerprint()}); what differs: {what}; give the same file and overrides as when it started, "
            "or a new name with --name")
