"""Finding runs in an MLflow store: training runs, a sweep's seed runs, the evaluations linked to a run.

What the tags mean is in `rlvrlab.tracking.tags`; grouping runs into configurations is the report's
(`rlvrlab.report.collect`).
"""

from __future__ import annotations

from rlvrlab.errors import RlvrlabError
from rlvrlab.tracking import tags as T


def client_for(uri: str):
    from rlvrlab.tracking.mlflow_tracker import quiet_client

    return quiet_client(uri)


def is_training_run(run) -> bool:
    """A `rlvrlab train` run (alone or a sweep's seed run), not a study, trial or evaluation run."""
    tags = run.data.tags
    return T.CONFIG_HASH in tags and tags.get(T.ROLE) not in ("study", "trial") and tags.get(T.KIND) != "eval"


def seed_of(run) -> int:
    return int(run.data.tags.get(T.SEED, run.data.params.get("seed", 0)))


def experiment_runs(client, name: str, *, uri: str, what: str = "experiment") -> list:
    """Every run of MLflow experiment `name` (a sweep study's experiment is named after the study)."""
    from rlvrlab.config.rules import unknown

    found = client.get_experiment_by_name(name)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise unknown(what, name, names, where=uri)
    return client.search_runs([found.experiment_id], max_results=50_000)


def runs_by_id(client, run_ids, *, uri: str) -> list:
    """The runs `--runs ID,...` names, in that order; an id the store does not have is a one-line error."""
    runs = []
    for run_id in run_ids:
        try:
            runs.append(client.get_run(run_id))
        except Exception:
            raise RlvrlabError(f"--runs: no run {run_id} in {uri}; list runs with "
                               f"mlflow ui --backend-store-uri {uri}") from None
    return runs


def training_run_ids(uri: str, *, experiment: str | None = None, study: str | None = None) -> list[str]:
    """The FINISHED training runs of an experiment, or the FINISHED seed runs of a sweep study."""
    if (experiment is None) == (study is None):
        raise RlvrlabError("give exactly one of an experiment or a study")
    client = client_for(uri)
    runs = experiment_runs(client, study or experiment or "", uri=uri, what="study" if study else "experiment")
    if study:
        runs = [r for r in runs if r.data.tags.get(T.ROLE) == "seed"]
    return [r.info.run_id for r in runs if r.info.status == "FINISHED" and is_training_run(r)]


def linked_evaluations(client, run_id: str) -> list:
    """The FINISHED `rlvrlab eval pass-at-k` runs of a training run: it names each in a tag rlvrlab.eval.<id>."""
    linked = [key[len(T.EVAL_LINK):] for key in client.get_run(run_id).data.tags if key.startswith(T.EVAL_LINK)]
    evaluations = []
    for eval_id in linked:
        try:
            evaluations.append(client.get_run(eval_id))
        except Exception:  # deleted, or in another store
            continue
    return [e for e in evaluations if e.info.status == "FINISHED"]
