"""`rlvrlab eval pass-at-k`: sample n responses per problem, verify them, report pass@k / maj@k / avg@n.

Every input is checked before the model is loaded (one-line RlvrlabError): exactly one of --model / --run,
the run's folder and checkpoint, the datasets and their files, and k <= n. Results go to files (records.jsonl,
records.csv, samples.jsonl, aggregate.json) and to an MLflow evaluation run in the same store as training.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from rlvrlab.config.schema import DatasetConfig, RunConfig
from rlvrlab.errors import RlvrlabError

eval_app = typer.Typer(help="Evaluate a model or a training run's checkpoint on datasets.", no_args_is_help=True)

SPLITS = ("auto", "train", "eval", "all")


@dataclass
class Target:
    """What is evaluated: a model folder, and the training run and checkpoint it came from (if any)."""

    folder: Path
    name: str  # a short label for folders and the MLflow run name
    run_id: Optional[str] = None
    step: Optional[int] = None
    run_cfg: Optional[RunConfig] = None
    config_file: Optional[Path] = None  # the training run's resolved config.yaml


@dataclass
class Dataset:
    cfg: DatasetConfig
    problems: list
    sha256: str  # of the data file, or "synthetic"


def _parse_ks(text: str, n: int) -> list[int]:
    from rlvrlab.eval.run import check_ks

    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise RlvrlabError(f"--k {text!r}: give comma-separated integers, e.g. --k 1,4,16,64") from None
    return check_ks(ks, n)


def _checkpoint(run_dir: Path, run_id: str, step: Optional[int]) -> Path:
    from rlvrlab.train.checkpoint import complete as complete_checkpoints, step_of

    root = run_dir / "checkpoints"
    complete = complete_checkpoints(run_dir)
    if step is None:
        if not complete:
            raise RlvrlabError(f"run {run_id} has no complete checkpoint in {root}; train with "
                               "trainer.checkpoint_every > 0, or evaluate a model folder with --model")
        return complete[-1]
    folder = root / f"step_{step:06d}"
    if folder not in complete:
        have = ", ".join(str(step_of(p)) for p in complete) or "none"
        raise RlvrlabError(f"run {run_id} has no complete checkpoint at step {step} (complete steps: {have})")
    return folder


def _target(model: Optional[Path], run: Optional[str], checkpoint: Optional[int], output_dir: Path) -> Target:
    from rlvrlab.config import compose
    from rlvrlab.train.checkpoint import step_of

    if (model is None) == (run is None):
        raise RlvrlabError("give exactly one of --model PATH (a Hugging Face model folder) or --run RUN_ID "
                           "(a training run's checkpoint)")
    if model is not None:
        if checkpoint is not None:
            raise RlvrlabError("--checkpoint picks a step of --run; a --model folder has no checkpoints")
        folder = model.expanduser().resolve()
        if not (folder / "config.json").is_file():
            what = "does not exist" if not folder.exists() else "has no config.json"
            raise RlvrlabError(f"--model {model} {what}; give a Hugging Face model folder (config.json, weights, "
                               "tokenizer)")
        return Target(folder, folder.name)
    run_dir = output_dir.expanduser().resolve() / run
    if not (run_dir / "config.yaml").is_file():
        raise RlvrlabError(f"--run {run}: no run folder {run_dir} with config.yaml; pass --output-dir of the "
                           "training run")
    run_cfg = compose(run_dir / "config.yaml")
    ckpt = _checkpoint(run_dir, run, checkpoint)
    folder = ckpt / "model"
    if not (folder / "config.json").is_file():
        raise RlvrlabError(f"run {run} checkpoint {ckpt.name} has no Hugging Face model folder ({folder}); "
                           f"model.tier={run_cfg.model.tier} runs cannot be evaluated (only tiny and real tiers)")
    step = step_of(ckpt)
    return Target(folder, f"{run[:12]}-step{step}", run, step, run_cfg, run_dir / "config.yaml")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _datasets(names: list[str], sets: list[str], split: str, limit: Optional[int],
              run: Optional[Target] = None) -> list[Dataset]:
    """The --dataset files with their --set overrides; with --run and no --dataset, the run's own dataset as it
    was trained (its resolved config, level and template included)."""
    from rlvrlab.config import compose
    from rlvrlab.data import load_problems

    own = not names and run is not None and run.config_file is not None
    if own:
        names = [run.run_cfg.dataset.name]
    if not names:
        raise RlvrlabError("give at least one --dataset NAME (a file in experiments/datasets/, e.g. countdown)")
    if len(set(names)) < len(names):
        raise RlvrlabError(f"--dataset {', '.join(names)}: a dataset is named twice; give each once")
    scoped: list[tuple[Optional[str], str]] = []  # (dataset name or None for all, override)
    for text in sets:
        head, colon, rest = text.partition(":")
        scope, override = (head, rest) if colon and "=" not in head else (None, text)
        if not override.startswith("dataset."):
            raise RlvrlabError(f"--set {text!r}: only dataset fields can be set here, e.g. --set dataset.path=... "
                               "or, for one of several datasets, --set math500:dataset.path=...")
        if scope is not None and scope not in names:
            raise RlvrlabError(f"--set {text!r}: {scope} is not one of the --dataset names ({', '.join(names)})")
        scoped.append((scope, override))
    if split not in SPLITS:
        raise RlvrlabError(f"--split {split!r} is not one of {', '.join(SPLITS)}")
    out = []
    for name in names:
        mine = [o for scope, o in scoped if scope in (None, name)]
        cfg = compose(run.config_file, mine) if own else compose(None, [f"dataset={name}", *mine])
        ds = cfg.dataset
        # auto: the held-out problems when the dataset holds some out, else every problem
        chosen = split if split != "auto" else ("all" if ds.split == "all" else
                                                "eval" if ds.eval_fraction > 0 else "train")
        train, held_out = load_problems(ds, cfg.model)
        problems = {"eval": held_out, "train": train, "all": train + held_out}[chosen]
        if not problems:
            raise RlvrlabError(f"dataset {name}: split {chosen} holds no problems (eval_fraction "
                               f"{ds.eval_fraction}); use --split train or all")
        if limit is not None:
            problems = problems[:limit]
        sha = "synthetic" if ds.format == "synthetic" else _file_sha256(Path(ds.path).expanduser())
        out.append(Dataset(replace(ds, split=chosen), problems, sha))
    return out


def _pool(ds: DatasetConfig):
    from rlvrlab.rewards import VERIFIERS
    from rlvrlab.rewards.pool import RewardPool

    if ds.verifier not in VERIFIERS:
        raise RlvrlabError(f"dataset {ds.name}: verifier {ds.verifier!r} is unknown; expected one of "
                           f"{', '.join(sorted(VERIFIERS))}")
    # the same pool settings as training: the dataset's verifier_timeout, verifier_workers, math_extraction
    return RewardPool(ds.verifier, workers=ds.verifier_workers, timeout_s=ds.verifier_timeout,
                      math_extraction=ds.math_extraction)


def _table(summary: dict, ks: list[int], n: int) -> Table:
    """One column per dataset (and per source within it, when they differ), one row per statistic."""
    columns: list[tuple[str, dict]] = []
    for name, entry in summary.items():
        columns.append((name, entry))
        columns += [(f"{name}/{source}", sub) for source, sub in entry.get("by_source", {}).items()]
    table = Table(title=f"n={n} samples per problem; means over problems")
    table.add_column("statistic")
    for label, _ in columns:
        table.add_column(label, justify="right")

    def fmt(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    table.add_row("problems", *(str(e["problems"]) for _, e in columns))
    table.add_row(f"avg@{n}", *(fmt(e["avg@n"]) for _, e in columns))
    for stat in ("pass", "maj"):
        for k in ks:
            table.add_row(f"{stat}@{k}", *(fmt(e[f"{stat}@{k}"]) for _, e in columns))
    table.add_row("diversity of correct", *(fmt(e["diversity"]) for _, e in columns))
    table.add_row("  problems with a correct", *(str(e["diversity_problems"]) for _, e in columns))
    table.add_row("no answer", *(f"{e['no_answer_rate']:.1%}" for _, e in columns))
    return table


@eval_app.command("pass-at-k")
def pass_at_k(
    model: Annotated[Optional[Path], typer.Option("--model", help="A Hugging Face model folder.",
                                                  show_default=False)] = None,
    run: Annotated[Optional[str], typer.Option("--run", help="A training run id: evaluates its newest complete "
                                               "checkpoint.", show_default=False)] = None,
    study: Annotated[Optional[str], typer.Option("--study", help="Every finished seed run of this sweep study "
                                                 "(runs already evaluated with the same settings are skipped).",
                                                 show_default=False)] = None,
    of_experiment: Annotated[Optional[str], typer.Option("--runs-of", help="Every finished training run of this "
                                                         "MLflow experiment (same skipping).",
                                                         show_default=False)] = None,
    checkpoint: Annotated[Optional[int], typer.Option("--checkpoint", help="With --run: the step to evaluate.",
                                                      show_default=False)] = None,
    output_dir: Annotated[Path, typer.Option("--output-dir", help="Where training runs and the MLflow store "
                                             "(mlflow.db) live.")] = Path("runs"),
    dataset: Annotated[Optional[list[str]], typer.Option("--dataset", help="A dataset file name in "
                                                         "experiments/datasets/ (repeatable); with --run, "
                                                         "default: the run's own dataset.",
                                                         show_default=False)] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="A dataset override, e.g. "
                                                      "dataset.path=bench.jsonl, or NAME:dataset.path=... for one "
                                                      "of several datasets (repeatable).",
                                                      show_default=False)] = None,
    split: Annotated[str, typer.Option("--split", help="auto: the held-out problems if the dataset holds some "
                                       "out, else all; or train | eval | all.")] = "auto",
    n: Annotated[int, typer.Option("--n", help="Samples per problem.")] = 64,
    k: Annotated[str, typer.Option("--k", help="Comma-separated ks, each <= n.")] = "1,4,16,64",
    temperature: Annotated[Optional[float], typer.Option(help="Default: the run's (or default experiment's) "
                                                         "rollout.temperature.", show_default=False)] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Default: rollout.top_p of the run.",
                                                   show_default=False)] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Default: rollout.max_new_tokens of the run.",
                                                          show_default=False)] = None,
    engine: Annotated[Optional[str], typer.Option(help="hf | vllm; default: rollout.engine of the run.",
                                                  show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    limit: Annotated[Optional[int], typer.Option(help="Evaluate only the first N problems of each dataset.",
                                                 show_default=False)] = None,
    batch_prompts: Annotated[Optional[int], typer.Option(help="Prompts per generate call; default ~256/n (hf).",
                                                         show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Output folder; default results/eval/<name>.",
                                                show_default=False)] = None,
    experiment: Annotated[Optional[str], typer.Option(help="MLflow experiment; default eval, or "
                                                      "<training experiment>-eval with --run.",
                                                      show_default=False)] = None,
) -> None:
    """Unbiased pass@k, exact expected maj@k and avg@n of a model on datasets, recorded in MLflow.

    [dim]rlvrlab eval pass-at-k --run 3f2a... --dataset countdown --n 64 --k 1,4,16,64
    rlvrlab eval pass-at-k --model /models/Qwen2.5-Math-1.5B --dataset math500 --n 16 --k 1,4,16 \\
        --temperature 0.6 --top-p 0.95 --max-new-tokens 4096 --engine vllm
    rlvrlab eval pass-at-k --study tiny_algorithms --n 64 --k 1,4,16,64     # every seed run of a sweep[/dim]
    """
    # ---- everything that can be wrong is checked here, before the model is loaded
    ks = _parse_ks(k, n)
    if limit is not None and limit < 1:
        raise RlvrlabError(f"--limit {limit}: give at least 1 problem")
    if study or of_experiment:
        if model is not None or run is not None or study and of_experiment:
            raise RlvrlabError("give one of --model, --run, --study or --runs-of")
        runs = _runs_to_evaluate(output_dir, study, of_experiment, n=n, ks=ks, seed=seed, datasets=dataset or [])
        if not runs:
            Console().print("every finished training run already has an evaluation with these settings")
        for number, run_id in enumerate(runs, 1):
            Console(stderr=True).print(f"[bold]run {number}/{len(runs)}[/]: {run_id}")
            _evaluate_one(_target(None, run_id, checkpoint, output_dir), dataset=dataset, set_=set_, split=split,
                          limit=limit, n=n, ks=ks, temperature=temperature, top_p=top_p,
                          max_new_tokens=max_new_tokens, engine=engine, seed=seed, batch_prompts=batch_prompts,
                          out=out / run_id if out else None, output_dir=output_dir, experiment=experiment)
        return
    _evaluate_one(_target(model, run, checkpoint, output_dir), dataset=dataset, set_=set_, split=split, limit=limit,
                  n=n, ks=ks, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, engine=engine,
                  seed=seed, batch_prompts=batch_prompts, out=out, output_dir=output_dir, experiment=experiment)


def _runs_to_evaluate(output_dir: Path, study: Optional[str], experiment: Optional[str], *, n: int, ks: list[int],
                      seed: int, datasets: list[str]) -> list[str]:
    """The finished training runs of a study or experiment, minus those that already have an evaluation with the
    same n, ks, seed and datasets (so re-running the command finishes what is missing)."""
    from rlvrlab.report.collect import client_for, linked_evaluations, select
    from rlvrlab.tracking.mlflow_tracker import default_uri

    uri = default_uri(output_dir.expanduser().resolve())
    selection = select(uri, experiment=experiment, study=study)
    client = client_for(uri)
    wanted = {"n": str(n), "ks": ",".join(map(str, ks)), "seed": str(seed)} | (
        {"dataset": ",".join(datasets)} if datasets else {})

    def done(run_id: str) -> bool:
        return any(all(e.data.params.get(k) == v for k, v in wanted.items())
                   for e in linked_evaluations(client, run_id))

    return [r.run_id for g in selection.groups for r in g.runs if not done(r.run_id)]


def _evaluate_one(target: Target, *, dataset, set_, split: str, limit: Optional[int], n: int, ks: list[int],
                  temperature, top_p, max_new_tokens, engine, seed: int, batch_prompts, out: Optional[Path],
                  output_dir: Path, experiment: Optional[str]) -> None:
    from rlvrlab.config import compose
    from rlvrlab.eval.run import Sampling

    datasets = _datasets(list(dataset or []), list(set_ or []), split, limit, target)
    pools = [_pool(d.cfg) for d in datasets]
    base = target.run_cfg or compose(None)
    sampling = Sampling(
        engine=engine or base.rollout.engine,
        temperature=base.rollout.temperature if temperature is None else temperature,
        top_p=base.rollout.top_p if top_p is None else top_p,
        max_new_tokens=base.rollout.max_new_tokens if max_new_tokens is None else max_new_tokens,
        dtype=base.model.dtype, gpu_memory_utilization=base.rollout.vllm_gpu_memory_utilization,
        batch_prompts=batch_prompts)
    if sampling.engine not in ("hf", "vllm"):
        raise RlvrlabError(f"--engine {sampling.engine!r} is unknown; expected hf or vllm")
    if not sampling.temperature > 0 or not 0 < sampling.top_p <= 1 or sampling.max_new_tokens < 1:
        raise RlvrlabError("need --temperature > 0, 0 < --top-p <= 1 and --max-new-tokens >= 1")
    if batch_prompts is not None and batch_prompts < 1:
        raise RlvrlabError(f"--batch-prompts {batch_prompts}: give at least 1")
    names = "+".join(d.cfg.name for d in datasets)
    name = f"{target.name}-{names}"
    out = out or Path("results") / "eval" / name
    output_dir = output_dir.expanduser().resolve()
    tracking_uri = (target.run_cfg.tracking.uri if target.run_cfg else None)
    experiment = experiment or (f"{target.run_cfg.experiment}-eval" if target.run_cfg else "eval")

    summary, files = _sample_and_score(target, datasets, pools, sampling, ks=ks, n=n, seed=seed, out=out)
    run_id, uri = _track(target, datasets, sampling, summary, files, ks=ks, n=n, seed=seed, name=name,
                         output_dir=output_dir, tracking_uri=tracking_uri, experiment=experiment)
    console = Console(soft_wrap=True)
    console.print(_table(summary, ks, n))
    console.print(f"[green]done[/]: {', '.join(str(f) for f in files)}")
    console.print(f"  MLflow run [bold]{run_id}[/] (experiment {experiment!r}) in {uri}")


def _sample_and_score(target: Target, datasets: list[Dataset], pools: list, sampling, *, ks: list[int], n: int,
                      seed: int, out: Path) -> tuple[dict, list[Path]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rlvrlab.eval.run import aggregate, evaluate, open_sampler, write_outputs
    from rlvrlab.train.setup import prompt_renderer

    sampler = open_sampler(target.folder, sampling, seed=seed)
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True),
                        disable=os.environ.get("RLVRLAB_NO_PROGRESS") == "1")
    records, samples = [], []
    try:
        with progress:
            for d, pool in zip(datasets, pools):
                task = progress.add_task(f"{d.cfg.name} ({n} samples/problem)", total=len(d.problems))
                render = prompt_renderer(d.cfg, sampler.tokenizer)
                with pool:
                    result = evaluate(sampler, d.problems, render, n=n, ks=ks, seed=seed, pool=pool,
                                      dataset=d.cfg.name,
                                      progress=lambda done, total, task=task: progress.update(task, completed=done))
                records += result.records
                samples += result.samples
    finally:
        sampler.close()
    per_dataset = aggregate(records, ks)
    summary = {name: {**entry, "sha256": d.sha256, "split": d.cfg.split, "verifier": d.cfg.verifier}
               for d in datasets for name, entry in per_dataset.items() if name == d.cfg.name}
    meta = {"model": str(target.folder), "source_run": target.run_id, "checkpoint_step": target.step, "n": n,
            "ks": ks, "seed": seed, **{f"sampling.{key}": value for key, value in vars(sampling).items()}}
    files = write_outputs(out, records, samples, {"meta": meta, "datasets": summary}, ks)
    return summary, files


def _track(target: Target, datasets: list[Dataset], sampling, summary: dict, files: list[Path], *, ks: list[int],
           n: int, seed: int, name: str, output_dir: Path, tracking_uri: Optional[str],
           experiment: str) -> tuple[str, str]:
    from rlvrlab.eval.run import mlflow_metrics
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker, default_uri

    output_dir.mkdir(parents=True, exist_ok=True)
    uri = tracking_uri or default_uri(output_dir)
    tracker = MlflowTracker(uri, experiment, artifact_root=None if tracking_uri else output_dir / "mlartifacts",
                            run_name=f"eval-{name}")
    params = {"n": n, "ks": ",".join(map(str, ks)), "seed": seed, "dataset": ",".join(d.cfg.name for d in datasets),
              **{f"sampling.{key}": value for key, value in vars(sampling).items()}}
    for d in datasets:
        params.update({f"dataset.{d.cfg.name}.split": d.cfg.split, f"dataset.{d.cfg.name}.problems": len(d.problems),
                       f"dataset.{d.cfg.name}.verifier": d.cfg.verifier,
                       f"dataset.{d.cfg.name}.path": d.cfg.path or "synthetic"})
    tracker.log_params(params)
    tags = {"rlvrlab.kind": "eval", "rlvrlab.model_path": str(target.folder), "rlvrlab.seed": str(seed),
            "rlvrlab.datasets": ",".join(d.cfg.name for d in datasets)}
    for d in datasets:
        tags[f"rlvrlab.dataset_sha256.{d.cfg.name}"] = d.sha256
    if len(datasets) == 1:
        tags["rlvrlab.dataset_sha256"] = datasets[0].sha256
    if target.run_id:
        tags.update({"rlvrlab.source_run": target.run_id, "rlvrlab.checkpoint_step": str(target.step)})
    tracker.set_tags(tags)
    tracker.log_metrics(target.step or 0, mlflow_metrics(summary))
    for path in files:
        tracker.log_artifact(path, "eval")
    tracker.finish("FINISHED")
    if target.run_id:  # link back: a tag on the training run names this evaluation
        try:
            tracker.client.set_tag(target.run_id, f"rlvrlab.eval.{tracker.run_id}",
                                   f"step {target.step}: {','.join(d.cfg.name for d in datasets)}")
        except Exception:  # the training run is not in this store: the eval run still names it
            pass
    return tracker.run_id, uri
