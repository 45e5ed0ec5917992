"""Rewrite every committed results/**/sources.json in the form `rlvrlab report` writes since issue 45.

What it did, once, on 2026-12-07 (issue 45, "Results that survive another machine"), and what running it again
does (nothing: the rewrite is idempotent; tests/report/test_portable_sources.py checks that):

- absolute paths of the machines that wrote the reports (`tracking_uri`, the absolute arguments of the recorded
  `command`, the protocol's path, paths inside the table notes) are made portable by rlvrlab's own rule
  (rlvrlab.report.provenance.portable): relative to the root of the checkout that wrote the report (inferred from
  the protocol's path `<root>/results/protocols/NAME.md`, else this repository), anything else as
  `<outside the repository>/<last two parts>`;
- these runs were recorded before rlvrlab tagged initial-model digests and environments, so each file gains
  `initial_models` and `environment` blocks with `"recorded": false` and the reason, and every run
  `"initial_model": null`;
- evaluation runs, listed by id before, become {run_id, git_sha, git_dirty, initial_model} entries; their commit and
  tree state were not recorded then: git_sha "unknown", git_dirty null.

Nothing else changes: the numbers, run ids and commits are the reports' own. Usage:
    .venv/bin/python results/portable_sources.py [results]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from rlvrlab.report.provenance import REPO_ROOT, is_absolute, portable, portable_text

BEFORE = "before issue 45"  # the first commit that tags initial-model digests and environments
NO_DIGESTS = f"runs recorded before rlvrlab tagged initial-model digests (commit {BEFORE})"
NO_ENVIRONMENT = f"runs recorded before rlvrlab tagged the environment (commit {BEFORE})"
# the key order rlvrlab.report.render.sources writes
ORDER = ("command", "tracking_uri", "source", "study", "statistics", "baseline", "rlvrlab_git_sha",
         "rlvrlab_git_dirty", "outputs", "provenance", "protocol", "initial_models", "environment", "events", "groups",
         "excluded_runs", "notes")
_CHECKOUT = re.compile(r"^(?P<root>.+)[\\/]results[\\/]protocols[\\/][^\\/]+$")


def writer_root(sources: dict) -> Path:
    """The root of the checkout that wrote a report: the folder above results/protocols/ of its protocol's path
    when that is absolute, else this repository's."""
    path = (sources.get("protocol") or {}).get("path") or ""
    found = _CHECKOUT.match(path) if is_absolute(path) else None
    return Path(found.group("root")) if found else REPO_ROOT


def _eval_run(entry) -> dict:
    if isinstance(entry, dict):
        return entry
    return {"run_id": entry, "git_sha": "unknown", "git_dirty": None, "initial_model": None}


def rewrite(sources: dict) -> dict:
    """One sources.json, portable and with the blocks of a report written since issue 45."""
    root = writer_root(sources)
    out = dict(sources)
    out["command"] = [portable(arg, root) for arg in sources.get("command", [])]
    out["tracking_uri"] = portable(sources["tracking_uri"], root)
    if sources.get("protocol"):
        out["protocol"] = {**sources["protocol"], "path": portable(sources["protocol"]["path"], root)}
    out.setdefault("initial_models", {"recorded": False, "digests": [], "reason": NO_DIGESTS})
    out.setdefault("environment", {"recorded": False, "environments": [], "reason": NO_ENVIRONMENT})
    out["groups"] = [{**g, "values": {k: portable(v, root) if isinstance(v, str) else v
                                      for k, v in g.get("values", {}).items()},
                      "runs": [{**r, "initial_model": r.get("initial_model")} for r in g.get("runs", [])],
                      "failed_runs": [{**r, "initial_model": r.get("initial_model")} for r in g.get("failed_runs", [])],
                      "eval_runs": [_eval_run(e) for e in g.get("eval_runs", [])]} for g in sources["groups"]]
    out["notes"] = [portable_text(note, root) for note in sources.get("notes", [])]
    return {**{k: out[k] for k in ORDER if k in out}, **{k: v for k, v in out.items() if k not in ORDER}}


def text(sources: dict) -> str:
    return json.dumps(sources, indent=2) + "\n"  # as rlvrlab.report.render.sources writes it


def main(folder: Path) -> int:
    changed = 0
    for path in sorted(folder.rglob("sources.json")):
        before = path.read_text()
        after = text(rewrite(json.loads(before)))
        if after != before:
            path.write_text(after)
            changed += 1
        print(f"{path}: {'rewritten' if after != before else 'unchanged'}")
    print(f"{changed} of {len(list(folder.rglob('sources.json')))} sources.json rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent)))
