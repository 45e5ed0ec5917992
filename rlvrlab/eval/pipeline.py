"""`rlvrlab eval pass-at-k` as a library call: what to evaluate (a model folder, a run's checkpoint, every run of a
study or experiment), on which datasets, with which sampling; then sample, verify, write records and record an
MLflow evaluation run linked to the training run.

Every input is checked before the model is loaded (one-line RlvrlabError): exactly one of --model / --run /
--study / --runs-of, the run's folder and checkpoint, the datasets and their files, the sampling settings, and
k <= n. Results go to files (records.jsonl, records.csv, samples.jsonl, aggregate.json) and to an MLflow
evaluation run in the same store as training.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from rlvrlab import components, outputs, rundir
from rlvrlab.components import Sampling
from rlvrlab.config import compose, config_hash
from rlvrlab.config.schema import DatasetConfig, RunConfig
from rlvrlab.data import answer_space, load_problems
from rlvrlab.data.problems import Problem
from rlvrlab.errors import RlvrlabError
from rlvrlab.eval.request import EvalRequest
from rlvrlab.eval.run import aggregate, check_ks, evaluate, mlflow_metrics, open_sampler, write_outputs
from rlvrlab.tracking import tags as T
from rlvrlab.tracking.identity import InitialModel, environment_tags
from rlvrlab.tracking.provenance import git_state
from rlvrlab.tracking.store import check_reachable, store
from rlvrlab.tracking.testbed import Testbed
from rlvrlab.update.device import choose, gather

SPLITS = ("auto", "train", "eval", "all")

# progress(dataset label, problems done, problems in all)
Progress = Callable[[str, int, int], None]


@dataclass
class EvalOutcome:
    """One evaluated target: the per-dataset summary, the files written and the MLflow evaluation run."""

    target: str
    summary: dict
    ks: list[int]
    n: int
    files: list[Path] = field(default_factory=list)
    mlflow_run_id: str = ""
    uri: str = ""
    experiment: str = ""
    records: list[dict] = field(default_factory=list)  # per problem (rlvrlab.eval.run.problem_record)
    config_hash: str = ""  # the training run's configuration without its seed ("" for --model)


@dataclass(frozen=True)
class SourceRun:
    """The training run and checkpoint an evaluated model folder came from."""

    run_id: str
    step: int
    cfg: RunConfig
    config_file: Path  # the training run's resolved config.yaml


@dataclass
class Target:
    """What is evaluated: a model folder, and the training run and checkpoint it came from (if any)."""

    folder: Path
    name: str  # a short label for folders and the MLflow run name
    source: Optional[SourceRun] = None


@dataclass
class Dataset:
    cfg: DatasetConfig
    problems: list
    sha256: str  # of the data file, or "synthetic"


def targets(request: EvalRequest) -> list[str] | None:
    """The run ids a --study / --runs-of request evaluates (those not yet evaluated with the same settings), or
    None for a single --model / --run request. Checks the request's flags first."""
    _parse_ks(request.k, request.n)
    if request.limit is not None and request.limit < 1:
        raise RlvrlabError(f"--limit {request.limit}: give at least 1 problem")
    if not (request.study or request.runs_of):
        return None
    if request.model is not None or request.run is not None or request.study and request.runs_of:
        raise RlvrlabError("give one of --model, --run, --study or --runs-of")
    return _runs_to_evaluate(request)


def pass_at_k(request: EvalRequest, *, progress: Optional[Progress] = None,
              announce: Optional[Callable[[int, int, str], None]] = None) -> Iterator[EvalOutcome]:
    """Evaluate what the request names, one outcome per model or run (lazily: a study's runs one by one).
    announce(number, of, run id) before each run of a --study / --runs-of request; with none left to evaluate,
    nothing is yielded."""
    ks = _parse_ks(request.k, request.n)
    check_outputs(request)
    runs = targets(request)
    if runs is None:
        yield _evaluate_one(_target(request.model, request.run, request.checkpoint, request.output_dir), request,
                            ks, progress)
        return
    for number, run_id in enumerate(runs, 1):
        if announce is not None:
            announce(number, len(runs), run_id)
        one = replace(request, out=request.out / run_id if request.out else None)
        yield _evaluate_one(_target(None, run_id, request.checkpoint, request.output_dir), one, ks, progress)


