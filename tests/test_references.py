"""Every citation in the shipped code points to something inside the repository.

The code cites five source documents ("seed 000" .. "seed 004", Chinese originals that are not
shipped) by section, e.g. "seed 004 §2.2.3", "seed 000 §3 eq.2", "seed 002 Summary", "(001 §1.3)".
docs/references.md summarises each cited section under an HTML anchor
`<a id="seed-004-2-2-3"></a>`; this test finds every such citation in planner/ and the shipped
YAML data (hardware_profiles/, model_presets/) as the files are when it runs, and checks that the
anchor exists. It also checks that every `docs/....md` path named in planner/ exists, and that
every "docs/equations.md §N" names a numbered section of that file.

The parser is checked on hand-written sentences first (test_citation_parser), so a regex that
silently matches nothing cannot pass the repository-wide tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "references.md"
EQUATIONS = ROOT / "docs" / "equations.md"
SCANNED = ("planner", "hardware_profiles", "model_presets")
SUFFIXES = {".py", ".yaml", ".yml", ".md", ".txt"}

_SECTION = r"\d+(?:\.\d+)*|ZeRO-\d|Summary"
# "seed 004", "Seeds 000", or a bare "001 §2" continuing a list ("seed 001 §2, 000 §3").
_HEAD = re.compile(r"\b[Ss]eeds? (00[0-4])\b|(?<![\w.,])(00[0-4]) (?=§)")
# One more piece of the same citation: "§2.2.3", "§1.4-§1.5", "§5–6", "eq.3-4", ", §1.5",
# " and §1.5", " / §2", "Summary", "§ZeRO-2".
_STEP = re.compile(
    rf" ?(?:(?:,|and|/) ?)?(?:§ ?({_SECTION})(?:[-–]§? ?(\d+(?:\.\d+)*))?"
    r"|eq\. ?(\d+)(?:[-–](\d+))?"
    r"|(Summary)\b)"
)


def _anchor(doc: str, part: str) -> str:
    return f"seed-{doc}-" + part.lower().replace(".", "-")


def seed_anchors(text: str) -> set[str]:
    """The docs/references.md anchors that the seed citations in `text` need."""
    text = re.sub(r"\s+", " ", text)  # citations wrap across lines in docstrings
    needed: set[str] = set()
    for head in _HEAD.finditer(text):
        doc = head.group(1) or head.group(2)
        needed.add(f"seed-{doc}")
        pos = head.end()
        while (step := _STEP.match(text, pos)) is not None:
            section, range_end, eq, eq_end, summary = step.groups()
            for part in (section, range_end, summary):
                if part:
                    needed.add(_anchor(doc, part))
            for number in (eq, eq_end):
                if number:
                    needed.add(_anchor(doc, f"eq-{number}"))
            pos = step.end()
    return needed


def defined_anchors(markdown: str) -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"></a>', markdown))


def _shipped_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                files.append(path)
    return files


def test_citation_parser():
    """Hand-written sentences in every form the code uses, with the anchors worked out by hand."""
    assert seed_anchors("(seed 004 §2.2.3)") == {"seed-004", "seed-004-2-2-3"}
    assert seed_anchors("seed 000 §3 eq.2") == {"seed-000", "seed-000-3", "seed-000-eq-2"}
    assert seed_anchors("(seed 000 §3\n    eq.3-4)") == {"seed-000", "seed-000-3", "seed-000-eq-3",
                                                       "seed-000-eq-4"}
    assert seed_anchors("Seed 004 §1.4-§1.5 (C") == {"seed-004", "seed-004-1-4", "seed-004-1-5"}
    assert seed_anchors("seed 004 §3.5.1-3.5.2 (40") == {"seed-004", "seed-004-3-5-1",
                                                        "seed-004-3-5-2"}
    assert seed_anchors("(seed 000 §5–6 |") == {"seed-000", "seed-000-5", "seed-000-6"}
    assert seed_anchors("(seed 004 §1.3, §1.5): k") == {"seed-004", "seed-004-1-3", "seed-004-1-5"}
    assert seed_anchors("(seed 001 §2, 000 §3).") == {"seed-001", "seed-001-2", "seed-000",
                                                     "seed-000-3"}
    assert seed_anchors("(seed 001 §2, seed 002 Summary)") == {"seed-001", "seed-001-2",
                                                              "seed-002", "seed-002-summary"}
    assert seed_anchors("(seed 002 §ZeRO-2); ZeRO-3") == {"seed-002", "seed-002-zero-2"}
    assert seed_anchors("ZeRO paper 16 (001 §1.3), Megatron 18 (004 §3.5.1)") == {
        "seed-001", "seed-001-1-3", "seed-004", "seed-004-3-5-1"}
    assert seed_anchors("Strategies of the seeds: DDP") == set()
    assert seed_anchors("seed 004 §1.2.1 ① and ③") == {"seed-004", "seed-004-1-2-1"}
    assert seed_anchors("seed 000 §4; EQUATIONS.md §5") == {"seed-000", "seed-000-4"}
    # numbers that are not citations
    assert seed_anchors("1,000 §3 and 2.004 §1 and a seed of 3") == set()
    assert defined_anchors('x <a id="seed-000-eq-2"></a>\n## y') == {"seed-000-eq-2"}


def test_the_scan_finds_citations():
    """A scan that finds nothing would make the next test pass vacuously."""
    found = set().union(*(seed_anchors(p.read_text(errors="replace")) for p in _shipped_files()))
    assert {"seed-000", "seed-001", "seed-002", "seed-003", "seed-004"} <= found
    assert len(found) >= 30


@pytest.mark.parametrize("path", _shipped_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_seed_citation_has_an_anchor(path: Path):
    missing = seed_anchors(path.read_text(errors="replace")) - defined_anchors(
        REFERENCES.read_text())
    assert not missing, f"{path.relative_to(ROOT)} cites sections without an anchor in " \
                        f"docs/references.md: {sorted(missing)}"


def test_docs_paths_named_in_planner_exist():
    named = set()
    for path in _shipped_files():
        if path.parts[len(ROOT.parts)] == "planner":
            named |= set(re.findall(r"\bdocs/[\w./-]+?\.md\b", path.read_text(errors="replace")))
    assert "docs/references.md" in named  # the module docstrings point here
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"planner/ names documents that do not exist: {missing}"


def test_equations_sections_named_in_planner_exist():
    numbered = set(re.findall(r"^## (\d+)\. ", EQUATIONS.read_text(), flags=re.M))
    for path in _shipped_files():
        text = re.sub(r"\s+", " ", path.read_text(errors="replace"))
        for first, more in re.findall(r"docs/equations\.md §(\d+)((?:, §\d+)*)", text):
            for number in [first, *re.findall(r"\d+", more)]:
                assert number in numbered, f"{path.relative_to(ROOT)}: docs/equations.md " \
                                           f"has no section {number}"


def test_links_into_references_resolve():
    """Links to `#anchor` inside docs/references.md, and `references.md#anchor` from docs/ and
    planner/, name an anchor the page defines (a renamed section cannot leave dead links)."""
    defined = defined_anchors(REFERENCES.read_text())
    links = {(REFERENCES, a) for a in re.findall(r"\]\(#([\w-]+)\)", REFERENCES.read_text())}
    for top in ("docs", "planner"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES:
                text = path.read_text(errors="replace")
                links |= {(path, a) for a in re.findall(r"references\.md#([\w-]+)", text)}
    assert len(links) > 50
    dead = sorted(f"{p.relative_to(ROOT)} -> #{a}" for p, a in links if a not in defined)
    assert not dead, f"links to anchors docs/references.md does not define: {dead}"
