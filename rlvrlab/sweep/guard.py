"""The code-change guard: a study's seed runs all run the same code, unless the user says otherwise (docs/sweeps.md,
"The code-change guard": what is watched, what is recorded, --allow-code-change).

Watched: a command sweep's files (each token of the rendered `command:` naming an existing file, also the VALUE of
a --key=VALUE token, binaries left out, plus the sweep file's `watch:` globs), else rlvrlab's own .py files. Their
digest, each file's own digest and the repository's commit and dirty state are recorded when the study starts; a
resumed study whose files differ is refused with one line naming them."""

from __future__ import annotations

import glob
import hashlib
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from rlvrlab.errors import RlvrlabError
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.provenance import repo_state

CODE = T.attr("code")  # study user attr: {digest, files: {name: digest}, commit, dirty}
HISTORY = T.attr("code_history")  # study user attr: [{digest, commit, dirty, at}], one per code it ran on
CODE_DIGEST = T.CODE_DIGEST  # on the study run (its current code) and on each seed run
CODE_DIGESTS = T.attr("code_digests")  # on the study run: every digest, in order
CODE_COMMIT = T.attr("code_commit")
CODE_DIRTY = T.attr("code_dirty")
WATCH = "watch"  # the sweep file's key
SHOWN = 8  # changed files named in the refusal


def watched(spec: Any, folder: Optional[Path] = None) -> dict[str, Path]:
    """The files whose content the study's seed runs depend on: name (relative to `folder` where inside it) ->
    path, as its seed runner (rlvrlab.sweep.runner) names them. folder: the sweep's working folder (the current
    one)."""
    return spec.runner.watched(spec, (folder or Path.cwd()).resolve())


def rlvrlab_source() -> dict[str, Path]:
    """rlvrlab's own trainer: rlvrlab's Python source."""
    import rlvrlab

    root = Path(rlvrlab.__file__).resolve().parent
    return {f"rlvrlab/{p.relative_to(root).as_posix()}": p for p in sorted(root.rglob("*.py"))
            if "__pycache__" not in p.parts}


def command_files(template: str, spec: Any, folder: Path) -> dict[str, Path]:
    """A command's: the files its words name (not binaries), and the sweep file's `watch:` globs' matches."""
    from rlvrlab.sweep.template import placeholders, render

    rendered = render(template, {name: "0" for name in placeholders(template)})
    try:
        tokens = shlex.split(rendered)
    except ValueError:  # unbalanced quotes: the shell would refuse it too; words are enough here
        tokens = rendered.split()
    found: dict[str, Path] = {}
    for token in tokens:
        for part in (token, token.partition("=")[2]):
            path = _file(folder, part)
            if path is not None and not _binary(path):
                found[_name(path, folder)] = path
    for pattern in watch_globs(spec):
        full = pattern if os.path.isabs(pattern) else str(folder / pattern)
        matches = [Path(m) for m in sorted(glob.glob(full, recursive=True)) if Path(m).is_file()]
        if not matches:
            raise RlvrlabError(f"watch: {pattern!r} in {spec.file} matches no file in {folder}; fix the glob (relative "
                               "to the folder the sweep runs in) or remove it")
        for path in matches:
            found[_name(path.resolve(), folder)] = path
    return found


def watch_globs(spec: Any) -> list[str]:
    """The sweep file's `watch:` globs (a list of strings, or one string); [] without one."""
    from rlvrlab.config.yamlfile import load as load_yaml

    try:
        body = load_yaml(Path(spec.file).read_text(encoding="utf-8"), str(spec.file)) or {}
    except (OSError, UnicodeDecodeError):
        return []
    value = body.get(WATCH) if isinstance(body, dict) else None
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise RlvrlabError(f"watch in {spec.file} must be a list of file globs, e.g. [train.py, src/**/*.py]")
    return list(value)


