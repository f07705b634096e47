"""Layouts as a structure of arrays: one numpy column per `Layout` field, one row per layout.

The whole model (rules, parameters per stage, model states, buffers, activations, the busiest
node, the step-time terms) is written over these columns once; `zplan fit` evaluates a
length-1 instance (`LayoutColumns.from_layout`), `zplan sweep` millions of rows at once.
Literal fields are stored as integer codes (index into `OFFLOAD_TARGETS`, `RECOMPUTE_MODES`);
booleans as bool arrays. Fields that do not vary over a sweep (`flash_attention`, `tempo`,
`buffers`) are not columns: they travel with the evaluation as plain values.

Adding a layout field (e.g. an expert-parallel degree) is local: one entry in `FIELDS`, its
default in `from_layout` / `to_layout` follows from `Layout`, and the rules / formulas that
read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from planner.core.spec import CpCommType, EngineBuffers, Layout, OffloadTarget, RecomputeMode

OFFLOAD_TARGETS: tuple[OffloadTarget, ...] = ("none", "cpu", "nvme")
RECOMPUTE_MODES: tuple[RecomputeMode, ...] = ("none", "selective", "full", "every_k")

DP_ENGINES = ("deepspeed", "fsdp2")
CP_COMM_TYPES: tuple[CpCommType, ...] = ("p2p", "a2a")
CODED = {"offload_optimizer": OFFLOAD_TARGETS, "offload_params": OFFLOAD_TARGETS,
         "recompute": RECOMPUTE_MODES, "dp_engine": DP_ENGINES, "cp_comm_type": CP_COMM_TYPES}
"""Literal fields stored as the index of their value."""
FIELDS = ("tp", "pp", "dp", "virtual_stages", "zero_stage", "offload_optimizer", "offload_params",
          "recompute", "recompute_every_k", "sequence_parallel", "micro_batch", "grad_accum",
          "first_stage_layers", "last_stage_layers", "dp_engine", "cp", "cp_comm_type")
"""The varying Layout fields, each one column."""
OPTIONAL = ("first_stage_layers", "last_stage_layers")
"""Fields whose None is stored as 0 (a column may be absent: the even split)."""


class LayoutColumns(Mapping[str, np.ndarray]):
    """Columns named like `Layout`'s fields (a read-only mapping name -> 1-D array).

    A column may be missing while a search is still being built (the rules then apply only
    the rules whose fields are present, planner.core.rules.applicable); a formula reading `cp`
    or `cp_comm_type` takes `cols.get("cp", 1)` / `cols.get("cp_comm_type", 0)` (no context
    parallelism) when the column is absent."""

    __slots__ = ("_cols", "_n")

    def __init__(self, cols: Mapping[str, np.ndarray]) -> None:
        unknown = set(cols) - set(FIELDS)
        if unknown:
            raise KeyError(f"not a layout column: {', '.join(sorted(unknown))}")
        self._cols = {k: np.asarray(v) for k, v in cols.items()}
        lengths = {len(v) for v in self._cols.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths {sorted(lengths)}")
        self._n = lengths.pop() if lengths else 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self._cols[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def __len__(self) -> int:
        return self._n

    def take(self, index) -> LayoutColumns:
        """The rows at `index` (an index array, a slice or a boolean mask)."""
        out = LayoutColumns.__new__(LayoutColumns)  # same names, same lengths: no re-check
        out._cols = {k: v[index] for k, v in self._cols.items()}
        out._n = len(next(iter(out._cols.values()))) if out._cols else 0
        return out

    def with_columns(self, **cols: np.ndarray) -> LayoutColumns:
        return LayoutColumns({**self._cols, **cols})

    def row(self, i: int) -> dict[str, int]:
        """Row i as plain Python ints (codes for literal fields)."""
        return {k: int(v[i]) for k, v in self._cols.items()}

    @classmethod
    def from_layouts(cls, layouts: Iterable[Layout]) -> LayoutColumns:
        layouts = list(layouts)
        cols: dict[str, np.ndarray] = {}
        for name in FIELDS:
            values = [getattr(lay, name) for lay in layouts]
            if name in OPTIONAL:
                values = [v or 0 for v in values]
            if name in CODED:
                values = [CODED[name].index(v) for v in values]
            dtype = bool if name == "sequence_parallel" else np.int64
            cols[name] = np.array(values, dtype=dtype)
        return cls(cols)

    @classmethod
    def from_layout(cls, layout: Layout) -> LayoutColumns:
        """The length-1 instance of one typed layout."""
        return cls.from_layouts([layout])

    def to_layout(self, i: int, *, flash_attention: bool = True,
                  buffers: EngineBuffers | None = None) -> Layout:
        """The typed Layout of row i (fields missing from the columns take Layout's defaults)."""
        fields: dict[str, object] = {}
        for name, col in self._cols.items():
            value = col[i]
            if name in CODED:
                fields[name] = CODED[name][int(value)]
            elif name == "sequence_parallel":
                fields[name] = bool(value)
            elif name in OPTIONAL:
                fields[name] = int(value) or None
            else:
                fields[name] = int(value)
        extra: dict[str, object] = {"flash_attention": flash_attention}
        if buffers is not None:
            extra["buffers"] = buffers
        return Layout(**fields, **extra)


# --------------------------------------------------------------------------- grouping


def _unique_ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` for non-negative integers: with a presence
    table (linear, no sort) when the range is small, else `np.unique`."""
    size = int(values.max(initial=0)) + 1
    if size > 4 * values.size + 4096:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    seen = np.zeros(size, dtype=bool)
    seen[values] = True
    return np.flatnonzero(seen), (np.cumsum(seen) - 1)[values]


def group_rows(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows of the stacked non-negative integer keys, in `np.unique`'s sorted order, and
    each candidate's row index. The columns are packed into one int64 in mixed radix (radix:
    the column's largest value + 1) and the packed values grouped. When that range would be
    wide, each column is first replaced by its rank among its distinct values."""
    n = len(keys[0])
    keys = [np.asarray(key, dtype=np.int64) for key in keys]
    radix = [int(key.max(initial=0)) + 1 for key in keys]
    values = None  # column values by rank, when ranked
    if math.prod(radix) > 4 * n + 4096:
        values, keys = zip(*(_unique_ints(key) for key in keys))
        radix = [max(len(v), 1) for v in values]
    packed = np.zeros(n, dtype=np.int64)
    for key, base in zip(keys, radix):
        packed = packed * base + key
    uniq, inverse = _unique_ints(packed)
    columns = []
    for i in reversed(range(len(keys))):  # unpack the mixed radix, last key first
        uniq, digit = np.divmod(uniq, radix[i])
        columns.append(digit if values is None else values[i][digit])
    return np.stack(columns[::-1], axis=1).astype(np.int64), inverse.astype(np.int64)


def representatives(inverse: np.ndarray, groups: int) -> np.ndarray:
    """One candidate index per group (any member: every member gives the same value)."""
    rep = np.zeros(groups, dtype=np.int64)
    rep[inverse] = np.arange(len(inverse), dtype=np.int64)
    return rep
