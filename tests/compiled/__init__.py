"""The compiled core's copy of the tree: ``compiled_copy`` copies the working tree (its tracked and untracked files,
not what .gitignore leaves out) into a folder and compiles that copy's core with mypyc, as ``./run compile`` does
(``deploy/compiled/build_core.py``). The working tree itself is never compiled. Used by ``python -m tests.compiled``
(the compiled core's tests, the last step of ``./run test``) and ``bench/compiled.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tree_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode()
    return [f for f in listed.split("\0") if f and (ROOT / f).is_file()]


def compiled_copy(into: Path) -> Path | None:
    """``into/tree``, a copy of the working tree with its core compiled; None (the build's error printed) if the
    build failed."""
    copy = into / "tree"
    for name in tree_files():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    env = {**os.environ, "PYTHONPATH": str(copy)}
    built = subprocess.run([sys.executable, "deploy/compiled/build_core.py"], cwd=copy, env=env, check=False)
    if built.returncode != 0:
        sys.stderr.write(f"error: the compiled core did not build (exit {built.returncode})\n")
        return None
    return copy
