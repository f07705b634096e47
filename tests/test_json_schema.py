"""Every `--json` document has a published JSON Schema (docs/schema/, generated from the pydantic
models by planner.cli.report.schema) and the commands' actual output validates against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_zplan

jsonschema = pytest.importorskip("jsonschema")

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "docs" / "schema"
JOB = Path(__file__).resolve().parents[1] / "examples" / "job.yaml"


def test_published_schemas_are_up_to_date():
    from planner.cli.report.schema import schema_texts

    texts = schema_texts()
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.json")) == sorted(texts)
    for name, text in texts.items():
        assert (SCHEMA_DIR / name).read_text(encoding="utf-8") == text, (
            f"docs/schema/{name} is stale: python -m planner.cli.report.schema docs/schema")


def test_schemas_are_valid_draft_2020_12():
    for path in SCHEMA_DIR.glob("*.json"):
        jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))


CASES = [
    ("fit", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1", "--json"]),
    ("fit", ["fit", "--model", "gpt3-175b", "--cluster", "dgx2x32", "--json"]),  # searched, with strategies
    ("model", ["show", "llama2-7b", "--json"]),
    ("infer", ["infer", "--model", "llama2-7b", "--gpu", "a100-80gb", "--json"]),
    ("sweep", ["sweep", "--model", "gpt2", "--cluster", "dgx2", "--top", "2", "--rejected", "1", "--json"]),
    ("presets", ["presets", "--json"]),
    ("check", ["check", str(JOB), "--json"]),
    ("budget-compute", ["budget", "--gpu", "a100-80gb", "--gpus", "8", "--days", "1", "--json"]),
    ("budget-model", ["budget", "--model", "gpt2", "--tokens", "1e9", "--json"]),
]


@pytest.mark.cli
@pytest.mark.parametrize("schema, args", CASES, ids=[" ".join(a[:1] + [s]) for s, a in CASES])
def test_output_validates_against_its_schema(schema, args):
    result = run_zplan(*args)
    assert result.returncode in (0, 1), result.stderr
    document = json.loads(result.stdout)
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMA_DIR / f"{schema}.json").read_text()))
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:3]]


def test_a_schema_rejects_a_document_with_a_wrong_field():
    schema = json.loads((SCHEMA_DIR / "check.json").read_text())
    good = {"schema_version": 1, "kind": "check"}
    validator = jsonschema.Draft202012Validator(schema)
    assert any("required" in e.message for e in validator.iter_errors(good))
    assert list(validator.iter_errors({**good, "fits": "yes"}))
