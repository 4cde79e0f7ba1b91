"""``./run``, the README's entry point: ``./run tracker ...`` runs in the caller's directory (its relative paths are
the caller's), while ``demo`` and ``test`` run in the repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_run_tracker_resolves_relative_paths_in_the_callers_directory(tmp_path: Path) -> None:
    (tmp_path / "captures").symlink_to(REPO / "tracker" / "captures" / "demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")}
    done = subprocess.run(["bash", str(REPO / "run"), "tracker", "replay", "captures", "--index", "rel.sqlite"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "it holds 14 run(s)" in done.stderr + done.stdout
    assert (tmp_path / "rel.sqlite").is_file()
    assert not (REPO / "rel.sqlite").exists()
    listed = subprocess.run(["bash", str(REPO / "run"), "tracker", "runs", "--index", "rel.sqlite", "-o", "name"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.split()) == 14


def test_run_without_a_command_prints_its_usage_and_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(REPO / "run")], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert "./run demo" in done.stdout and "./run tracker ..." in done.stdout and "./run compile" in done.stdout
