"""The repository explains itself: whoever has only the repository can follow every citation.

- No citation of a document that lives elsewhere: no design notes (``design.md``), no seed
  documents, no issue-tracker numbers, no ``../shared`` paths. Upstream BookKeeper / Pulsar
  changes may be named with their project ("BookKeeper PR #3976", "BK#1967").
- Every "rule N" names the page that states the rule (``docs/correctness.md``), and that page
  states rules 1-13, defects D1-D6 and requirements R1-R5; every test it cites exists.
- Every module under ``src/vellum`` has a line in ``docs/architecture.md``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vellum"
SCANNED = ("src", "tests", "docs", "benchmarks", "examples", "README.md", "pyproject.toml")
SUFFIXES = {".py", ".md", ".rst", ".txt", ".toml"}
SKIPPED_DIRS = {"static", "__pycache__", ".venv", "node_modules"}
THIS = Path(__file__).resolve()
CORRECTNESS = ROOT / "docs" / "correctness.md"

# Prefixes under which a number is an upstream project's, not ours.
_UPSTREAM = r"(?<!BookKeeper )(?<!BookKeeper's )(?<!Pulsar )(?<!ZooKeeper )"
OUTSIDE = re.compile(
    r"\b[Ss]eeds?\s+\d{3}\b"                           # "seed 000"
    r"|seeds?/"                                         # "seeds/README.md"
    r"|(?<![\w/])design\.md"                            # the design notes
    r"|\.\./shared|shared/reference|reference/bookkeeper"
    r"|" + _UPSTREAM + r"\b[Ii]ssues?\s+#?\d+"          # "issue 12", "issue #12"
    r"|(?<![\w&/])(?<!BookKeeper PR )(?<!BookKeeper issue )(?<!Pulsar issue )(?<!Pulsar PR )#\d+\b"  # "#12"
)
# "rule 3", "rules 1, 3 and 7", not followed by the page that states them
RULE = re.compile(
    r"(?<![\w/.-])(?<!docs/correctness\.md, )[Rr]ules?\s+(?>\d+(?:(?:,\s+and\s+|\s+and\s+|,\s+)\d+)*+)(?!\w|\.\d)"
    r"(?!\s+of\s+docs/correctness\.md)(?!\s+and\s+requirement\s+R\d\s+of\s+docs/correctness\.md)"
)


def _scanned_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        path = root / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += [
                f for f in sorted(path.rglob("*"))
                if f.is_file() and f.suffix in SUFFIXES and not SKIPPED_DIRS & set(f.relative_to(root).parts)
            ]
    return [f for f in found if f.resolve() != THIS]


def _where(text: str, pos: int) -> tuple[int, str]:
    line = text.count("\n", 0, pos) + 1
    return line, text.splitlines()[line - 1].strip()


def citation_problems(root: Path) -> list[str]:
    """``file:line: text`` of every citation a reader of the repository alone could not follow."""
    problems = []
    for path in _scanned_files(root):
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(root).as_posix()
        matches = list(OUTSIDE.finditer(text))
        if path.resolve() != (root / "docs" / "correctness.md").resolve():
            matches += RULE.finditer(text)
        for m in sorted(matches, key=lambda m: m.start()):
            line, src = _where(text, m.start())
            problems.append(f"{rel}:{line}: {m.group(0)!r} in: {src[:140]}")
    return problems


def missing_modules(src: Path, architecture: str) -> list[str]:
    """Modules under ``src`` (as ``pkg/mod.py``, or ``pkg/`` for a package) absent from the page."""
    missing = []
    for path in sorted(src.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(src).as_posix()
        key = rel.removesuffix("__init__.py") if rel.endswith("/__init__.py") else rel
        if f"`{key}`" not in architecture:
            missing.append(key)
    return missing


def test_no_citation_leaves_the_repository() -> None:
    problems = citation_problems(ROOT)
    assert problems == [], (
        "citations of documents outside the repository (cite docs/ pages instead: rules, defects and "
        "requirements are in docs/correctness.md; write 'rule N of docs/correctness.md'):\n"
        + "\n".join(problems)
    )


def test_the_citation_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text(
        '"""As seed 000 asks (issue 7, design rule 3)."""\n'
        "# rule 5 of docs/correctness.md holds; rules 1, 3 and 7 of docs/correctness.md too\n"
        "# see #12; BookKeeper PR #3976 and BK#1967 are upstream; PKCS#8 is a standard\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("Read ../shared/reference/bookkeeper.md and rule 4.\n")
    found = citation_problems(tmp_path)
    assert sorted(":".join(p.split(":")[:2]) for p in found) == [
        "docs/x.md:1", "docs/x.md:1", "docs/x.md:1", "src/m.py:1", "src/m.py:1", "src/m.py:1", "src/m.py:3",
    ], found
    assert any("'seed 000'" in p for p in found) and any("'#12'" in p for p in found)
    assert any("'design rule 3'" in p or "'rule 3'" in p for p in found)


def test_correctness_page_states_every_rule_defect_and_requirement() -> None:
    text = CORRECTNESS.read_text()
    for n in range(1, 14):
        assert re.search(rf"^## Rule {n}\. ", text, re.M), f"docs/correctness.md lacks rule {n}"
    for n in range(1, 7):
        assert f"| D{n} |" in text, f"docs/correctness.md lacks defect D{n}"
    for n in range(1, 6):
        assert re.search(rf"^### R{n}\. ", text, re.M), f"docs/correctness.md lacks requirement R{n}"


def test_every_test_the_correctness_page_cites_exists() -> None:
    text = CORRECTNESS.read_text()
    missing = []
    current: Path | None = None
    for m in re.finditer(r"`([\w/]+\.py)?(?:::(\w+))?`", text):
        path, name = m.group(1), m.group(2)
        if path:
            current = ROOT / "tests" / path if (ROOT / "tests" / path).exists() else SRC / path
            if not current.exists():
                missing.append(path)
                continue
        if name and current is not None and not re.search(rf"\b{name}\b", current.read_text()):
            missing.append(f"{current.relative_to(ROOT)}::{name}")
    assert missing == [], "docs/correctness.md cites what does not exist: " + ", ".join(missing)


def test_every_module_has_a_line_in_architecture_md() -> None:
    missing = missing_modules(SRC, (ROOT / "docs" / "architecture.md").read_text())
    assert missing == [], "docs/architecture.md has no line for: " + ", ".join(f"`{m}`" for m in missing)


def test_the_module_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    for rel in ("__init__.py", "a.py", "pkg/__init__.py", "pkg/b.py"):
        (tmp_path / rel).write_text("")
    assert missing_modules(tmp_path, "| `__init__.py` | `a.py` |") == ["pkg/", "pkg/b.py"]


def orphan_table_rows(text: str) -> list[int]:
    """Lines of table rows that start a table without a header and a ``|---|`` separator under
    them: Markdown renders such a row as plain text with pipes."""
    lines = text.splitlines()
    orphans, in_table, fenced = [], False, False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("|"):
            in_table = False
            continue
        if not in_table:
            nxt = lines[i + 1].replace(" ", "") if i + 1 < len(lines) else ""
            if not re.match(r"\|:?-", nxt):
                orphans.append(i + 1)
        in_table = True
    return orphans


def test_every_table_row_of_the_docs_renders() -> None:
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "docs").glob("*.md")) for n in orphan_table_rows(p.read_text())]
    assert bad == [], "table rows outside a table (no header and |---| line above them): " + ", ".join(bad)


def test_the_table_check_can_fail() -> None:
    text = "| a | b |\n|---|---|\n| 1 | 2 |\n\nprose\n\n| 3 | 4 |\n"
    assert orphan_table_rows(text) == [7]
