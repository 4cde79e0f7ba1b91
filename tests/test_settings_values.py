"""Settings that cannot work are refused at start, naming the field (never a traceback from a client later)."""

from __future__ import annotations

import pytest

from tracker.settings import SettingsError, load_settings


@pytest.mark.parametrize("servers", ["host:notaport", "host", "localhost:9092,:9", "k-0:0", "k-0:65536"])
def test_bootstrap_servers_that_are_not_host_port_are_refused(servers: str) -> None:
    with pytest.raises(SettingsError, match=r"bootstrap_servers: .* is not host:port"):
        load_settings(None, {"kafka": {"bootstrap_servers": servers}})


@pytest.mark.parametrize("servers", ["kafka-0:9092", "k-0:9092, k-1:9092", "[::1]:9092", "10.0.0.1:9093"])
def test_bootstrap_servers_as_host_port_lists_are_accepted(servers: str) -> None:
    assert load_settings(None, {"kafka": {"bootstrap_servers": servers}}).kafka.bootstrap_servers == servers


def test_invalid_settings_are_one_line_on_stderr_whatever_the_terminal_width() -> None:
    """Every problem on one line (a log collector keeps it whole), named by field, with exit code 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")}
    env.update(TRACKER_REDUCE__MAX_HELD="abc", TRACKER_OPS__LOG_LEVEL="LOUD", COLUMNS="40")
    proc = subprocess.run([sys.executable, "-m", "tracker.cli", "reduce", "--bootstrap-servers", "localhost:9092"],
                          env=env, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "reduce.max_held" in lines[0] and "ops.log_level" in lines[0] and "TRACKER_<SECTION>__<NAME>" in lines[0]
