"""Compose a RunConfig from an experiment file, its group files and `key=value` overrides.

Precedence, lowest first: schema defaults < group files < experiment file body < CLI field overrides.
A CLI `group=name` replaces the experiment's choice for that group before any field is set.

    experiments/<experiment>.yaml         defaults: {algorithm: grpo, model: tiny, dataset: countdown}
                                          then top-level overrides, e.g. rollout: {group_size: 8}
    experiments/algorithms/<name>.yaml    the algorithm section's fields, no wrapper key (same for models/,
    experiments/models/<name>.yaml        datasets/)
"""

import copy
import dataclasses
import difflib
import functools
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union, get_args, get_type_hints

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlvrlab.config.rules import not_utf8, require_utf8, show, unknown, validate
from rlvrlab.config.schema import RunConfig
from rlvrlab.config.shipped import shipped_dir
from rlvrlab.config.yamlfile import load as load_yaml
from rlvrlab.errors import ConfigError, RlvrlabError

# config section -> its folder of group files
GROUP_FOLDERS = {"algorithm": "algorithms", "model": "models", "dataset": "datasets"}

# The only fields that may read the environment (${oc.env:VAR}): where things are. Any other field's value is copied
# into the run's records (MLflow params, config.yaml), where a token taken from the environment would be readable by
# everyone who can read the store; MLflow reads its own credentials (MLFLOW_TRACKING_TOKEN, ...) by itself.
ENV_FIELDS = ("output_dir", "dataset.path", "model.path")
_READS_ENV = re.compile(r"\$\{\s*oc\.env\s*:")

# Fields that do not change what is trained or how, so runs that differ only in them share a hash (seeds of
# one configuration are grouped by it); a dotted name is a field of a section.
NOT_HASHED = ("seed", "output_dir", "tracking", "experiment", "trainer.dist_timeout_minutes")


_TYPE_NAMES = {
    float: "a float",
    int: "an integer",
    bool: "true or false",
    str: "a string",
    list[float]: "a list of numbers",
    list[str]: "a list of names, e.g. [q_proj,v_proj]",
    list[list[str]]: "a list of [question, answer] pairs",
    dict[str, Any]: "a mapping of config.json keys to values",
}


