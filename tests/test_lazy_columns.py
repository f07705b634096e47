"""`LayoutColumns.take` gathers a column when it is first read; `ModelSpec` hashes once.

Every expected value here is numpy's own eager indexing of the same arrays (`source[rows]`),
or pydantic's definition of a frozen model's hash (the tuple of its field values)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.columns import LayoutColumns
from planner.core.spec import Layout
from planner.io import loading


def _columns(n: int, seed: int = 0) -> tuple[LayoutColumns, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    plain = {"tp": rng.integers(1, 9, n), "pp": rng.integers(1, 5, n),
             "dp": rng.integers(1, 64, n), "zero_stage": rng.integers(0, 4, n),
             "sequence_parallel": rng.integers(0, 2, n).astype(bool)}
    return LayoutColumns(plain), plain


def test_chained_takes_equal_numpy_indexing_and_keep_dtypes():
    cols, plain = _columns(50)
    first = np.array([3, 3, 10, 49, 0, 7, 7, 20])
    mask = np.array([True, False, True, True, False, True, True, False])
    second = np.flatnonzero(mask)
    lazy = cols.take(first).take(mask).take(slice(1, None))
    assert list(lazy) == list(plain)  # names and their order
    assert len(lazy) == len(second) - 1
    for name, source in plain.items():
        expected = source[first][second][1:]
        assert lazy[name].dtype == source.dtype
        assert np.array_equal(lazy[name], expected)


def test_membership_and_single_rows_do_not_gather():
    cols, plain = _columns(40, 1)
    rows = np.array([5, 1, 30, 30, 2])
    lazy = cols.take(rows)
    assert "tp" in lazy and "cp" not in lazy
    assert lazy.value("dp", 2) == plain["dp"][30]
    assert lazy.row(1) == {k: int(v[1]) for k, v in plain.items()}
    assert all(column is None for column in lazy._cols.values())  # nothing gathered yet
    assert np.array_equal(lazy["zero_stage"], plain["zero_stage"][rows])
    assert lazy._cols["tp"] is None and lazy._cols["zero_stage"] is not None


def test_gathered_factor_columns_equal_the_eager_product():
    """The enumeration's pattern: columns of the (pair, state) product gathered from their
    factors, then taken again (as the HSDP expansion does)."""
    pairs, plain = _columns(6, 2)
    states = np.array([[0, 0], [1, 2], [3, 1]])
    pair, state = (a.ravel() for a in np.indices((6, 3)))
    product = pairs.take(pair).with_gathered(state, offload_optimizer=states[:, 0],
                                             offload_params=states[:, 1])
    again = np.array([17, 0, 4, 4, 9])
    lazy = product.take(again)
    assert np.array_equal(lazy["offload_optimizer"], states[state[again], 0])
    assert np.array_equal(lazy["offload_params"], states[state[again], 1])
    assert np.array_equal(lazy["tp"], plain["tp"][pair[again]])
    replaced = lazy.with_columns(offload_params=np.zeros(5, dtype=np.int64))
    assert list(replaced) == list(lazy)  # a replaced column keeps its place
    assert not replaced["offload_params"].any()
    with pytest.raises(ValueError):
        lazy.with_columns(dp=np.ones(4, dtype=np.int64))
    with pytest.raises(KeyError):
        product.with_gathered(state, not_a_field=states[:, 0])


def test_a_lazy_row_gives_the_same_typed_layout():
    cols = LayoutColumns.from_layouts([Layout(tp=2, pp=4, dp=8, zero_stage=1),
                                       Layout(tp=4, pp=2, dp=8, zero_stage=3,
                                              offload_params="cpu", offload_optimizer="cpu")])
    assert cols.take(np.array([1, 0])).to_layout(0) == cols.to_layout(1)
    assert cols.take(np.array([1, 0])).to_layout(1) == Layout(tp=2, pp=4, dp=8, zero_stage=1)


def test_model_hash_is_pydantics_field_tuple_and_follows_copies():
    model = loading.load_model("gpt3-175b")
    fields = tuple(getattr(model, name) for name in type(model).model_fields)
    assert hash(model) == hash(fields)
    assert hash(model) == hash(model)  # remembered
    changed = model.model_copy(update={"num_layers": 95})
    assert hash(changed) == hash(tuple(getattr(changed, name) for name in type(changed).model_fields))
    assert hash(changed) != hash(model)
    same = type(model).model_validate(model.model_dump())
    assert same == model and hash(same) == hash(model)


def test_codes_of_factor_columns_equal_the_codes_of_their_rows():
    """`codes` on columns gathered through one factor index (computed on the factor table)
    and on gathered columns (computed on the rows) against the arithmetic by hand."""
    states = np.array([[0, 0, 0, 0], [1, 1, 0, 0], [3, 2, 1, 0], [2, 0, 0, 1]])
    base = LayoutColumns({"tp": np.arange(1, 6)})
    pair, state = (a.ravel() for a in np.indices((5, 4)))
    names = ("zero_stage", "offload_optimizer", "offload_params", "dp_engine")
    product = base.take(pair).with_gathered(state, **{n: states[:, k] for k, n in enumerate(names)})
    lazy = product.take(np.array([19, 2, 2, 7])).take(slice(1, None))
    rows = states[state[[2, 2, 7]]]
    by_hand = ((rows[:, 0] * 3 + rows[:, 1]) * 3 + rows[:, 2]) * 2 + rows[:, 3]  # radix 4, 3, 3, 2
    assert np.array_equal(lazy.codes(names, (4, 3, 3, 2)), by_hand)
    gathered = LayoutColumns({n: lazy[n] for n in names})  # every column already gathered
    assert np.array_equal(gathered.codes(names, (4, 3, 3, 2)), by_hand)


def test_a_freed_models_hash_is_forgotten():
    from planner.core import spec

    model = loading.load_model("gpt2").model_copy(update={"num_layers": 7})
    key, value = id(model), hash(model)
    assert spec._MODEL_HASHES[key][0] == value
    del model
    assert key not in spec._MODEL_HASHES
