"""Optuna study storage: the default journal file, or an RDB URL (PostgreSQL for workers on many machines).

The journal file (`<output_dir>/optuna.journal`) is safe for several processes on one machine: every write is an
appended record under a file lock. An RDB storage (`postgresql://...`) serves workers on many machines; sqlite
is refused for several workers (it ignores SELECT ... FOR UPDATE: bench/sweep_storage.py).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any, Optional

from rlvrlab import outputs
from rlvrlab.config.schema import RunConfig
from rlvrlab.errors import RlvrlabError
from rlvrlab.tracking.store import masked


def storage_url(spec_output_dir: str, storage: Optional[str]) -> str:
    """The storage as given, or the default journal file in the base config's output_dir."""
    return storage or str(Path(spec_output_dir).expanduser().resolve() / "optuna.journal")


def open_storage(url: str):
    """A journal file path (default) or an RDB URL; one-line errors for unreachable servers."""
    import optuna

    if "://" not in url:
        from optuna.storages.journal import JournalFileBackend

        path = Path(url).expanduser()
        # the default output_dir (runs): a new one gets a .gitignore of `*`, as `rlvrlab train` gives it
        outputs.make_output_dir(path.parent, default=path.parent.resolve() == Path(RunConfig.output_dir).resolve())
        try:
            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
            raise damaged_journal(path, error) from None
    for attempt in range(5):
        try:
            engine: dict[str, Any] = {"pool_pre_ping": True}
            if url.startswith("sqlite"):  # wait for the lock instead of failing after pysqlite's 5 s
                engine["connect_args"] = {"timeout": 60}
            return optuna.storages.RDBStorage(url, engine_kwargs=engine)
        except ImportError as error:  # optuna wraps the driver's ModuleNotFoundError
            raise RlvrlabError(f"--storage {masked(url)}: the database driver is not installed ({error}); for "
                               "PostgreSQL: pip install 'rlvrlab[postgres]'") from None
        except Exception as error:  # sqlalchemy's OperationalError & co
            # two workers creating the tables of a fresh database at once collide (a unique violation on
            # PostgreSQL's catalog); the loser retries and finds the tables there
            collided = "UniqueViolation" in repr(error) or "IntegrityError" in type(error).__name__
            if collided and attempt < 4:
                time.sleep(0.5 * (attempt + 1))
                continue
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise RlvrlabError(f"cannot open the Optuna storage {masked(url)}: {first}") from None
    raise AssertionError("unreachable")


def damaged_journal(path: Path, error: BaseException) -> RlvrlabError:
    """The one line for a journal Optuna cannot replay (bytes that are not UTF-8 text, a line that is not JSON, or
    JSON that is not one of its records; a last line cut short by a crash Optuna skips itself): the first line that
    is not a record, and the fix. The journal is not changed."""
    where = ""
    try:
        with path.open("rb") as handle:
            lines = handle.readlines()
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
                record = None
            if not isinstance(record, dict) or "op_code" not in record:
                where = f" at line {number}"
                break
    except OSError:
        pass
    aside = shlex.join(["mv", str(path), f"{path}.damaged"])
    return RlvrlabError(f"the Optuna journal {path} is damaged{where} ({type(error).__name__}), so its studies "
                        f"cannot be read; move it aside ({aside}) and run the sweep again to start the study anew "
                        "(the runs of its seeds stay in MLflow), or pass --storage / output_dir= of another study")
