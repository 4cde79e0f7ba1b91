"""Write (or check) the contracts under schemas/ from the code: `python -m tracker.schemas [--check]`.

The JSON Schemas come from the pydantic models; ``schemas/index/schema.sql`` is the experiment index's DDL as
``tracker.shell.index`` creates it (one source: the file is generated, and the drift check keeps it so)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from tracker.core import stuck
from tracker.core.model import (
    HISTORY_SCHEMA,
    INTAKE_SCHEMA,
    METRIC_POINT_SCHEMA,
    METRIC_POINTS_SCHEMA,
    POD_SCHEMA,
    DeadLetter,
    IntakeEvent,
    MetricPoint,
    MetricPointsRecord,
    PodPlacement,
    RunHistory,
    adapter,
)

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"


def schema_documents() -> dict[str, dict[str, Any]]:
    """The JSON Schemas published under ``schemas/`` (path relative to schemas/ -> schema)."""
    intake = TypeAdapter(IntakeEvent).json_schema()
    intake["$id"] = INTAKE_SCHEMA
    intake["title"] = "TauGrid intake event"
    # intake/v1.schema.json is frozen as published: v2 reads every v1 event (tests/core/test_goodput_intake.py)
    return {
        "intake/v2.schema.json": intake,
        "history/v5.schema.json": adapter(RunHistory).json_schema() | {"$id": HISTORY_SCHEMA},
        "pod/v1.schema.json": adapter(PodPlacement).json_schema() | {"$id": POD_SCHEMA},
        "metric-point/v1.schema.json": adapter(MetricPoint).json_schema() | {"$id": METRIC_POINT_SCHEMA},
        # metric-points/v1 is what trackers before per-point records published (a run's every point): still read
        "metric-points/v1.schema.json": adapter(MetricPointsRecord).json_schema() | {"$id": METRIC_POINTS_SCHEMA},
        "dead-letter/v1.schema.json": DeadLetter.model_json_schema() | {"$id": "taugrid.io/dead-letter/v1"},
        **stuck.schema_documents(),
    }


def render() -> dict[Path, str]:
    from tracker.shell.index_schema import SCHEMA_SQL

    docs = {SCHEMAS_DIR / name: json.dumps(doc, indent=2, sort_keys=True) + "\n"
            for name, doc in schema_documents().items()}
    return {**docs, SCHEMAS_DIR / "index" / "schema.sql": SCHEMA_SQL}


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
