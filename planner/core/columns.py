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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from planner.core.spec import CpCommType, EngineBuffers, Layout, OffloadTarget, RecomputeMode

OFFLOAD_TARGETS: tuple[OffloadTarget, ...] = ("none", "cpu", "nvme")
RECOMPUTE_MODES: tuple[RecomputeMode, ...] = ("none", "selective", "full", "every_k", "block")

DP_ENGINES = ("deepspeed", "fsdp2")
CP_COMM_TYPES: tuple[CpCommType, ...] = ("p2p", "a2a")
CODED = {"offload_optimizer": OFFLOAD_TARGETS, "offload_params": OFFLOAD_TARGETS,
         "recompute": RECOMPUTE_MODES, "dp_engine": DP_ENGINES, "cp_comm_type": CP_COMM_TYPES}
"""Literal fields stored as the index of their value."""
FIELDS = ("tp", "pp", "dp", "ep", "virtual_stages", "zero_stage", "offload_optimizer", "offload_params",
          "recompute", "recompute_every_k", "recompute_num_layers", "sequence_parallel", "micro_batch",
          "grad_accum",
          "first_stage_layers", "last_stage_layers", "dp_engine", "cp", "cp_comm_type", "dp_shard")
"""The varying Layout fields, each one column."""
OPTIONAL = ("first_stage_layers", "last_stage_layers", "dp_shard", "recompute_num_layers")
"""Fields whose None is stored as 0 (a column may be absent: the even split, the whole dp
group, no block recompute; the sweep adds `dp_shard` unless `--dp-shard none`, 0 on every row
sharding over its whole dp group, and `recompute_num_layers` only when block recompute is pinned)."""


def _check_names(names: Iterable[str]) -> None:
    unknown = set(names) - set(FIELDS)
    if unknown:
        raise KeyError(f"not a layout column: {', '.join(sorted(unknown))}")


