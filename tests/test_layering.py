"""The layering rules of docs/architecture.md hold: import contracts pass and the pure layers do no I/O."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "vellum"

# Modules whose import means I/O; the sans-IO layers (proto/, format/) may not import them.
IO_MODULES = {
    "os", "io", "socket", "asyncio", "selectors", "pathlib", "shutil", "subprocess", "sqlite3",
    "tempfile", "mmap", "threading", "multiprocessing", "uvloop", "aiohttp", "kazoo", "rocksdict",
    "urllib", "http", "ssl", "signal", "fcntl", "glob",
}
IO_BUILTINS = {"open", "input", "print", "exec", "eval", "__import__"}


def _violations(path: Path, root: Path = SRC) -> list[str]:
    """I/O imports and calls of one module, as ``<path relative to root>:<line> ...``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module.split(".")[0]]
        for name in names:
            if name in IO_MODULES:
                found.append(f"{path.relative_to(root)}:{node.lineno} imports {name}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IO_BUILTINS:
            found.append(f"{path.relative_to(root)}:{node.lineno} calls {node.func.id}()")
    return found


def test_pure_layers_do_no_io() -> None:
    files = sorted((SRC / "proto").rglob("*.py")) + sorted((SRC / "format").rglob("*.py"))
    assert files, "proto/ and format/ must exist"
    problems = [v for f in files for v in _violations(f)]
    assert problems == [], "sans-IO layers do I/O:\n" + "\n".join(problems)


def test_io_check_catches_a_violation(tmp_path: Path) -> None:
    # The checker itself must be able to fail; the probe lives in a temporary directory, never in
    # src/ (a probe left there by a killed run would break every later run and the package).
    bad = tmp_path / "format" / "_probe_for_test.py"
    bad.parent.mkdir()
    bad.write_text("import os\nopen('x')\n")
    assert _violations(bad, tmp_path) == ["format/_probe_for_test.py:1 imports os", "format/_probe_for_test.py:2 calls open()"]


def test_import_contracts_hold(tmp_path: Path) -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    # import-linter caches into the working directory unless told otherwise: keep the checkout clean.
    proc = subprocess.run([exe, "--cache-dir", str(tmp_path / "import_linter_cache")], cwd=SRC.parents[1],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
