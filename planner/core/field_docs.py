"""Field descriptions from attribute docstrings, read only when a JSON Schema is built.

The input and result models document each field with a docstring under it (`name: str` then
a string statement, `"Short identifier."`). pydantic's `use_attribute_docstrings` reads them when each class is
created, by finding and re-parsing the class's source (pydantic/_internal/_docs_extraction.py):
some 3 ms per class, 0.12 s for the ~30 classes `zplan fit` imports, to fill descriptions that
only the JSON Schemas (docs/schema/, `planner.cli.report.schema`) show. `describe_fields` is
`Frozen`'s `json_schema_extra`: it adds the same descriptions while a schema is built and costs
nothing otherwise. tests/test_json_schema.py checks the published schemas, byte for byte.

Which docstring a field gets is pydantic's rule: the one under the field in the class that
annotates it (a subclass that re-annotates a field without a docstring drops its description),
and never over an explicit `Field(description=...)`.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Any


@functools.cache
def class_docstrings(cls: type) -> dict[str, str]:
    """{field: docstring} for the annotated attributes in `cls`'s own body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (interactive, frozen): no descriptions, as pydantic
        return {}
    body = ast.parse(source).body[0]
    docs: dict[str, str] = {}
    previous: ast.stmt | None = None
    for statement in getattr(body, "body", ()):
        if (isinstance(previous, ast.AnnAssign) and isinstance(previous.target, ast.Name)
                and isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)):
            docs[previous.target.id] = inspect.cleandoc(statement.value.value)
        previous = statement
    return docs


def field_docstring(cls: type, name: str) -> str | None:
    """The docstring of field `name` from the nearest class in `cls`'s MRO that annotates it."""
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return class_docstrings(klass).get(name)
    return None


def describe_fields(schema: dict[str, Any], cls: type) -> None:
    """`json_schema_extra` hook: each property without an explicit description gets its docstring."""
    properties = schema.get("properties", {})
    for name, field in getattr(cls, "model_fields", {}).items():
        key = field.serialization_alias or field.alias or name
        doc = field_docstring(cls, name) if field.description is None else None
        if doc and key in properties:
            properties[key]["description"] = doc