class LayoutColumns(Mapping[str, np.ndarray]):
    """Columns named like `Layout`'s fields (a read-only mapping name -> 1-D array).

    A column may be missing while a search is still being built (the rules then apply only
    the rules whose fields are present, planner.core.rules.applicable); a formula reading `cp`
    or `cp_comm_type` takes `cols.get("cp", 1)` / `cols.get("cp_comm_type", 0)` (no context
    parallelism) when the column is absent."""

    __slots__ = ("_cols", "_n", "_pending")

    def __init__(self, cols: Mapping[str, np.ndarray]) -> None:
        _check_names(cols)
        self._cols: dict[str, np.ndarray | None] = {k: np.asarray(v) for k, v in cols.items()}
        self._pending: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        lengths = {len(v) for v in self._cols.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths {sorted(lengths)}")
        self._n = lengths.pop() if lengths else 0

    def __getitem__(self, name: str) -> np.ndarray:
        column = self._cols[name]
        if column is None:  # gathered on first read (`take`)
            source, rows = self._pending.pop(name)
            column = self._cols[name] = source.take(rows)
        return column

    def __contains__(self, name: object) -> bool:
        return name in self._cols  # without gathering (Mapping's default reads the column)

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def __len__(self) -> int:
        return self._n

    def take(self, index) -> LayoutColumns:
        """The rows at `index` (an index array, a slice or a boolean mask). A mask becomes its
        row indices once. Under an index, a column is gathered (`ndarray.take`: numpy's boolean
        and fancy indexing cost 1.3-4x as much per column) only when it is first read: a sweep
        takes its candidates' rows several times and reads some columns at every row, others
        at a few (`to_layout`'s rows); a column not gathered yet keeps its source and the
        composed row index (one `take` for all the columns sharing an index)."""
        if isinstance(index, slice):  # views: the gathered columns are sliced at once
            n = len(range(self._n)[index])
            cols = {k: None if v is None else v[index] for k, v in self._cols.items()}
            pending: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            def at_rows(at: np.ndarray) -> np.ndarray:
                return at[index]
        else:
            index = np.asarray(index)
            if index.dtype == bool and index.shape != (self._n,):
                raise IndexError(f"a mask of shape {index.shape} for {self._n} rows")
            rows = np.flatnonzero(index) if index.dtype == bool else index
            n, cols = len(rows), dict.fromkeys(self._cols)
            pending = {k: (v, rows) for k, v in self._cols.items() if v is not None}
            def at_rows(at: np.ndarray) -> np.ndarray:
                return at.take(rows)
        composed: dict[int, np.ndarray] = {}  # one composed index per shared row index
        for name, (source, at) in self._pending.items():
            if id(at) not in composed:
                composed[id(at)] = at_rows(at)
            pending[name] = (source, composed[id(at)])
        out = LayoutColumns.__new__(LayoutColumns)  # same names: no re-check
        out._cols, out._pending, out._n = cols, pending, n
        return out

    def with_columns(self, **cols: np.ndarray) -> LayoutColumns:
        """These columns added (or replaced); the others as they are (gathered or not)."""
        out = LayoutColumns(cols)
        if cols and len(out) != self._n:
            raise ValueError(f"columns of different lengths {sorted({len(out), self._n})}")
        out._cols = {**self._cols, **out._cols}  # a replaced column keeps its place
        out._pending = {k: v for k, v in self._pending.items() if k not in cols}
        out._n = self._n
        return out

    def with_gathered(self, rows: np.ndarray, **sources: np.ndarray) -> LayoutColumns:
        """Columns `source.take(rows)` added, each gathered when first read (`take`)."""
        if len(rows) != self._n:
            raise ValueError(f"columns of different lengths {sorted({len(rows), self._n})}")
        _check_names(sources)
        out = LayoutColumns.__new__(LayoutColumns)
        out._cols = {**self._cols, **dict.fromkeys(sources)}
        out._pending = {**self._pending, **{k: (np.asarray(v), rows) for k, v in sources.items()}}
        out._n = self._n
        return out

    def codes(self, names: Sequence[str], radix: Sequence[int]) -> np.ndarray:
        """Each row's mixed-radix code of the integer columns `names` (column k's values below
        radix[k]; the first column most significant). When the columns are all still to be
        gathered through one row index (an enumeration's factor table, `with_gathered`), the
        codes are computed on the table's rows and gathered once."""
        pending = [self._pending.get(name) if self._cols[name] is None else None for name in names]
        if all(pending) and all(p[1] is pending[0][1] for p in pending):
            return mixed_radix([p[0] for p in pending], radix).take(pending[0][1])
        return mixed_radix([self[name] for name in names], radix)

    def value(self, name: str, i: int):
        """Column `name` at row i, without gathering the column."""
        column = self._cols[name]
        if column is None:
            source, rows = self._pending[name]
            return source[rows[i]]
        return column[i]

    def row(self, i: int) -> dict[str, int]:
        """Row i as plain Python ints (codes for literal fields)."""
        return {k: int(self.value(k, i)) for k in self._cols}

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
                  buffers: EngineBuffers | None = None,
                  megatron_overlap: tuple[str, ...] | None = None, validate: bool = True) -> Layout:
        """The typed Layout of row i (fields missing from the columns take Layout's defaults);
        `flash_attention`, `buffers`, `megatron_overlap`: fields every row shares. `validate`
        False: built without pydantic's checks (`Layout.trusted`), for rows the rule table has
        already passed that are only read, never shown (the sweep's engine mask)."""
        fields: dict[str, object] = {}
        for name in self._cols:
            value = self.value(name, i)
            if name in CODED:
                fields[name] = CODED[name][int(value)]
            elif name == "sequence_parallel":
                fields[name] = bool(value)
            elif name in OPTIONAL:
                fields[name] = int(value) or None
            else:
                fields[name] = int(value)
        extra: dict[str, object] = {"flash_attention": flash_attention,
                                    "megatron_overlap": megatron_overlap}
        if buffers is not None:
            extra["buffers"] = buffers
        return Layout(**fields, **extra) if validate else Layout.trusted(**fields, **extra)


# --------------------------------------------------------------------------- grouping


def mixed_radix(columns: Sequence[np.ndarray], radix: Sequence[int]) -> np.ndarray:
    """sum of columns[k] x the product of the radices after k (`LayoutColumns.codes`)."""
    code = np.asarray(columns[0], dtype=np.int64)
    for column, base in zip(columns[1:], radix[1:]):
        code = code * base + column
    return code


