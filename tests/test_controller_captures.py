"""The captures the real controllers produced (`tests/captures/controllers/<scenario>/`, each with the VERSIONS that
produced it; `tests/test_controller_scenarios.py` writes them) fold, without a cluster, to the histories the
controllers decided (`tests.controller_scenarios.EXPECTED`), in any order of the objects' streams, and say the same
when replayed in two pieces."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.controller_scenarios import EXPECTED, SCENARIOS, differences
from tests.laws import by_object, fold, histories, interleave
from tests.test_controller_scenarios import CAPTURES


def load(scenario: str) -> list[dict[str, Any]]:
    path = CAPTURES / scenario / "capture.jsonl.gz"
    assert path.is_file(), f"{path} is missing: run the live scenario with TRACKER_KEEP_CONTROLLER_CAPTURES=1"
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_every_scenario_has_a_kept_capture_with_its_versions() -> None:
    kept = {p.name for p in CAPTURES.iterdir() if p.is_dir()}
    assert kept == set(SCENARIOS) == set(EXPECTED)
    for scenario in SCENARIOS:
        versions = (CAPTURES / scenario / "VERSIONS").read_text()
        for what in ("kubernetes", "kueue", "kuberay-operator", "kwok"):
            assert f"{what} " in versions, f"{scenario}/VERSIONS names no {what} version"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_kept_capture_folds_to_what_the_controllers_decided(scenario: str) -> None:
    records = load(scenario)
    got = histories(fold(records))
    assert differences(scenario, records, got) == []
    # the watch API orders each object's changes only: any interleaving of the objects folds the same
    rng = random.Random(scenario)
    seqs = by_object({"capture": records})
    for _ in range(3):
        assert histories(fold(interleave(seqs, rng))) == got


def test_the_kept_captures_are_what_the_watcher_writes(tmp_path: Path) -> None:
    """JSON lines of watch events {"type", "object", "key"}: what `tracker replay` reads."""
    for scenario in SCENARIOS:
        for rec in load(scenario):
            assert rec["type"] in ("ADDED", "MODIFIED", "DELETED") and rec["object"]["metadata"]["uid"]
