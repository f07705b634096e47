"""`tp: true` is refused on every number field (spec.Frozen._no_bool_for_number), and only the
fields that can refuse a boolean carry the validator (issue 9: validators cost schema-building
time on every field they are attached to). The expected field lists are written out by hand
from the field types in planner/core/spec.py."""

from __future__ import annotations

from typing import Literal, Optional

import pytest
from pydantic import ValidationError

from planner.core.errors import format_validation_error
from planner.core.spec import Frozen, Layout

LAYOUT_NUMBERS = {  # int / int | None / Literal[0, 1, 2, 3] fields of Layout
    "tp", "pp", "dp", "dp_shard", "ep", "cp", "virtual_stages", "first_stage_layers", "last_stage_layers",
    "zero_stage", "recompute_every_k", "recompute_num_layers", "micro_batch", "grad_accum",
}


def _checked_fields(cls: type[Frozen]) -> set[str]:
    decorator = cls.__pydantic_decorators__.field_validators.get("_no_bool_for_number")
    return set() if decorator is None else set(decorator.info.fields)


def test_layout_checks_exactly_its_number_fields():
    assert _checked_fields(Layout) == LAYOUT_NUMBERS


@pytest.mark.parametrize("name", sorted(LAYOUT_NUMBERS))
def test_a_boolean_in_a_layout_number_is_refused_naming_the_field(name: str):
    with pytest.raises(ValidationError) as info:
        Layout.model_validate({name: True})
    assert format_validation_error(info.value) == f"{name}: expected a number, got the boolean true"


class _Words(Frozen):
    name: str = "x"
    flag: bool = False
    either: int | bool = 1
    """A boolean is allowed here: the union takes bool."""


class _Numbers(_Words):
    count: int = 1
    ratio: Optional[float] = None
    stage: Literal[0, 1] = 0


def test_a_model_without_number_fields_has_no_check_and_a_subclass_gets_its_own():
    assert _checked_fields(_Words) == set()
    assert _Words(flag=True, either=True).either is True
    assert _checked_fields(_Numbers) == {"count", "ratio", "stage"}
    for name in ("count", "ratio", "stage"):
        with pytest.raises(ValidationError, match="expected a number, got the boolean false"):
            _Numbers.model_validate({name: False})


def test_every_error_is_still_counted():
    """Two booleans and a bad word: the first error is shown and the other two counted, as when
    the validator was attached to every field."""
    with pytest.raises(ValidationError) as info:
        Layout.model_validate({"tp": True, "recompute": "sometimes", "grad_accum": False})
    assert format_validation_error(info.value) == "tp: expected a number, got the boolean true (and 2 more)"