def unique_ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` for non-negative integers: with a presence
    table (linear, no sort) when the range is small, else `np.unique`."""
    size = int(values.max(initial=0)) + 1
    if size > 4 * values.size + 4096:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    seen = np.bincount(values, minlength=size) > 0
    return np.flatnonzero(seen), (np.cumsum(seen) - 1).take(values)


def group_rows(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique rows of the stacked non-negative integer keys, in `np.unique`'s sorted order, and
    each candidate's row index (`group_index`); each group's values are read at one of its
    rows."""
    count, inverse = group_index(*keys)
    rep = representatives(inverse, count)
    return np.stack([np.asarray(key, dtype=np.int64)[rep] for key in keys], axis=1), inverse


def group_index(*keys: np.ndarray) -> tuple[int, np.ndarray]:
    """(number of groups, each candidate's group) of the stacked non-negative integer keys,
    the groups in `np.unique`'s sorted order (`group_rows` without the groups' values). The
    columns are packed into one int64 in mixed radix (radix: the column's largest value + 1),
    one column at a time; whenever the packed range would grow wide, the part packed so far is
    first replaced by its rank among its distinct values (a presence table, no sort), and a
    wide column by its rank. Ranks keep the order, so the groups come out sorted."""
    n = len(keys[0])
    limit = 4 * n + 4096
    packed, width = None, 1
    for key in keys:
        key = np.asarray(key, dtype=np.int64)
        radix = int(key.max(initial=0)) + 1
        if packed is not None and width * radix > limit:
            uniq, packed = unique_ints(packed)
            width = max(len(uniq), 1)
        if width * radix > limit:
            uniq, key = unique_ints(key)
            radix = max(len(uniq), 1)
        packed = key if packed is None else packed * radix + key
        width *= radix
    uniq, inverse = unique_ints(packed)
    return len(uniq), inverse.astype(np.int64, copy=False)


def representatives(inverse: np.ndarray, groups: int) -> np.ndarray:
    """One candidate index per group (any member: every member gives the same value)."""
    rep = np.zeros(groups, dtype=np.int64)
    rep[inverse] = np.arange(len(inverse), dtype=np.int64)
    return rep


def on_distinct(fn: Callable[[np.ndarray], Mapping[str, object]],
                *keys: np.ndarray) -> dict[str, np.ndarray]:
    """`fn(rows)` evaluated once per distinct combination of the integer `keys` (at one row of
    each, `representatives`) and gathered back to every row: for a quantity that depends only
    on those keys, the same values as `fn` over all rows, computed on far fewer. `fn` takes the
    representative row indices and returns named values over them (arrays or scalars)."""
    count, inverse = group_index(*keys)
    out = fn(representatives(inverse, count))
    return {name: as_shape(value, (count,)).take(inverse) for name, value in out.items()}


def as_shape(value, shape: tuple[int, ...]):
    """`np.broadcast_to(value, shape)`, or `value` itself when it already has that shape
    (broadcast_to costs ~4 us a call; the formulas read, never write, these arrays)."""
    return value if getattr(value, "shape", None) == shape else np.broadcast_to(value, shape)


def piecewise(shape: tuple[int, ...], width: int,
              cases: Sequence[tuple[np.ndarray, Callable[[np.ndarray], Sequence[object]]]],
              ) -> list[np.ndarray]:
    """`width` float64 columns defined case by case: `cases` are (disjoint boolean mask, fn) and
    `fn(rows)` gives the columns' values on the rows (an index array) where its mask holds;
    0 where no case does. The same values as evaluating every case on every row and selecting
    with np.where, at each case's share of the cost."""
    out = [np.zeros(shape) for _ in range(width)]
    for mask, fn in cases:
        rows = np.flatnonzero(mask)
        if rows.size:
            for column, value in zip(out, fn(rows)):
                column[rows] = value
    return out


STATE_FIELDS = ("zero_stage", "offload_optimizer", "offload_params", "dp_engine", "dp_shard")
"""The ZeRO / offload / engine fields and the HSDP shard group: model states, buffers, the
data-parallel and offload terms read them; activations, FLOPs and the compute terms do not."""


def activity_groups(cols: LayoutColumns, key: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(one row of each group, each row's group) of the rows equal in every field but
    STATE_FIELDS. `key`: a non-negative integer per row that already names its group (the
    sweep's enumeration knows it: its candidates are a product with the ZeRO / offload
    options); else the groups are found from the columns (`group_rows`)."""
    if key is None:
        _, inverse = group_index(*(cols[name] for name in cols if name not in STATE_FIELDS))
        groups = int(inverse.max(initial=-1)) + 1
    else:
        uniq, inverse = unique_ints(np.asarray(key, dtype=np.int64))
        groups = len(uniq)
    return representatives(inverse, groups), inverse
