"""Strict readers for every input file: UTF-8 text, YAML and JSON that refuse what would be silently
misread.

What a plain `yaml.safe_load` / `json.loads` accepts and this refuses, each with one line naming the
file, the key and the line(s):

- bytes that are not UTF-8 (a UTF-8 byte-order mark is allowed and dropped);
- a key given twice in one mapping (YAML and JSON keep the last one without a word);
- a YAML document whose aliases expand to more than `MAX_EXPANDED_NODES` nodes (an "alias bomb":
  nine anchors of nine aliases each expand to 9**9 nodes while the file stays a few hundred
  bytes) or uses more than `MAX_ALIASES` aliases;
- integers beyond int64 (the model's array columns);
- non-finite numbers: YAML `.inf` / `.nan`, JSON `Infinity` / `NaN` / `1e999` (a plan cannot use
  them, and strict JSON has no way to write them back).

YAML: PyYAML's SafeLoader (YAML 1.1) with `construct_mapping` checking keys and the composed node
graph measured before anything is constructed; libyaml (PyYAML's C parser) reads the documents
it parses cleanly and that nest at most `C_MAX_DEPTH` deep, and the pure-Python reader everything
else, so every refusal is worded by one reader (tests/test_strict_yaml.py compares the two).
JSON: the standard library's decoder with `object_pairs_hook` (duplicates) and `parse_constant` /
`parse_float` (non-finite numbers).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from planner.core.errors import PlanInputError

MAX_ALIASES = 1_000
"""Most aliases (`*name`) a YAML input may use; hand-written configs use a handful."""
INT64_MAX = 2**63 - 1
"""Largest integer an input file may hold: the model's array columns are int64 (numpy)."""
MAX_EXPANDED_NODES = 100_000
"""Most nodes a YAML document may have once every alias is expanded (the biggest shipped profile
has well under a thousand)."""


def read_text(path: Path, field: str) -> str:
    """A file's text as UTF-8, or a one-line PlanInputError naming the file (and the bad byte)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise PlanInputError(field, f"{path}: no such file") from None
    except IsADirectoryError:
        raise PlanInputError(field, f"{path}: is a directory, expected a file") from None
    except OSError as err:
        raise PlanInputError(field, f"{path}: cannot read ({err.strerror})") from None
    return decode_utf8(raw, str(path), field)


def decode_utf8(raw: bytes, origin: str, field: str) -> str:
    """Decode bytes as UTF-8 (BOM dropped); a bad byte is named with its line and offset."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise PlanInputError(
            field, f"{origin}: not UTF-8 text (byte 0x{raw[err.start]:02x} at line {line}, "
                   f"offset {err.start}); save the file as UTF-8") from None


# --------------------------------------------------------------------------- YAML


class _StrictConstructor(yaml.constructor.SafeConstructor):
    """SafeConstructor that rejects duplicate keys, integers beyond int64 and non-finite floats,
    naming their lines. Shared by both loaders below: construction is the same Python code
    whichever parser composed the nodes."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges; keys it brings may be overridden on purpose
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise _Refused(f"key {key!r} given twice (lines {seen[key]} and {line}); "
                               "keep one")
            if isinstance(key, (str, int, float, bool)):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        value = super().construct_yaml_int(node)
        if abs(value) > INT64_MAX:
            raise _Refused(f"{node.value} at line {node.start_mark.line + 1} does not fit a 64-bit "
                           f"integer (at most {INT64_MAX})")
        return value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise _Refused(f"non-finite number {node.value!r} at line {node.start_mark.line + 1}; "
                           "give a finite number")
        return value


_StrictConstructor.add_constructor("tag:yaml.org,2002:float", _StrictConstructor.construct_yaml_float)
_StrictConstructor.add_constructor("tag:yaml.org,2002:int", _StrictConstructor.construct_yaml_int)
_StrictConstructor.add_constructor("tag:yaml.org,2002:map", _StrictConstructor.construct_yaml_map)


class _StrictLoader(_StrictConstructor, yaml.SafeLoader):
    """PyYAML's pure-Python SafeLoader with the strict constructor: the reference reader, whose
    answer (value or one-line refusal) is the answer for every document."""


_CSafeLoader: Any = getattr(yaml, "CSafeLoader", None)
"""PyYAML's libyaml binding, when PyYAML was built with it (the wheels are)."""
_StrictCLoader: Any = (type("_StrictCLoader", (_StrictConstructor, _CSafeLoader), {})
                       if _CSafeLoader is not None else None)
