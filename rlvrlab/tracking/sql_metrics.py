"""Metric points into MLflow's SQL store with one multi-row INSERT, the rows `log_batch` would write.

MLflow's SqlAlchemyStore.log_batch builds an ORM object per metric point and per latest-value update: ~140 us
of CPU per point on sqlite (mlflow 3.17), 1.2 s for the ~8,800 points of a 200-step toy run, almost a quarter of
the run (bench/README.md, "The full toy grid"). Through SQLAlchemy Core, which binds every row's parameters in
Python, it was 15-30 us (~165 ms for 9,600 points); the rows now go to the driver's own executemany on the store's
session (its connection and transaction): 8-14 us per point, most of it sqlite keeping the table's three indexes,
measured with the Python loop below included. The same `metrics` rows (NaN stored as value 0 with is_nan, +-inf
as +-max float, exact duplicates skipped as log_batch skips them) and the same `latest_metrics` rows (per key the
point with the largest (step, timestamp, value), one upsert for all keys), in one transaction. tests/test_faults.py
compares both paths row by row. Rows go in sorted by the metrics table's primary key, and the latest values in one
upsert instead of a select and an update per key: a 200-step toy run's 10,200 points into a copy of the full toy
grid's store (375 MB) took 0.098 s of CPU instead of 0.125 (medians of 6, alternating).

A run's params go in the same way (`params_writer_for`): ~200 rows as one executemany instead of ~11 ms of ORM
objects per run, a tenth of a toy-tier sweep's time per seed run outside its steps.

Only for a local sqlite store (`writer_for`); any other store, or a store this cannot write, goes through
log_batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def writer_for(client, uri: str) -> Callable[[str, Sequence], None] | None:
    """A function (run_id, metrics) that writes mlflow Metric points into `client`'s sqlite store; None when the
    store is not a local sqlite SqlAlchemyStore (then log_batch writes them)."""
    if not uri.startswith("sqlite:///"):
        return None
    try:
        from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        store = client._tracking_client.store
    except Exception:  # another MLflow layout: the public API
        return None
    if not isinstance(store, SqlAlchemyStore):
        return None
    metrics_table, latest_table = SqlMetric.__table__, SqlLatestMetric.__table__
    columns = ("key", "value", "timestamp", "step", "is_nan", "run_uuid")
    if not tuple(c.name for c in metrics_table.columns) == tuple(c.name for c in latest_table.columns) == columns:
        return None  # another MLflow schema: log_batch knows it
    insert = f"INSERT OR IGNORE INTO {metrics_table.name} ({', '.join(columns)}) VALUES ({', '.join('?' * 6)})"
    # per key the point with the largest (step, timestamp, value), as log_batch keeps it: one upsert for every key
    updated = ", ".join(f"{c} = excluded.{c}" for c in ("value", "timestamp", "step", "is_nan"))
    upsert_latest = (f"INSERT INTO {latest_table.name} ({', '.join(columns)}) VALUES ({', '.join('?' * 6)}) "
                     f"ON CONFLICT (key, run_uuid) DO UPDATE SET {updated} WHERE (excluded.step, excluded.timestamp, "
                     f"excluded.value) > ({latest_table.name}.step, {latest_table.name}.timestamp, "
                     f"{latest_table.name}.value)")

    def write(run_id: str, metrics: Sequence) -> None:
        rows: list[tuple] = []  # in `columns` order
        latest: dict[str, tuple] = {}
        for m in metrics:
            is_nan, value = store.sanitize_metric_value(m.value)  # MLflow's own rule for NaN and inf
            row = (m.key, value, m.timestamp, m.step, is_nan, run_id)
            rows.append(row)
            best = latest.get(m.key)
            if best is None or _order(row) > _order(best):
                latest[m.key] = row
        if not rows:
            return
        # in the order of the table's primary key (key, timestamp, step, ...): each index takes its new entries in
        # runs of neighbours, not one key at a time across the whole tree (~20% less CPU on a grid's 375 MB store)
        rows.sort(key=_primary_key_order)
        with store.ManagedSessionMaker(read_only=False) as session:
            store._check_run_is_active(store._get_run(run_uuid=run_id, session=session))
            connection = session.connection()  # the session's transaction: all of it commits or none
            connection.exec_driver_sql(insert, rows)  # a list of tuples: the driver's executemany
            connection.exec_driver_sql(upsert_latest, list(latest.values()))

    return write


def params_writer_for(client, uri: str) -> Callable[[str, Sequence], None] | None:
    """A function (run_id, params) that inserts mlflow Param rows of a run into `client`'s sqlite store with one
    executemany, the rows log_batch writes, after MLflow's own validation of each param (names and lengths): ~1 ms
    of CPU against ~11 for the ~200 params a run records. Keys must be new to the run: a key it already has (same
    value or not) makes the INSERT fail and nothing is written; the caller then goes through log_batch, which accepts
    the same value again and refuses another with MLflow's message. None where writer_for gives None."""
    if writer_for(client, uri) is None:
        return None
    try:
        from mlflow.store.tracking.dbmodels.models import SqlParam
        from mlflow.utils.validation import _validate_batch_log_data
    except Exception:  # another MLflow layout: the public API
        return None
    store = client._tracking_client.store
    table = SqlParam.__table__
    if sorted(c.name for c in table.columns) != ["key", "run_uuid", "value"]:
        return None
    insert = f"INSERT INTO {table.name} (key, value, run_uuid) VALUES (?, ?, ?)"

    def write(run_id: str, params: Sequence) -> None:
        _, checked, _ = _validate_batch_log_data([], list(params), [])
        if len({p.key for p in checked}) != len(checked):
            raise ValueError("a key given twice: log_batch says which")
        with store.ManagedSessionMaker(read_only=False) as session:
            store._check_run_is_active(store._get_run(run_uuid=run_id, session=session))
            session.connection().exec_driver_sql(insert, [(p.key, p.value, run_id) for p in checked])

    return write


def _order(row: tuple) -> tuple:
    return row[3], row[2], row[1]  # step, timestamp, value


def _primary_key_order(row: tuple) -> tuple:
    return row[0], row[2], row[3], row[1], row[4]  # key, timestamp, step, value, is_nan (one run)