def check_outputs(request: EvalRequest) -> None:
    """Where the request writes, checked before any model is loaded: the run folders' output_dir (the MLflow
    store) and --out (a folder; a file there would lose every sample at the end)."""
    outputs.check_dir(request.output_dir, f"--output-dir {request.output_dir}")
    outputs.check_dir(request.out if request.out is not None else Path("results") / "eval",
                      f"--out {request.out}" if request.out is not None else "results/eval")


def _parse_ks(text: str, n: int) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise RlvrlabError(f"--k {text!r}: give comma-separated integers, e.g. --k 1,4,16,64") from None
    return check_ks(ks, n)


def _checkpoint(run_dir: Path, run_id: str, step: Optional[int]) -> Path:
    """The run's newest intact checkpoint (rundir.newest_intact: a damaged newer one is skipped with a warning on
    stderr), or the one at `step`, which must be intact."""
    if step is None:
        return rundir.newest_intact(run_dir, run_id, purpose="evaluated", warn=_stderr_warning,
                                    fix="train with trainer.checkpoint_every > 0, or evaluate a model folder with "
                                        "--model")
    good, bad = rundir.intact(run_dir)
    folder = rundir.checkpoint_dir(run_dir, step)
    damaged = dict(bad)
    if folder in damaged:
        have = ", ".join(str(rundir.step_of(p)) for p in good) or "none"
        raise RlvrlabError(f"run {run_id}: {rundir.damage_note([(folder, damaged[folder])])}; intact checkpoint "
                           f"steps: {have}")
    if folder not in good:
        have = ", ".join(str(rundir.step_of(p)) for p in good) or "none"
        raise RlvrlabError(f"run {run_id} has no complete checkpoint at step {step} (complete steps: {have})")
    return folder


def _stderr_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _target(model: Optional[Path], run: Optional[str], checkpoint: Optional[int], output_dir: Path) -> Target:
    if model is not None and run is None:
        if checkpoint is not None:
            raise RlvrlabError("--checkpoint picks a step of --run; a --model folder has no checkpoints")
        folder = components.check_model_folder(model, "--model")
        return Target(folder, folder.name)
    if model is not None or run is None:
        raise RlvrlabError("give exactly one of --model PATH (a Hugging Face model folder) or --run RUN_ID "
                           "(a training run's checkpoint)")
    run_dir = rundir.run_dir(output_dir, run)
    config_file = rundir.config_file(run_dir)
    if not config_file.is_file():
        raise RlvrlabError(f"--run {run}: no run folder {run_dir} with config.yaml; pass --output-dir of the "
                           "training run")
    run_cfg = compose(config_file)
    ckpt = _checkpoint(run_dir, run, checkpoint)
    folder = ckpt / rundir.MODEL
    if not (folder / "config.json").is_file():
        raise RlvrlabError(f"run {run} checkpoint {ckpt.name} has no Hugging Face model folder ({folder}); "
                           f"model.tier={run_cfg.model.tier} runs cannot be evaluated (only tiny and real tiers)")
    step = rundir.step_of(ckpt)
    return Target(folder, f"{run[:12]}-step{step}", SourceRun(run, step, run_cfg, config_file))


def _datasets(names: list[str], sets: list[str], split: str, limit: Optional[int],
              source: Optional[SourceRun] = None) -> list[Dataset]:
    """The --dataset files with their --set overrides; with --run and no --dataset, the run's own dataset as it
    was trained (its resolved config, level and template included)."""
    own = source if not names else None
    if own is not None:
        names = [own.cfg.dataset.name]
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
        cfg = compose(own.config_file, mine) if own is not None else compose(None, [f"dataset={name}", *mine])
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
        # config.rules: a synthetic dataset has no path, a file format always has one
        sha = "synthetic" if ds.path is None else rundir.file_sha256(Path(ds.path).expanduser())
        out.append(Dataset(replace(ds, split=chosen), problems, sha))
    return out


