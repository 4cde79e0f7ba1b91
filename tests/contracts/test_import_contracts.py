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


LAYERS = "cli > ui | runtime > read > shell > settings > core > errors"


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("path", "line", "contract"), [
    ("tracker/shell/kafka.py", "import tracker.runtime.service  # noqa", LAYERS),
    ("tracker/settings/__init__.py", "from tracker.shell import jsonio  # noqa", LAYERS),
    ("tracker/runtime/ops.py", "import tracker.cli  # noqa", LAYERS),
    ("tracker/read/runs.py", "import tracker.runtime.replay  # noqa", LAYERS),
    ("tracker/ui/pages.py", "import tracker.runtime.ops  # noqa", LAYERS),  # independent siblings
    ("tracker/runtime/ops.py", "import tracker.ui.style  # noqa", LAYERS),
    ("tracker/schemas.py", "import tracker.cli.args  # noqa", LAYERS),
    ("tracker/core/vocab.py", "import tracker.core.model  # noqa", "no cycles between sibling modules"),
    ("tracker/read/runs.py", "import tracker.read.render  # noqa", "no cycles between sibling modules"),
    ("tracker/core/derive.py", "import time  # noqa", "core is pure"),
    ("tracker/core/model.py", "import asyncio  # noqa", "core is pure"),
    ("tracker/read/store.py", "import tracker.shell.kafka  # noqa", "the read side reads the index only"),
    ("tracker/read/filters.py", "import aiokafka  # noqa", "the read side reads the index only"),
    ("tracker/ui/server.py", "import argparse  # noqa", "the web view reads through the read side"),
    ("tracker/ui/pages.py", "from tracker.shell import index  # noqa", "the web view reads through the read side"),
    ("sim/builders.py", "import tracker.shell.jsonio  # noqa", "sim builds on core only"),
    ("tracker/core/gpu.py", "import sim.builders  # noqa", "the service does not depend on sim"),
])
def test_a_planted_breach_breaks_its_contract(tmp_path: Path, path: str, line: str, contract: str) -> None:
    result = lint(tmp_path, (path, line))
    assert result.returncode == 1, result.stdout + result.stderr
    broken = [line for line in result.stdout.splitlines() if line.endswith(" BROKEN")]
    assert [line for line in broken if line.startswith(contract)], result.stdout
