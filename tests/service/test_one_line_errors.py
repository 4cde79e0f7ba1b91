"""What an SRE new to the tool meets when a command cannot work: one line saying what is wrong (and the nearest
option or value when a word is mistyped), never argparse's whole usage block, a 3.5 KB settings dump or a library's
warning printed into a table; and the demo's counts agree with the runs it lists (issue 28, point 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.runtime.replay import replay


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[:3000]
    return lines[0]


@pytest.mark.parametrize("argv, says, hint", [
    (["runs", "--phase", "bogus"], "tracker runs: error: argument --phase: unknown phase 'bogus'", None),
    (["runs", "-o", "yamlx"], "tracker runs: error: argument -o/--output: invalid choice: 'yamlx'",
     "did you mean yaml?"),
    (["runs", "--sort-by", "nme"], "tracker runs: error: argument --sort-by: invalid choice: 'nme'",
     "did you mean name?"),
    (["runs", "--limt", "5"], "tracker runs: error: unrecognized arguments: --limt 5", "did you mean --limit?"),
    (["show"], "tracker show: error: the following arguments are required", None),
    (["sink", "index", "--indx", "x"], "tracker sink index: error: unrecognized arguments: --indx x",
     "did you mean --index?"),
    (["shw"], "tracker: error: argument COMMAND: invalid choice: 'shw'", "did you mean show?"),
    (["runs", "--limit"], "tracker runs: error: argument --limit: expected one argument", None),
])
def test_a_usage_error_is_one_line_naming_the_command(capsys: pytest.CaptureFixture[str], argv: list[str], says: str,
                                                       hint: str | None) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    line = one_line(err)
    assert out == "" and line.startswith(says), line
    command = says.split(": error")[0]
    assert line.endswith(f"(see `{command} --help`)"), line
    if hint is not None:
        assert hint in line, line
    else:
        assert "did you mean" not in line, line


def test_a_distant_typo_suggests_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["runs", "--zzzzzz"])
    assert "did you mean" not in one_line(capsys.readouterr().err)


def _tracker(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracker.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("TRACKER_", "KUBE"))} | env,
                          timeout=timeout, check=False)


def test_serve_without_a_kubeconfig_says_so_in_one_line_without_a_settings_dump(tmp_path: Path) -> None:
    """The start-up line carries only the settings that differ from the defaults (the whole tree is at DEBUG), and
    a missing kubeconfig is one error naming where it was looked for and how to give one."""
    done = _tracker(["serve", "--watch", "--index", str(tmp_path / "i.sqlite")],
                    {"KUBECONFIG": str(tmp_path / "nowhere"), "HOME": str(tmp_path),
                     "TRACKER_OPS__SHUTDOWN_TIMEOUT_S": "7"}, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert len(events) == len(done.stderr.strip().splitlines()), done.stderr[-3000:]
    starting = next(e for e in events if e["event"] == "starting")
    assert starting["settings"] == {"ops": {"shutdown_timeout_s": 7.0}}
    assert len(done.stderr) < 1000, done.stderr
    assert not [e for e in events if e.get("logger", "").startswith("kubernetes_asyncio")], done.stderr
    stopped = next(e for e in events if e["event"] == "stopped_by_an_error")
    assert stopped["error_type"] == "KubeconfigError"
    assert stopped["error"] == (f"no usable kubeconfig (KUBECONFIG={tmp_path / 'nowhere'}: no such file): pass "
                                "--kubeconfig PATH (and --context), set KUBECONFIG, or run in a pod with a "
                                "ServiceAccount token")


def test_doctor_prints_no_library_warning_beside_its_table(tmp_path: Path) -> None:
    done = _tracker(["doctor", "--timeout", "5"], {"KUBECONFIG": str(tmp_path / "nowhere"), "HOME": str(tmp_path),
                                                   "COLUMNS": "400"}, tmp_path)
    assert done.returncode == 1
    assert done.stderr == "", done.stderr
    assert f"no usable kubeconfig (KUBECONFIG={tmp_path / 'nowhere'}: no such file)" in \
        " ".join(done.stdout.split()), done.stdout


def test_the_demo_says_as_many_runs_as_it_lists(tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    replay(captures=[DEMO_CAPTURES], index_path=tmp_path / "i.sqlite", console=console)
    said = console.export_text()
    listed = _tracker(["runs", "--index", str(tmp_path / "i.sqlite"), "-o", "name"], {}, tmp_path)
    names = listed.stdout.split()
    assert listed.returncode == 0 and names
    assert f"it holds {len(names)} run(s)" in " ".join(said.split()), said


def test_adx_workload_identity_without_its_environment_is_one_line_naming_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found while trying every service: ``sink adx`` with an ADX endpoint on a machine without the AKS workload
    identity environment printed azure-identity's traceback (a ValueError from ``WorkloadIdentityCredential``)."""
    from tracker import errors
    from tracker.settings import AdxSettings
    from tracker.shell.adx import connection

    for name in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_AUTHORITY_HOST"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(errors.ConfigError) as failure:
        connection(AdxSettings(), "https://example.kusto.windows.net")
    message = str(failure.value)
    assert "\n" not in message and "AZURE_FEDERATED_TOKEN_FILE" in message and "AZURE_TENANT_ID" in message, message
    monkeypatch.setenv("AZURE_TENANT_ID", "00000000-0000-0000-0000-000000000001")
    with pytest.raises(errors.ConfigError) as failure:
        connection(AdxSettings(client_id="00000000-0000-0000-0000-000000000002"), "https://example.kusto.windows.net")
    message = str(failure.value)
    assert "missing AZURE_FEDERATED_TOKEN_FILE (" in message and "AZURE_TENANT_ID" not in message, message
