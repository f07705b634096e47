"""Data shipped inside the package (read with importlib.resources, works from the wheel).

`scaling_law(name_or_path)` loads one entry of `scaling_laws.yaml`, or of a user's YAML file of
the same shape, into a `planner.timing.budget.ScalingLaw`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.core.errors import PlanInputError, format_validation_error


def _read_laws(text: str, origin: str) -> dict[str, Any]:
    from planner.io.strict import parse_yaml

    doc = parse_yaml(text, origin, "law") or {}
    laws = doc.get("laws") if isinstance(doc, dict) else None
    if not isinstance(laws, dict) or not laws:
        raise PlanInputError("law", f"{origin}: expected a mapping `laws: {{name: {{A, alpha, ...}}}}`")
    return doc


def builtin_laws() -> dict[str, Any]:
    """The `scaling_laws.yaml` document shipped with the package."""
    text = resources.files("planner.data").joinpath("scaling_laws.yaml").read_text(encoding="utf-8")
    return _read_laws(text, "scaling_laws.yaml")


def scaling_law(name_or_path: str | None = None):  # -> planner.budget.ScalingLaw
    """A named built-in law (default: the file's `default`), or the first/only law of a YAML file."""
    from planner.timing.budget import ScalingLaw

    doc = builtin_laws()
    name = name_or_path or doc["default"]
    if name in doc["laws"]:
        entry, origin = doc["laws"][name], "scaling_laws.yaml"
    elif name.endswith((".yaml", ".yml")) or Path(name).is_file():
        path = Path(name)
        from planner.io.strict import read_text

        user = _read_laws(read_text(path, "law"), str(path))
        name = user.get("default") or next(iter(user["laws"]))
        if name not in user["laws"]:
            raise PlanInputError("law", f"{path}: default {name!r} is not one of {list(user['laws'])}")
        entry, origin = user["laws"][name], str(path)
    else:
        raise PlanInputError(
            "law", f"unknown scaling law {name!r}; allowed: {', '.join(doc['laws'])} or a YAML file"
        )
    try:
        return ScalingLaw(name=name, **entry)
    except ValidationError as err:
        raise PlanInputError("law", f"{origin}: {format_validation_error(err, name)}") from None
    except TypeError:
        raise PlanInputError("law", f"{origin}: entry {name!r} must be a mapping") from None
