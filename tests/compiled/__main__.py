"""The compiled core's tests: ``./run test`` runs them after the whole suite (CI too), ``python -m tests.compiled``.

The working tree is copied (its tracked and untracked files, not what .gitignore leaves out) to a temporary folder,
its core is compiled there with mypyc (``deploy/compiled/build_core.py``: the shipped option, ``./run compile``),
and pytest runs ``SUITES`` of the copy against it, without the tests that need a service (they exercise the shell,
which is not compiled, and run in the whole suite) and without ``pure_core`` ones (a patch of a core function, which
compiled callers do not see). ``TRACKER_EXPECT_COMPILED_CORE=1`` makes the copy's conftest refuse to start unless
every compiled module is loaded from its extension module. The working tree itself is never compiled.

Extra arguments go to that pytest (``python -m tests.compiled -x -k fuzz``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.compiled import compiled_copy

# the reducer's laws and fuzzing, the scenarios and retirement (core); replay, the index and the reducer state
# (index); slimming and redaction of watched objects (watch)
SUITES = ("tests/core", "tests/index", "tests/watch")
MARKERS = "not kafka and not kube and not cluster and not pure_core"


def main(argv: list[str]) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracker-compiled-") as tmp:
        copy = compiled_copy(Path(tmp))
        if copy is None:
            sys.stderr.write("error: the compiled core's tests did not run\n")
            return 1
        env = {**os.environ, "PYTHONPATH": str(copy), "TRACKER_EXPECT_COMPILED_CORE": "1"}
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", MARKERS,
                                *SUITES, *argv], cwd=copy, env=env, check=False)
    verdict = "passed" if tests.returncode == 0 else f"FAILED (pytest exit {tests.returncode})"
    sys.stderr.write(f"==> the compiled core's tests {verdict} in {time.monotonic() - started:.0f} s\n")
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
