"""Field descriptions come from the attribute docstrings when a JSON Schema is built
(planner/core/field_docs.py), not at class creation: the docstrings found are the ones pydantic's
own reader (`use_attribute_docstrings`) finds, class by class, and they reach the schema."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import planner
from planner.core.field_docs import class_docstrings, describe_fields
from planner.core.spec import Frozen

_docs_extraction = pytest.importorskip("pydantic._internal._docs_extraction")


def _all_models() -> list[type]:
    """Every Frozen subclass in the package (the torch harness's modules aside; the schema module
    imports the calibration's torch-free models)."""
    importlib.import_module("planner.cli.report.schema")
    for info in pkgutil.walk_packages(planner.__path__, "planner."):
        if not info.name.startswith(("planner.calibrate", "planner.__main__")):
            importlib.import_module(info.name)
    found, todo = [], [Frozen]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_docstrings_equal_pydantics_reader_for_every_model():
    models = _all_models()
    assert len(models) > 50
    documented = 0
    for cls in models:
        own = set(cls.__dict__.get("__annotations__", {}))
        theirs = {k: v for k, v in _docs_extraction.extract_docstrings_from_cls(cls, use_inspect=True).items()
                  if k in own}
        ours = {k: v for k, v in class_docstrings(cls).items() if k in own}
        assert ours == theirs, cls
        documented += len(ours)
    assert documented > 300


def test_a_field_docstring_reaches_the_schema_and_an_explicit_description_wins():
    from pydantic import Field

    class Parent(Frozen):
        size_bytes: int
        """Bytes of the thing."""
        label: str = Field(default="x", description="explicit")
        """Not this one."""

    class Child(Parent):
        extra: int = 0
        """The child's own field."""
        label: str = "y"

    schema = Child.model_json_schema()["properties"]
    assert schema["size_bytes"]["description"] == "Bytes of the thing."  # inherited
    assert schema["extra"]["description"] == "The child's own field."
    assert "description" not in schema["label"]  # re-annotated without a docstring: none, as pydantic
    assert Parent.model_json_schema()["properties"]["label"]["description"] == "explicit"
    bare = {"properties": {"size_bytes": {"type": "integer"}}}
    describe_fields(bare, Parent)
    assert bare["properties"]["size_bytes"]["description"] == "Bytes of the thing."