def _schema_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> type for every leaf field of the dataclass `cls`."""
    fields: dict[str, Any] = {}
    for name, kind in get_type_hints(cls).items():
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            fields.update(_schema_fields(kind, f"{prefix}{name}."))
        else:
            fields[f"{prefix}{name}"] = kind
    return fields


FIELD_TYPES = _schema_fields(RunConfig)
# every section a YAML mapping may give, nested ones (model.lora) included: a run's config.yaml writes them as mappings
SECTIONS = tuple(dict.fromkeys(key.rpartition(".")[0] for key in FIELD_TYPES if "." in key))


@dataclasses.dataclass(frozen=True)
class FileCheck:
    file: Path
    error: Optional[str]  # None when the file composes into a valid RunConfig


def experiments_dir() -> Path:
    """`$RLVRLAB_EXPERIMENTS_DIR`, else the shipped experiments/ folder (the checkout's, or the installed one)."""
    return shipped_dir("experiments", "RLVRLAB_EXPERIMENTS_DIR")


def compose(experiment: Union[str, Path, None] = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Build and validate the RunConfig of `experiment` (a name in experiments_dir(), a YAML path, or None for
    "default") with `overrides` such as "algorithm=ucpo" or "algorithm.tau=0.3"."""
    file = _experiment_file(experiment)
    body = _load_mapping(file)
    groups = _group_choices(body.pop("defaults", {}), file)
    fields: list[tuple[str, Any]] = []
    for text in overrides:
        key, raw = _split_override(text)
        if key in GROUP_FOLDERS:
            groups[key] = raw
        else:
            fields.extend(_leaves(key, _parse_value(key, raw)))

    cfg = copy.deepcopy(_schema())
    layers: dict[str, int] = {}  # dotted key -> precedence layer that set it last
    for group, name in groups.items():
        group_file = _group_file(file.parent, group, name)
        _assign(cfg, _leaves(group, _load_mapping(group_file)), source=group_file, layer=1, layers=layers)
    body_leaves = (leaf for key, value in body.items() for leaf in _leaves(str(key), value))
    _assign(cfg, body_leaves, source=file, layer=2, layers=layers)
    _assign(cfg, fields, source=None, layer=3, layers=layers)
    run = _to_object(cfg)
    validate(run, layers)
    return run


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """RunConfig as an OmegaConf structured config of its defaults, built once per process: compose works on a deep
    copy (2 ms) instead of building it again (10 ms of a ~35 ms compose here; a sweep composes every seed run)."""
    return OmegaConf.structured(RunConfig)


def config_hash(cfg: RunConfig) -> str:
    """12 hex digits of sha256 over the resolved config without NOT_HASHED; independent of key order.

    model.warm_start_seed is left out where it changes nothing: off the tiny tier, and at 0, the warm start every
    tiny run had before the key existed. Those configs hash as they did then, so their seeds group with earlier
    runs'; null (the run's seed) is another design and hashes apart."""
    science = dataclasses.asdict(cfg)
    for key in NOT_HASHED:
        *sections, name = key.split(".")
        fields = science
        for section in sections:
            fields = fields[section]
        del fields[name]
    if cfg.model.tier != "tiny" or cfg.model.warm_start_seed == LEGACY_WARM_START_SEED:
        del science["model"]["warm_start_seed"]
    return hashlib.sha256(json.dumps(science, sort_keys=True).encode()).hexdigest()[:12]


# The tiny tier's warm start seed of every run made before model.warm_start_seed existed.
LEGACY_WARM_START_SEED = 0


def warm_start_seed(cfg: RunConfig) -> int:
    """The seed of the tiny tier's initial model: model.warm_start_seed, or the run's seed when it is null."""
    return cfg.seed if cfg.model.warm_start_seed is None else cfg.model.warm_start_seed


def legacy_overrides(run_config: Path) -> list[str]:
    """Overrides that give a run's saved config.yaml the meaning it had when it was written: one saved before
    model.warm_start_seed existed started from warm start seed 0, which its resumed run must rebuild (the
    reference model of a KL penalty is a copy of it) rather than the run seed's."""
    saved = _load_mapping(run_config)
    model = saved.get("model")
    if isinstance(model, dict) and "warm_start_seed" not in model:
        return [f"model.warm_start_seed={LEGACY_WARM_START_SEED}"]
    return []


def to_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML, in schema order (inf is written .inf)."""
    return yaml_and_tree(cfg)[0]


def yaml_and_tree(cfg: RunConfig) -> tuple[str, dict]:
    """(to_yaml(cfg), the same config as nested plain dicts): OmegaConf's own YAML of the structured config
    (`omegaconf_yaml_and_tree`), written from dataclasses.asdict through an untyped OmegaConf container, which
    skips OmegaConf.structured's validation of the whole schema (the config is already validated), about half its
    cost. A config holding anything but plain values and lists (which a schema change could bring) takes the
    structured path; tests/config/test_config.py compares both on every shipped experiment and algorithm."""
    try:
        tree = _plain(dataclasses.asdict(cfg))
    except _NotPlain:
        return omegaconf_yaml_and_tree(cfg)
    return OmegaConf.to_yaml(OmegaConf.create(tree)), tree


def omegaconf_yaml_and_tree(cfg: RunConfig) -> tuple[str, dict]:
    conf = OmegaConf.structured(cfg)
    tree = OmegaConf.to_container(conf, resolve=True)
    assert isinstance(tree, dict)
    return OmegaConf.to_yaml(conf), tree


class _NotPlain(Exception):
    pass


def _plain(value: Any) -> Any:
    """`value` with tuples as lists (as OmegaConf's container has them); _NotPlain for anything in it that is not a
    str, int, float, bool, None, dict, list or tuple."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if value is None or type(value) in (str, int, float, bool):
        return value
    raise _NotPlain(type(value).__name__)


def check_files() -> list[FileCheck]:
    """Compose every experiment file, and every group file into the default experiment (or, when they do not
    fit together, such as the toy model and a text dataset, into any other experiment file it fits)."""
    folder = experiments_dir()
    experiments = sorted(folder.glob("*.yaml"))
    checks = [_check(path, path, ()) for path in experiments]
    for group, subfolder in GROUP_FOLDERS.items():
        for path in sorted((folder / subfolder).glob("*.yaml")):
            check = _check(path, None, [f"{group}={path.stem}"])
            others = (_check(path, experiment, [f"{group}={path.stem}"]) for experiment in experiments)
            if check.error and any(other.error is None for other in others):
                check = FileCheck(path, None)
            checks.append(check)
    return checks


def _check(file: Path, experiment: Optional[Path], overrides: Sequence[str]) -> FileCheck:
    try:
        compose(experiment, overrides)
    except ConfigError as error:
        return FileCheck(file, str(error))
    return FileCheck(file, None)


def _experiment_file(experiment: Union[str, Path, None]) -> Path:
    text = str(experiment or "default")
    require_utf8(text, "the experiment (file) name")
    if isinstance(experiment, Path) or text.endswith((".yaml", ".yml")) or os.sep in text:
        if Path(text).is_dir():
            raise ConfigError(folder_given("experiment file", Path(text)))
        if not Path(text).is_file():
            raise ConfigError(f"experiment file {text} does not exist; give an existing .yaml file or a name")
        return Path(text)
    folder = experiments_dir()
    path = folder / f"{text}.yaml"
    if not path.is_file():
        if Path(text).is_dir():  # a folder of that name here, and no experiment of that name
            raise ConfigError(folder_given("experiment file", Path(text)))
        raise unknown("experiment", text, _yaml_names(folder), where=_display(folder))
    return path


def folder_given(what: str, folder: Path) -> str:
    """The message for a folder given where a YAML file belongs, naming the YAML files in it."""
    inside = sorted(p.name for p in folder.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))
    hint = f" (it holds {', '.join(inside[:4])}{' ...' if len(inside) > 4 else ''})" if inside else ""
    return f"{what} {folder} is a folder, not a YAML file; give a .yaml file in it{hint}"


def _group_file(root: Path, group: str, name: str) -> Path:
    """A group's file next to the experiment file (root/algorithms/NAME.yaml), else in experiments_dir(): an
    experiment file kept elsewhere still composes from the shipped groups."""
    folders = list(dict.fromkeys([root / GROUP_FOLDERS[group], experiments_dir() / GROUP_FOLDERS[group]]))
    for folder in folders:
        path = folder / f"{name}.yaml"
        if path.is_file():
            return path
    names = sorted({n for folder in folders for n in _yaml_names(folder)})
    raise unknown(group, name, names, where=" or ".join(_display(f) for f in folders))


def _group_choices(defaults: Any, file: Path) -> dict[str, str]:
    if not isinstance(defaults, dict) or not all(isinstance(name, str) for name in defaults.values()):
        raise ConfigError(
            f"defaults in {_display(file)} must map groups to file names, e.g. "
            "defaults: {algorithm: grpo, model: tiny, dataset: countdown}"
        )
    for group in defaults:
        if group not in GROUP_FOLDERS:
            raise unknown("group", group, GROUP_FOLDERS, where=f"defaults of {_display(file)}")
    return dict(defaults)


def _split_override(text: str) -> tuple[str, str]:
    key, sep, raw = text.partition("=")
    # before any message quotes it: a value that is not UTF-8 text could not even be printed
    if not_utf8(key):
        require_utf8(key, "the key of an override")
    require_utf8(raw, key.strip())
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not key=value; write e.g. algorithm.tau=0.3 or algorithm=ucpo")
    return key.strip(), raw.strip()


def _parse_value(key: str, raw: str) -> Any:
    """Values are YAML scalars or flow collections: 0.3, inf, .inf, null, true, [0.9,0.99]. A string field
    keeps the text as typed where YAML would read something else, so `dataset.template=Q: {prompt}` works."""
    text_field = FIELD_TYPES.get(key) in (str, Optional[str])
    try:
        value = load_yaml(raw, f"{key}={_shortened(raw)}")
    except (yaml.YAMLError, ConfigError) as error:  # ConfigError: a key given twice, aliases without bound
        if text_field:
            return raw
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{key}={raw}: not a YAML value ({_yaml_problem(error)}); quote it or fix it") from error
    return raw if text_field and not isinstance(value, (str, type(None))) else value


def _load_mapping(path: Path) -> dict[str, Any]:
    try:
        content = load_yaml(path.read_text(encoding="utf-8"), _display(path))
    except UnicodeDecodeError as error:
        raise ConfigError(f"{_display(path)} is not a text file (byte {error.start} is not UTF-8); give a YAML "
                          "file") from None
    except IsADirectoryError:
        raise ConfigError(f"{_display(path)} is a folder, not a YAML file") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{_display(path)} is not valid YAML: {_yaml_problem(error)}") from error
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise ConfigError(f"{_display(path)} must hold key: value lines, not a {type(content).__name__}")
    return content


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        return f"{error.problem} at line {error.problem_mark.line + 1}"
    return " ".join(str(error).split())


def _leaves(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """Flatten a mapping given for a section into (dotted key, value) pairs; anything else is one leaf."""
    if key in SECTIONS and isinstance(value, dict):
        for name, inner in value.items():
            yield from _leaves(f"{key}.{name}", inner)
    else:
        yield key, value


def _assign(
    cfg: DictConfig, leaves: Iterable[tuple[str, Any]], source: Optional[Path], layer: int, layers: dict[str, int]
) -> None:
    where = f" in {_display(source)}" if source else ""
    for key, value in leaves:
        _require_utf8_leaf(key, value, where)
        if key not in FIELD_TYPES:
            raise _unknown_key(key, where)
        if key not in ENV_FIELDS and _reads_env(value):
            raise ConfigError(f"{key}={show(value)}{where}: ${{oc.env:...}} would copy an environment variable into "
                              "the run's records (MLflow params, config.yaml), readable by everyone who can read the "
                              f"store; only {', '.join(ENV_FIELDS)} may read the environment: write the value itself")
        try:
            OmegaConf.update(cfg, key, value, merge=False)
        except OmegaConfBaseException as error:
            raise ConfigError(f"{key}={show(value)}{where}: expected {_type_name(FIELD_TYPES[key])}") from error
        layers[key] = layer


def _require_utf8_leaf(key: str, value: Any, where: str) -> None:
    """A key or text value of a file or override that is not UTF-8 text (a YAML "\\udcff" escape), refused before
    a message quotes it; rlvrlab.config.rules checks the composed config's text again (interpolations included)."""
    for text, what in _strings(key, value):
        require_utf8(text, f"{what}{where}")


def _strings(key: str, value: Any) -> Iterator[tuple[str, str]]:
    if not_utf8(key):
        yield key, "a key"
        return
    if isinstance(value, str):
        yield value, key
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(key, item)
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _strings(key, name)
            yield from _strings(key, item)


def _shortened(text: str, keep: int = 60) -> str:
    return text if len(text) <= keep else f"{text[:keep]}...({len(text)} characters)"


def _reads_env(value: Any) -> bool:
    if isinstance(value, str):
        return _READS_ENV.search(value) is not None
    if isinstance(value, (list, tuple)):
        return any(_reads_env(item) for item in value)
    if isinstance(value, dict):
        return any(_reads_env(k) or _reads_env(v) for k, v in value.items())
    return False


def _unknown_key(key: str, where: str) -> ConfigError:
    if key in SECTIONS:
        example = next(name for name in FIELD_TYPES if name.startswith(f"{key}."))
        return ConfigError(f"{key}{where} is a section, not a value; set its fields, e.g. {example}=...")
    section, _, name = key.rpartition(".")
    if section in SECTIONS:
        # match the field name alone: the shared "section." prefix would make every field look close
        fields = [f.removeprefix(f"{section}.") for f in FIELD_TYPES if f.startswith(f"{section}.")]
        close = [f"{section}.{match}" for match in difflib.get_close_matches(name, fields, n=1)]
    else:
        section = "the top level"
        fields = [*(s for s in SECTIONS if "." not in s), *(f for f in FIELD_TYPES if "." not in f)]
        close = difflib.get_close_matches(key, [*FIELD_TYPES, *SECTIONS], n=1)
    if close:
        return ConfigError(f"unknown key {key!r}{where}; did you mean {close[0]!r}?")
    return ConfigError(f"unknown key {key!r}{where}; {section} has: {', '.join(fields)}")


def _type_name(kind: Any) -> str:
    if type(None) in get_args(kind):
        inner = next(arg for arg in get_args(kind) if arg is not type(None))
        return f"{_TYPE_NAMES[inner]} or null"
    return _TYPE_NAMES[kind]


def _to_object(cfg: DictConfig) -> RunConfig:
    try:
        built = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as error:
        # Only interpolations such as ${seed} can fail here; every value was type-checked when assigned.
        raise ConfigError(f"cannot resolve {error.full_key}: {str(error).splitlines()[0]}") from error
    assert isinstance(built, RunConfig)
    return built


def _yaml_names(folder: Path) -> list[str]:
    return sorted(path.stem for path in folder.glob("*.yaml"))


def _display(path: Path) -> str:
    """`path` relative to the working directory when it is below it, so messages stay short."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def check_arguments(argv: list[str]) -> None:
    """Every command-line argument is UTF-8 text, or one line naming it: Python turns a byte of argv that is not
    UTF-8 (Latin-1 from another terminal's encoding) into a lone surrogate, which no message, log, YAML file or
    MLflow store can hold (`rlvrlab config show` failed with a UnicodeEncodeError traceback). Checked once for every
    command, before any of them reads its arguments; composition checks the config's text again (files included)."""
    for index, arg in enumerate(argv):
        problem = not_utf8(arg)
        if problem is None:
            continue
        name, equals, value = arg.partition("=")
        before = argv[index - 1] if index > 0 else ""
        if before.startswith("-") and "=" not in before and not not_utf8(before):
            what = f"the value of {before}"  # --option VALUE
        elif equals and not not_utf8(name):
            what, problem = f"the value of {name}", not_utf8(value)  # an override KEY=VALUE or --option=VALUE
        else:
            what = f"argument {index + 1}"
        raise RlvrlabError(f"{what}: {problem}, as from a terminal or file in another encoding (Latin-1); retype it "
                           "in UTF-8")