def _runs_to_evaluate(request: EvalRequest) -> list[str]:
    """The finished training runs of a study or experiment, minus those that already have an evaluation with the
    same n, ks, seed and datasets (so re-running the command finishes what is missing)."""
    from rlvrlab.tracking.runs import client_for, linked_evaluations, training_run_ids

    uri = store(request.output_dir).uri
    run_ids = training_run_ids(uri, experiment=request.runs_of, study=request.study)
    if not run_ids:
        raise RlvrlabError(f"no finished training runs in {request.study or request.runs_of!r} at {uri}")
    client = client_for(uri)
    ks = _parse_ks(request.k, request.n)
    wanted = {"n": str(request.n), "ks": ",".join(map(str, ks)), "seed": str(request.seed)} | (
        {"dataset": ",".join(request.datasets)} if request.datasets else {})

    def done(run_id: str) -> bool:
        return any(all(e.data.params.get(k) == v for k, v in wanted.items())
                   for e in linked_evaluations(client, run_id))

    return [run_id for run_id in run_ids if not done(run_id)]


def _evaluate_one(target: Target, request: EvalRequest, ks: list[int], progress: Optional[Progress]) -> EvalOutcome:
    datasets = _datasets(list(request.datasets), list(request.sets), request.split, request.limit, target.source)
    source = target.source
    base = source.cfg if source is not None else compose(None)
    sampling = Sampling(
        engine=request.engine or base.rollout.engine,
        temperature=base.rollout.temperature if request.temperature is None else request.temperature,
        top_p=base.rollout.top_p if request.top_p is None else request.top_p,
        max_new_tokens=base.rollout.max_new_tokens if request.max_new_tokens is None else request.max_new_tokens,
        dtype=base.model.dtype, gpu_memory_utilization=base.rollout.vllm_gpu_memory_utilization,
        batch_prompts=request.batch_prompts)
    if sampling.engine not in components.ROLLOUT_ENGINES:
        raise RlvrlabError(f"--engine {sampling.engine!r} is unknown; expected one of "
                           f"{', '.join(components.ROLLOUT_ENGINES)}")
    if not sampling.temperature > 0 or not 0 < sampling.top_p <= 1 or sampling.max_new_tokens < 1:
        raise RlvrlabError("need --temperature > 0, 0 < --top-p <= 1 and --max-new-tokens >= 1")
    if request.batch_prompts is not None and request.batch_prompts < 1:
        raise RlvrlabError(f"--batch-prompts {request.batch_prompts}: give at least 1")
    # the run's trainer.device (the default experiment's for --model): a GPU run's checkpoint on a GPU or one line
    device = choose(base.trainer.device, gather(sampling.engine),
                    fallback="or evaluate its checkpoint folder with --model (trainer.device=auto)")
    pools = [components.reward_pool(d.cfg) for d in datasets]
    name = f"{target.name}-{'+'.join(d.cfg.name for d in datasets)}"
    out = request.out or Path("results") / "eval" / name
    outputs.check_dir(out, f"--out {out}")
    experiment = request.experiment or (f"{source.cfg.experiment}-eval" if source is not None else "eval")
    where = store(request.output_dir, source.cfg.tracking.uri if source is not None else None)
    check_reachable(where.uri)  # before any sampling: its records go there at the end
    identity = _identity(target, sampling, request.testbed, where.uri)  # a test bed's refusal: before any sampling
    summary, files, records = _sample_and_score(target, datasets, pools, sampling, ks=ks, n=request.n,
                                                seed=request.seed, out=out, progress=progress, device=device)
    run_id = _track(target, datasets, sampling, summary, files, ks=ks, n=request.n, seed=request.seed, name=name,
                    output_dir=Path(request.output_dir).expanduser().resolve(), where=where, experiment=experiment,
                    identity=identity)
    return EvalOutcome(name, summary, ks, request.n, files, run_id, where.uri, experiment, records,
                       config_hash(source.cfg) if source is not None else "")