"""The same constructor over libyaml's parser and composer: 8x faster on the shipped YAML files
(0.36 ms each instead of 3.07 ms; docs/cli_latency.md, issue 9). Used only for documents that libyaml parses without an
error and that nest at most `C_MAX_DEPTH` deep (its composer recurses in C, unguarded: 50,000
nested brackets crash the interpreter); anything else, and any refusal, is read again by
`_StrictLoader`, so every error message is the pure-Python reader's."""
C_MAX_DEPTH = 64
"""Deepest nesting read with libyaml (the shipped files nest at most 3 deep). At this depth the
pure-Python reader is far from Python's recursion limit too, so both readers accept it."""


class _Refused(Exception):
    """Raised inside the loader; `parse_yaml` turns it into a PlanInputError."""


def _expanded_size(node: yaml.Node, memo: dict[int, int], limit: int) -> int:
    """Nodes in the tree once every alias is expanded; linear in the distinct nodes."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = limit + 1  # a node reached again while being measured: a cycle, refuse
    size = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            size += _expanded_size(child, memo, limit)
            if size > limit:
                break
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            size += _expanded_size(key, memo, limit) + _expanded_size(value, memo, limit)
            if size > limit:
                break
    memo[id(node)] = size
    return size


def _count_aliases(text: str) -> int:
    """Alias events in the document (parsing events only, nothing is constructed)."""
    return sum(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=yaml.SafeLoader))


def _libyaml_shape(text: str) -> tuple[int, int] | None:
    """(alias events, deepest nesting) from libyaml's event stream (flat: no recursion), or None
    when libyaml is absent or the text does not parse (the pure-Python reader then says why)."""
    if _CSafeLoader is None:
        return None
    aliases = depth = deepest = 0
    try:
        for event in yaml.parse(text, Loader=_CSafeLoader):
            if isinstance(event, yaml.AliasEvent):
                aliases += 1
            elif isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                deepest = max(deepest, depth)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return None
    return aliases, deepest


def _load(text: str, loader_class: Any, aliases: int) -> Any:
    """Compose, measure and construct one document with `loader_class`."""
    if aliases > MAX_ALIASES:
        raise _Refused(f"more than {MAX_ALIASES} aliases; expand them or split the file")
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES:
            raise _Refused(f"aliases expand to more than {MAX_EXPANDED_NODES:,} nodes "
                           "(an alias bomb?)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _load_fast(text: str) -> tuple[bool, Any]:
    """(True, value) when libyaml reads the document without any complaint, else (False, None)."""
    shape = _libyaml_shape(text)
    if shape is None or shape[1] > C_MAX_DEPTH:
        return False, None
    try:
        return True, _load(text, _StrictCLoader, shape[0])
    except Exception:  # any refusal or error: the reference reader reads it again and words it
        return False, None


def parse_yaml(text: str, origin: str, field: str) -> Any:
    """One YAML document under the rules above; every refusal is one line naming `origin`."""
    done, value = _load_fast(text)
    if done:
        return value
    try:
        return _load(text, _StrictLoader, _count_aliases(text) if "*" in text else 0)
    except _Refused as err:
        raise PlanInputError(field, f"{origin}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise PlanInputError(field, f"{origin}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise PlanInputError(field, f"{origin}: nested too deeply") from None


def read_yaml(path: Path, field: str) -> Any:
    """`parse_yaml` of a file read with `read_text`."""
    return parse_yaml(read_text(path, field), str(path), field)


# --------------------------------------------------------------------------- JSON


def _key_lines(text: str, key: str) -> list[int]:
    """Lines where `"key":` appears (to name both places of a duplicate key)."""
    pattern = re.compile(re.escape(json.dumps(key)) + r"\s*:")
    return [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]


def parse_json(text: str, origin: str, field: str) -> Any:
    """A JSON document under the rules above; every refusal is one line naming `origin`."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                lines = _key_lines(text, key)[:2]
                where = f" (lines {lines[0]} and {lines[1]})" if len(lines) == 2 else ""
                raise _Refused(f"key {key!r} given twice{where}; keep one")
            out[key] = value
        return out

    def constant(name: str) -> float:
        raise _Refused(f"non-finite number {name}; give a finite number")

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise _Refused(f"number {literal} is out of range; give a finite number")
        return value

    def integer(literal: str) -> int:
        value = int(literal)
        if abs(value) > INT64_MAX:
            raise _Refused(f"{literal} does not fit a 64-bit integer (at most {INT64_MAX})")
        return value

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number,
                          parse_int=integer)
    except _Refused as err:
        raise PlanInputError(field, f"{origin}: {err}") from None
    except json.JSONDecodeError as err:
        raise PlanInputError(field, f"{origin}: malformed JSON at line {err.lineno}: {err.msg}") from None
    except RecursionError:
        raise PlanInputError(field, f"{origin}: nested too deeply") from None


def read_json(path: Path, field: str) -> Any:
    """`parse_json` of a file read with `read_text`."""
    return parse_json(read_text(path, field), str(path), field)
