"""YAML text -> plain values, for experiment, group and sweep files and override values. PyYAML's safe loader, minus
two things it accepts silently or at any cost: a key given twice in one mapping (it keeps the last and drops the
earlier block without a word) and aliases that expand a document without bound (nine lines of nine aliases each,
"billion laughs", make 10^9 values, which building any config or message from them exhausts memory on)."""

from __future__ import annotations

import sys
from typing import Any

import yaml

from rlvrlab.errors import ConfigError

# Values a document may stand for once its aliases are expanded. A shipped experiment, group or sweep file holds
# at most a few hundred; a larger document is only reachable through aliases.
MAX_VALUES = 100_000
_MERGE = "tag:yaml.org,2002:merge"  # `<<: *base`: its keys may be given again below it, by design


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, again: int):
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}  # key -> the line of its first appearance
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
                seen[key] = line
            except TypeError:  # an unhashable key: the base constructor refuses it in its own words
                continue
        return super().construct_mapping(node, deep=deep)


def load(text: str, where: str) -> Any:
    """The value of the YAML document `text` (None when empty). yaml.YAMLError for text that is not YAML;
    ConfigError, naming `where`, for a key given twice in one mapping or aliases that expand past MAX_VALUES."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {}, set(), where)
        if size > MAX_VALUES:
            raise ConfigError(f"{where}: its aliases (*name) expand it to {size} values, more than the {MAX_VALUES} "
                              "a config may hold; write the values out instead of repeating aliases")
        return loader.construct_document(node)
    except _DuplicateKey as duplicate:
        lines = f"lines {duplicate.first} and {duplicate.again}" if duplicate.first != duplicate.again else \
            f"line {duplicate.first}"
        raise ConfigError(f"{where}: key {duplicate.key!r} is given twice in one mapping ({lines}); YAML would keep "
                          "only the last and drop the other without a word: remove one or merge them") from None
    except RecursionError:
        raise ConfigError(f"{where}: its values nest too deeply to read; flatten them") from None
    except ValueError as error:  # a scalar YAML resolves but cannot build: a 5000-digit integer, a 13th month
        problem = str(error).split(";")[0].split(": use sys.")[0]
        if "integer string conversion" in problem:
            most = getattr(sys, "get_int_max_str_digits", lambda: 4300)()  # Python >= 3.11 limits int("...")
            problem = f"a number of more than {most} digits, larger than any value takes"
        raise ConfigError(f"{where}: cannot read it ({problem}); quote it if it is text, or fix it") from None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, memo: dict[int, int], open_: set[int], where: str) -> int:
    """Values `node` stands for with every alias expanded: linear in the distinct nodes (memo), whatever the
    expansion. An alias to a value that holds it (`&a [*a]`) expands without end and is refused."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in open_:
        raise ConfigError(f"{where}: an alias (*name) refers to the value that holds it, which never ends; write the "
                          "values out")
    open_.add(key)
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, memo, open_, where) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo, open_, where) + _expanded_size(v, memo, open_, where)
                       for k, v in node.value)
    else:
        size = 1
    open_.discard(key)
    memo[key] = size
    return size