def _identity(target: Target, sampling: Sampling, testbed: Optional[Testbed], uri: str) -> dict[str, str]:
    """The tags that say what an evaluation run evaluated and where: the digest of the weights it evaluates (loaded
    as a run loads them, in the sampling dtype: rlvrlab.components.folder_model) and their source (run:<id>@step<N>
    for a training run's checkpoint), the environment, and the commit and dirty flag of the code, as training runs
    carry them. Under a protocol's test bed (--protocol) a --model folder must be the protocol's initial model, and a
    checkpoint must come from a training run that started from it (its INITIAL_MODEL tag): else one line, or, with
    --allow-initial-model-change, the override tags."""
    source = target.source
    evaluated: InitialModel = components.folder_model(
        target.folder, components.torch_dtype(sampling.dtype),
        f"run:{source.run_id}@step{source.step}" if source is not None else None)
    allowed: dict[str, str] = {}
    if testbed is not None and source is None:
        allowed = testbed.check(evaluated.sha256, f"--model {target.folder}")
    elif testbed is not None and source is not None:
        from rlvrlab.tracking.runs import client_for

        try:
            started = client_for(uri).get_run(source.run_id).data.tags.get(T.INITIAL_MODEL)
        except Exception:  # noqa: BLE001 - not in this store: nothing recorded to check
            started = None
        if started is None and testbed.sha256 is not None and not testbed.allow_change:
            raise RlvrlabError(f"run {source.run_id} records no initial-model digest (trained before runs recorded "
                               f"one, or in another store), so protocol {testbed.protocol}'s test bed "
                               f"{testbed.sha256[:12]} cannot be checked; pass --allow-initial-model-change to "
                               "evaluate it anyway (recorded on the evaluation run)")
        allowed = testbed.check(started or "", f"the initial model of run {source.run_id}")
    sha, dirty, _ = git_state()
    return {**evaluated.tags(), **allowed, **environment_tags(), T.GIT_SHA: sha, T.GIT_DIRTY: str(dirty).lower()}


def _sample_and_score(target: Target, datasets: list[Dataset], pools: list, sampling: Sampling, *, ks: list[int],
                      n: int, seed: int, out: Path,
                      progress: Optional[Progress], device: str = "cpu") -> tuple[dict, list[Path], list[dict]]:
    sampler = open_sampler(target.folder, sampling, seed=seed, device=device)
    records, samples = [], []
    try:
        context = _context(target.folder)
        renders = [_rendered(d, sampler.tokenizer, context, sampling.max_new_tokens) for d in datasets]
        for d, pool, render in zip(datasets, pools, renders):
            label = f"{d.cfg.name} ({n} samples/problem)"
            if progress is not None:
                progress(label, 0, len(d.problems))
            with pool:
                result = evaluate(sampler, d.problems, render, n=n, ks=ks, seed=seed, pool=pool, dataset=d.cfg.name,
                                  progress=None if progress is None else functools.partial(progress, label))
            records += result.records
            samples += result.samples
    finally:
        sampler.close()
    _exact_probabilities(target.folder, datasets, renders, records, sampling, device)
    per_dataset = aggregate(records, ks)
    summary = {name: {**entry, "sha256": d.sha256, "split": d.cfg.split, "verifier": d.cfg.verifier}
               for d in datasets for name, entry in per_dataset.items() if name == d.cfg.name}
    source = target.source
    meta = {"model": str(target.folder), "source_run": source.run_id if source is not None else None,
            "checkpoint_step": source.step if source is not None else None, "n": n,
            "ks": ks, "seed": seed, **{f"sampling.{key}": value for key, value in vars(sampling).items()}}
    files = write_outputs(out, records, samples, {"meta": meta, "datasets": summary}, ks)
    return summary, files, records


def _exact_probabilities(folder: Path, datasets: list[Dataset], renders: list[Callable[[Problem], list[int]]],
                         records: list[dict], sampling: Sampling, device: str = "cpu") -> None:
    """On tasks that list their whole correct set C (rlvrlab.data.answer_space: pairs) every record gets
    correct_set = |C| (the sampled coverage@k divides by it) and, when sampling draws from the policy itself
    (top_p = 1) and each listed response has one tokenization, p_correct: the probability of every correct response
    at the sampling temperature (rlvrlab.policy.exact, teacher-forced in float32), from which pass@k and coverage@k
    are exact at every k (rlvrlab.algorithms.passk.exact_curves; the report's pass@k curve reads them)."""
    listed = [(d, render, space) for d, render in zip(datasets, renders)
              if (space := answer_space(d.cfg)) is not None]
    if not listed:
        return
    by_key = {(r["dataset"], r["id"]): r for r in records}
    for d, _, space in listed:
        for problem in d.problems:
            by_key[(d.cfg.name, problem.id)]["correct_set"] = len(space(problem))
    if sampling.top_p != 1.0:
        return
    import torch

    from rlvrlab.policy.exact import response_logprobs, single_tokenization

    tokenizer = components.load_tokenizer(folder)
    texts = sorted({t for d, _, space in listed for p in d.problems for t in space(p)})
    if tokenizer.eos_token_id is None or single_tokenization(tokenizer, texts) is not None:
        return  # the listed strings are not the responses' whole probability: the sampled estimates stand alone
    model: torch.nn.Module = components.load_model(folder, torch.float32)
    model.to(torch.device(device))
    for d, render, space in listed:
        logps = response_logprobs(model, [render(p) for p in d.problems], [space(p) for p in d.problems],
                                  tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                                  pad_id=tokenizer.pad_token_id, temperature=sampling.temperature)
        for problem, logp in zip(d.problems, logps):
            by_key[(d.cfg.name, problem.id)]["p_correct"] = logp.exp().tolist()


