"""The module-size contract: no module of the ``tracker`` package is over ``LIMIT`` lines.

A module that outgrows it holds more than one job; split it by job (as ``core/reducer.py`` gave retirement and the
snapshot codec their own modules). ``./run test`` runs this check beside the import contracts; the simulators of
``sim/`` (a development package, not shipped) and the tests are outside it.

    python -m tests.contracts.sizes [ROOT]     exit 1 and one line per module over the limit
"""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 600
REPO = Path(__file__).resolve().parents[2]


def oversized(root: Path, *, limit: int = LIMIT) -> list[tuple[str, int]]:
    """The modules under ``root/tracker`` over ``limit`` lines, as (path relative to root, lines), largest first."""
    found = []
    for path in sorted((root / "tracker").rglob("*.py")):
        with path.open("rb") as fh:
            lines = sum(1 for _ in fh)
        if lines > limit:
            found.append((path.relative_to(root).as_posix(), lines))
    return sorted(found, key=lambda item: (-item[1], item[0]))


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else REPO
    if not (root / "tracker").is_dir():
        print(f"error: {root}/tracker is not a directory", file=sys.stderr)
        return 2
    over = oversized(root)
    for path, lines in over:
        print(f"{path}: {lines} lines, over the limit of {LIMIT}: split it by job", file=sys.stderr)
    if not over:
        print(f"module sizes: every module of tracker/ is within {LIMIT} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
