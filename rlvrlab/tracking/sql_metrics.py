"""Metric points into MLflow's SQL store with one multi-row INSERT, the rows `log_batch` would write.

MLflow's SqlAlchemyStore.log_batch builds an ORM object per metric point and per latest-value update: ~140 us
of CPU per point on sqlite (mlflow 3.17), 1.2 s for the ~8,800 points of a 200-step toy run, almost a quarter of
the run (bench/README.md, "The full toy grid"); here it is 15-30 us. The points go in through SQLAlchemy Core on
the store's own tables and session, in one transaction: the same `metrics` rows (NaN stored as value 0 with
is_nan, +-inf as +-max float, exact duplicates skipped as log_batch skips them) and the same `latest_metrics` rows
(per key the point with the largest (step, timestamp, value)). tests/test_faults.py compares both paths row by row.

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

    def write(run_id: str, metrics: Sequence) -> None:
        from sqlalchemy import select

        rows: list[dict] = []
        latest: dict[str, dict] = {}
        for m in metrics:
            is_nan, value = store.sanitize_metric_value(m.value)
            row = {"key": m.key, "value": value, "timestamp": m.timestamp, "step": m.step, "is_nan": is_nan,
                   "run_uuid": run_id}
            rows.append(row)
            best = latest.get(m.key)
            if best is None or _order(row) > _order(best):
                latest[m.key] = row
        if not rows:
            return
        with store.ManagedSessionMaker(read_only=False) as session:
            store._check_run_is_active(store._get_run(run_uuid=run_id, session=session))
            session.execute(metrics_table.insert().prefix_with("OR IGNORE"), rows)
            stored = {r.key: r for r in session.execute(
                select(latest_table).where(latest_table.c.run_uuid == run_id, latest_table.c.key.in_(list(latest))))}
            new = [row for key, row in latest.items() if key not in stored]
            if new:
                session.execute(latest_table.insert(), new)
            for key, row in latest.items():
                old = stored.get(key)
                if old is not None and _order(row) > (old.step, old.timestamp, old.value):
                    session.execute(latest_table.update()
                                    .where(latest_table.c.run_uuid == run_id, latest_table.c.key == key)
                                    .values(value=row["value"], timestamp=row["timestamp"], step=row["step"],
                                            is_nan=row["is_nan"]))

    return write


def _order(row: dict) -> tuple:
    return row["step"], row["timestamp"], row["value"]
