"""GPU accounting in the outputs: `tracker runs -o json` (held up to --now for a live run), `tracker show` (per
attempt), the experiment index (schema v4) round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.builders import at
from tests.core.test_gpu import EXPECTED, _by, _s, _writes
from tests.support.histories import stored, ups
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.core.reducer import Reducer
from tracker.shell.index import ExperimentIndex


def test_runs_json_and_show_carry_the_gpu_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index_path = tmp_path / "index.sqlite"
    assert main(["replay", str(DEMO_CAPTURES), "--index", str(index_path)]) == 0
    capsys.readouterr()
    assert main(["runs", "--index", str(index_path), "-o", "json"]) == 0
    runs = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    for runs_expected in EXPECTED.values():
        for run_id, (gpus, held, lost_by, _) in runs_expected.items():
            r = runs[run_id]
            assert (r["gpus"], _s(r["gpu_hours"]), _s(r["lost_gpu_hours"]), _by(r["lost_gpu_hours_by"])) == \
                (gpus, held, sum(lost_by.values()), lost_by), run_id
    assert runs["sd-xl-3rp6f"]["gpu_hours"] == 0 and runs["sd-xl-3rp6f"]["lost_gpu_hours"] == 0  # never admitted
    assert main(["show", "vit-l-9hx4d", "--index", str(index_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(a["gpus"], _s(a["lost_gpu_hours"])) for a in shown["attempts"]] == [(16, 16 * 599), (16, 0)]
    assert shown["pods"][0]["attempt"] == 1 and shown["pods"][0]["lost"] == "PodsReadyTimeout"
    assert shown["attempts"][0]["pod_count"] == len([p for p in shown["pods"] if p["attempt"] == 1])
    assert main(["show", "vit-l-9hx4d", "--index", str(index_path)]) == 0
    text = capsys.readouterr().out
    assert "16 GPUs · 2.66 GPU-h held · 2.66 lost (PodsReadyTimeout 2.66)" in text


def test_runs_json_counts_a_live_runs_gpus_up_to_now(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    red = Reducer()
    for w in _writes("quick-success"):
        if w.at >= at("09:20:00"):
            break
        red.apply(w.record, "quick-success")
    h = red.history("rn50-ft-k7q2m")
    assert h is not None
    with ExperimentIndex(tmp_path / "index.sqlite") as ix:
        ix.write(ups([h]))
        assert stored(ix).history("rn50-ft-k7q2m") == h  # the GPU fields round-trip through the index
    assert main(["runs", "--index", str(tmp_path / "index.sqlite"), "-o", "json", "--now",
                 "2026-08-20T09:32:07Z"]) == 0
    [run] = json.loads(capsys.readouterr().out)
    assert (run["gpus"], run["gpus_open"], run["gpu_hours"], run["lost_gpu_hours"]) == (16, 16, 8.0, 0.0)
