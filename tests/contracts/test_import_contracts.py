"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and they would catch a breach.

`./run test` runs `lint-imports` on the tree; these tests run it on a copy of ``tracker/`` and ``sim/`` with one
bad import
added, so that a contract that silently matched nothing (a renamed package, a typo in a module name) fails here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(tmp_path: Path, breach: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over a copy of the package, with ``breach`` (module file, import line) appended."""
    for package in ("tracker", "sim"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "captures"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    if breach is not None:
        path, line = breach
        with (tmp_path / path).open("a", encoding="utf-8") as fh:
            fh.write(f"\n{line}\n")
    # PYTHONPATH first: the copy is the `tracker` package the graph is built from, not the installed one
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(tmp_path / "pyproject.toml")],
                          cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("path", "line", "contract"), [
    ("tracker/shell/kafka.py", "import tracker.runtime.service  # noqa", "cli > runtime > shell > settings > core"),
    ("tracker/settings.py", "from tracker.shell import jsonio  # noqa", "cli > runtime > shell > settings > core"),
    ("tracker/runtime/ops.py", "import tracker.cli  # noqa", "cli > runtime > shell > settings > core"),
    ("tracker/core/derive.py", "import time  # noqa", "core is pure"),
    ("tracker/core/model.py", "import asyncio  # noqa", "core is pure"),
    ("sim/builders.py", "import tracker.shell.jsonio  # noqa", "samples build on core only"),
])
def test_an_upward_or_impure_import_breaks_a_contract(tmp_path: Path, path: str, line: str, contract: str) -> None:
    result = lint(tmp_path, (path, line))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{contract}" in result.stdout and "BROKEN" in result.stdout, result.stdout
