"""Write (or check) the JSON Schemas under schemas/ from the pydantic models: `python -m tracker.schemas [--check]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tracker.core.model import schema_documents

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"


def render() -> dict[Path, str]:
    return {SCHEMAS_DIR / name: json.dumps(doc, indent=2, sort_keys=True) + "\n"
            for name, doc in schema_documents().items()}


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    drift = []
    for path, text in render().items():
        if check:
            if not path.exists() or path.read_text() != text:
                drift.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if drift:
        print("schemas out of date (run: python -m tracker.schemas):", *map(str, drift), sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
