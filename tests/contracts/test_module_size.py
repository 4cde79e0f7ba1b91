"""The module-size contract (tests/contracts/sizes.py) holds on the tree, and it catches a module over the limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.contracts.sizes import LIMIT, REPO, oversized


def test_no_module_of_the_package_is_over_the_limit() -> None:
    assert oversized(REPO) == []


def test_a_module_over_the_limit_fails_the_check_naming_it(tmp_path: Path) -> None:
    (tmp_path / "tracker" / "core").mkdir(parents=True)
    (tmp_path / "tracker" / "core" / "small.py").write_text("x = 1\n" * LIMIT)
    (tmp_path / "tracker" / "core" / "big.py").write_text("x = 1\n" * (LIMIT + 1))
    assert oversized(tmp_path) == [("tracker/core/big.py", LIMIT + 1)]
    result = subprocess.run([sys.executable, "-m", "tests.contracts.sizes", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr == f"tracker/core/big.py: {LIMIT + 1} lines, over the limit of {LIMIT}: split it by job\n"