def _context(folder: Path) -> Optional[int]:
    """The model's context in tokens (config.json's max_position_embeddings), None when it does not say."""
    import json

    try:
        context = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(context) if isinstance(context, int) and context > 0 else None


def _rendered(d: Dataset, tokenizer, context: Optional[int], new_tokens: int) -> Callable[[Problem], list[int]]:
    """Every problem's prompt ids, rendered once before any is sampled (problem -> ids); a prompt that, with
    new_tokens, does not fit the model's context is one error (a longer one is cut or extrapolated by the engine, or
    takes memory without bound), naming the longest."""
    render = components.prompt_renderer(d.cfg, tokenizer)
    ids = {p.id: render(p) for p in d.problems}
    longest = max(d.problems, key=lambda p: len(ids[p.id]), default=None)
    if context is not None and longest is not None and len(ids[longest.id]) + new_tokens > context:
        raise RlvrlabError(f"dataset {d.cfg.name}: problem {longest.id}'s prompt has {len(ids[longest.id])} tokens, "
                           f"which with {new_tokens} new tokens is more than the model's context of {context} "
                           "(max_position_embeddings); shorten the prompts (dataset.template, dataset.fewshot), lower "
                           "--max-new-tokens, or leave the problem out")
    return lambda problem: ids[problem.id]


def _track(target: Target, datasets: list[Dataset], sampling: Sampling, summary: dict, files: list[Path], *,
           ks: list[int], n: int, seed: int, name: str, output_dir: Path, where, experiment: str,
           identity: dict[str, str]) -> str:
    from rlvrlab.tracking.mlflow_tracker import MlflowTracker

    # --output-dir's default (runs): a new one gets a .gitignore of `*`, as `rlvrlab train` gives it
    outputs.make_output_dir(output_dir, default=output_dir == Path(EvalRequest.output_dir).resolve())
    tracker = MlflowTracker(where.uri, experiment, artifact_root=where.artifact_root, run_name=f"eval-{name}")
    params = {"n": n, "ks": ",".join(map(str, ks)), "seed": seed, "dataset": ",".join(d.cfg.name for d in datasets),
              **{f"sampling.{key}": value for key, value in vars(sampling).items()}}
    for d in datasets:
        params.update({f"dataset.{d.cfg.name}.split": d.cfg.split, f"dataset.{d.cfg.name}.problems": len(d.problems),
                       f"dataset.{d.cfg.name}.verifier": d.cfg.verifier,
                       f"dataset.{d.cfg.name}.path": d.cfg.path or "synthetic"})
    tracker.log_params(params)
    tags = {**identity, T.KIND: "eval", T.MODEL_PATH: str(target.folder), T.EVAL_SEED: str(seed),
            T.DATASETS: ",".join(d.cfg.name for d in datasets)}
    for d in datasets:
        tags[f"{T.DATASET_SHA256}.{d.cfg.name}"] = d.sha256
    if len(datasets) == 1:
        tags[T.DATASET_SHA256] = datasets[0].sha256
    source = target.source
    if source is not None:
        tags.update({T.SOURCE_RUN: source.run_id, T.CHECKPOINT_STEP: str(source.step)})
    tracker.set_tags(tags)
    tracker.log_metrics(source.step if source is not None else 0, mlflow_metrics(summary))
    for path in files:
        tracker.log_artifact(path, "eval")
    tracker.finish("FINISHED")
    if source is not None:  # link back: a tag on the training run names this evaluation
        try:
            tracker.client.set_tag(source.run_id, f"{T.EVAL_LINK}{tracker.run_id}",
                                   f"step {source.step}: {','.join(d.cfg.name for d in datasets)}")
        except Exception:  # the training run is not in this store: the eval run still names it
            pass
    return tracker.run_id
