"""The strict YAML reader reads with libyaml when it can (issue 9, command latency) and must give
exactly what PyYAML's pure-Python reader gives (planner/io/strict.py). The reference here is
PyYAML's own pure-Python parser and composer (`_StrictLoader`, the reader used before), not
code of this project: every shipped YAML file and a set of YAML 1.1 corner cases are read by
both, and the values must be equal, type for type. Documents libyaml must not read (malformed,
refused, too deep) are handed to the pure-Python reader, so their one-line errors are its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from planner.core.errors import PlanInputError
from planner.io import strict

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p for folder in ("hardware_profiles", "model_presets", "examples")
                 for p in (ROOT / folder).rglob("*.y*ml"))

needs_libyaml = pytest.mark.skipif(strict._StrictCLoader is None, reason="PyYAML built without libyaml")


def _typed(value: Any) -> Any:
    """The value with the type of every leaf made explicit (1, 1.0 and True compare equal)."""
    if isinstance(value, dict):
        return {_typed(k): _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def _both(text: str) -> tuple[Any, Any]:
    reference = strict._load(text, strict._StrictLoader, strict._count_aliases(text))
    done, fast = strict._load_fast(text)
    assert done, "libyaml should have read this document"
    return _typed(reference), _typed(fast)


def test_shipped_files_are_many():
    assert len(SHIPPED) >= 30


@needs_libyaml
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_file_reads_the_same_with_libyaml(path: Path):
    reference, fast = _both(path.read_text(encoding="utf-8"))
    assert fast == reference


CORNERS = {
    "yaml11-booleans": "a: yes\nb: No\nc: on\nd: OFF\ne: true\nf: y\n",
    "yaml11-ints": "a: 0o17\nb: 017\nc: 0x1F\nd: 1_000\ne: -0b101\nf: 1:30\ng: +12\n",
    "yaml11-floats": "a: 1.5e3\nb: 1e9\nc: .5\nd: 6.8523015e+5\ne: 1_0.5\nf: 190:20:30.15\n",
    "nulls-and-strings": "a: ~\nb: null\nc:\nd: 'yes'\ne: \"1.0\"\nf: !!str 12\ng: 'it''s'\n",
    "escapes-and-unicode": "a: \"tab\\tend \\u00e9 \\x41\"\nb: caf\u00e9 \u4e2d\u6587\n",
    "block-scalars": "a: |\n  line one\n  line two\nb: >\n  folded\n  text\n\nc: |-\n  kept\n",
    "anchors-merge": "base: &b {tp: 2, pp: 4}\nrun:\n  <<: *b\n  pp: 8\nlist: [*b, *b]\n",
    "timestamps": "d: 2001-12-14\nt: 2001-12-14t21:59:43.10-05:00\n",
    "nested-flow-block": "a:\n  - [1, 2, {b: [3, 4]}]\n  - c: {d: e}\n    f: [g, h]\n",
    "comments-and-document-marks": "%YAML 1.1\n---\n# comment\na: 1  # trailing\n...\n",
    "empty-document": "",
    "only-a-comment": "# nothing\n",
    "deep-but-allowed": "a: " + "[" * (strict.C_MAX_DEPTH - 1) + "]" * (strict.C_MAX_DEPTH - 1) + "\n",
}


@needs_libyaml
@pytest.mark.parametrize("text", CORNERS.values(), ids=CORNERS.keys())
def test_yaml_corner_cases_read_the_same_with_libyaml(text: str):
    reference, fast = _both(text)
    assert fast == reference


REFUSED = {
    # each: libyaml must not answer, so the error is worded by the pure-Python reader
    "duplicate-key": "a: 1\nb: 2\na: 3\n",
    "nonfinite": "a: .inf\n",
    "beyond-int64": "a: 9223372036854775808\n",
    "unclosed-flow": "a: [1, 2\n",
    "bad-indent": "a: 1\n b: 2\n",
    "two-documents": "a: 1\n---\nb: 2\n",
    "undefined-alias": "a: *nowhere\n",
    "tab-indent": "a:\n\t- 1\n",
    "control-char": "a: \x01\n",
    "unhashable-key": "? [1, 2]\n: pair\n",
    "alias-bomb": "a0: &a0 [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)),
    "many-aliases": "x: &x 1\ny: [" + ",".join(["*x"] * (strict.MAX_ALIASES + 1)) + "]\n",
}


@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_libyaml_leaves_every_refusal_to_the_reference_reader(text: str):
    assert strict._load_fast(text) == (False, None)
    with pytest.raises(PlanInputError) as info:
        strict.parse_yaml(text, "f.yaml", "job")
    assert str(info.value).count("\n") == 0 and "f.yaml" in str(info.value)


def test_deeper_than_the_libyaml_limit_is_read_by_the_reference_reader():
    text = "a: " + "[" * strict.C_MAX_DEPTH + "]" * strict.C_MAX_DEPTH + "\n"  # C_MAX_DEPTH + 1 deep
    assert strict._load_fast(text) == (False, None)
    assert _depth(strict.parse_yaml(text, "f.yaml", "job")) == strict.C_MAX_DEPTH + 1


def _depth(value: Any) -> int:
    """Nesting of mappings and lists: {} or [] is 1."""
    if not isinstance(value, (dict, list)):
        return 0
    return 1 + max(map(_depth, value.values() if isinstance(value, dict) else value), default=0)


def test_a_nesting_bomb_is_refused_not_crashed():
    """libyaml's composer recurses in C without a guard (50,000 brackets crash the interpreter);
    the event pass measures the depth first and such a document goes to the pure-Python reader."""
    with pytest.raises(PlanInputError, match="f.yaml: nested too deeply"):
        strict.parse_yaml("a: " + "[" * 50_000 + "]" * 50_000 + "\n", "f.yaml", "job")