def _file(folder: Path, part: str) -> Optional[Path]:
    if not part or len(part) > 4096 or "\n" in part:
        return None
    try:
        path = Path(part).expanduser()
        path = path if path.is_absolute() else folder / path
        return path.resolve() if path.is_file() else None
    except (OSError, ValueError):
        return None


def _binary(path: Path) -> bool:
    """An executable that is not a script (the Python interpreter, a compiled program)."""
    try:
        with path.open("rb") as handle:
            return handle.read(4) == b"\x7fELF" or b"\0" in handle.read(1024)
    except OSError:
        return True


def _name(path: Path, folder: Path) -> str:
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return str(path)


def snapshot(spec: Any, folder: Optional[Path] = None) -> dict:
    """The watched files' digests and the repository's state, as recorded on the study."""
    folder = (folder or Path.cwd()).resolve()
    files = {}
    for name, path in sorted(watched(spec, folder).items()):
        try:
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        except OSError as error:
            raise RlvrlabError(f"cannot read {path} to record the code the sweep runs ({error.strerror}); fix its "
                               "permissions") from None
    overall = hashlib.sha256("\n".join(f"{n}\0{d}" for n, d in files.items()).encode()).hexdigest()[:16]
    commit, dirty = repo_state(spec.runner.code_root(folder))
    return {"digest": overall, "files": files, "commit": commit or "", "dirty": dirty}


def recorded_digest(study: Any) -> Optional[str]:
    """The digest of the code the study runs on now (as its last invocation recorded it)."""
    found = study.user_attrs.get(CODE)
    return found.get("digest") if isinstance(found, dict) else None


def changed_files(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """`name (changed|new|gone)` for each file that differs, sorted by name."""
    return [f"{name} ({'new' if name not in before else 'gone' if name not in now else 'changed'})"
            for name in sorted(set(before) | set(now)) if before.get(name) != now.get(name)]


def check(sweep: Any, *, allow: bool, warn: Callable[[str], None] = lambda message: None) -> dict:
    """Before a sweep (not --status) runs trials: record the code on a new study, or compare it with what the
    study recorded and refuse a change (one line) unless allow. Sets sweep.code_digest; returns the snapshot."""
    now = snapshot(sweep.spec)
    study = sweep.study
    before = study.user_attrs.get(CODE)
    changed = isinstance(before, dict) and before.get("digest") != now["digest"]
    if changed:
        names = changed_files(before.get("files") or {}, now["files"])
        shown = ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
        if not allow:
            raise RlvrlabError(
                f"the code of study {sweep.spec.name!r} changed since its seed runs ran (digest "
                f"{before.get('digest')}, now {now['digest']}): {shown}; add --allow-code-change to continue it on "
                f"this code (its new seed runs are tagged {CODE_DIGEST}={now['digest']}), or give --name for a new "
                "study")
        warn(f"study {sweep.spec.name!r} continues on changed code ({shown}); its new seed runs are tagged "
             f"{CODE_DIGEST}={now['digest']}, the earlier ones {before.get('digest')}")
    if before != now:
        history = list(study.user_attrs.get(HISTORY) or [])
        if not history or history[-1].get("digest") != now["digest"]:
            history.append({k: now[k] for k in ("digest", "commit", "dirty")} | {"at": time.time()})
            study.set_user_attr(HISTORY, history)
        study.set_user_attr(CODE, now)
        _tag_study_run(sweep, now, [h["digest"] for h in history])
    sweep.code_digest = now["digest"]
    return now


def _tag_study_run(sweep: Any, now: dict, digests: list[str]) -> None:
    from mlflow.entities import RunTag

    tags = {CODE_DIGEST: now["digest"], CODE_COMMIT: now["commit"] or "unknown",
            CODE_DIRTY: "true" if now["dirty"] else "false", CODE_DIGESTS: ",".join(digests)[:T.FAIL_REASON_CHARS]}
    sweep.client().log_batch(sweep.study_run_id, tags=[RunTag(k, v) for k, v in tags.items()])
