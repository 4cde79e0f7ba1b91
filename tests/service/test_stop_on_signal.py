"""Every long-lived command stops within 5 s of SIGTERM, SIGINT or SIGHUP in the states it can wait in, with the exit
code the README documents ("Signals and exit codes"), without a traceback (issue 27, "every process stoppable").

A replay (``tracker replay``) stops gracefully: what it read is committed, one line says so, exit 128 + the signal.
A service (``sink index``, ``reduce``) stops gracefully: exit 0 and its "stopped" log line. The states: a replay
blocked on a quiet pipe, a replay of endless NUL bytes, a device given as a capture, a sink standing by for the
index's writer role, a reducer waiting for a Kafka that does not answer. And ``tracker demo`` never deletes an index
another writer holds. No services needed: the Kafka here is an address nothing listens on, on purpose."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.lifecycles import generate_stream
from tests.service.test_replay_signals import committed_runs
from tracker.shell import jsonio
from tracker.shell.index import ExperimentIndex
from tracker.shell.index_lock import WRITER_BUSY_EXIT

STOP_WITHIN_S = 5.0  # issue 27: every process stops within 5 s of the signal
READY_S = 120.0  # how long a process may take to reach the state it is signalled in (a busy 2-core machine)
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
CLI = "import sys; from tracker.cli import main; sys.exit(main(sys.argv[1:]))"
HOLD = ("import sys, time\nfrom tracker.shell.index import ExperimentIndex\n"
        "with ExperimentIndex(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)")


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")}
    out.update(extra)
    return out


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The test's processes; any still running at the end is killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def start(procs: list[subprocess.Popen[bytes]], *argv: str, stdin: int | object = subprocess.DEVNULL,
          **extra: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", CLI, *argv], stdin=stdin, stdout=subprocess.PIPE,  # type: ignore[arg-type]
                         stderr=subprocess.PIPE, env=env(**extra))
    procs.append(p)
    return p


def holding(procs: list[subprocess.Popen[bytes]], index: Path) -> None:
    """A process that holds the writer role of ``index`` until the test ends."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(index)], stdout=subprocess.PIPE, env=env())
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == b"held"


def wait_for_line(p: subprocess.Popen[bytes], needle: str) -> list[str]:
    """Read ``p``'s stderr until a line holds ``needle`` (the lines read); fails if it ends first."""
    assert p.stderr is not None
    lines: list[str] = []
    while line := p.stderr.readline().decode():
        lines.append(line)
        if needle in line:
            return lines
    pytest.fail(f"exited {p.wait()} before saying {needle!r}:\n{''.join(lines)}")


def signal_and_wait(p: subprocess.Popen[bytes], sig: signal.Signals) -> tuple[int, str]:
    """Send ``sig``; the exit code and the rest of stderr. A process still running ``STOP_WITHIN_S`` after it is
    killed and fails the test."""
    p.send_signal(sig)
    try:
        p.wait(STOP_WITHIN_S)  # stdin stays open: a pipe's end must not be what stops it
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)
        pytest.fail(f"still running {STOP_WITHIN_S:g} s after {sig.name}")
    assert p.stderr is not None
    return p.returncode, p.stderr.read().decode()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(err: str) -> list[str]:
    return [json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]


# ------------------------------------------------------------------------------------------ tracker replay


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_replay_of_a_quiet_pipe_commits_what_it_read_and_stops(procs: list[subprocess.Popen[bytes]], tmp_path: Path,
                                                               sig: signal.Signals) -> None:
    """``kubectl get -w ... | tracker replay -``: the pipe stays open and quiet. What was written is folded and
    committed while the pipe waits; a signal stops the replay at once with 128 + the signal and one line (it used to
    sit in a read of standard input on the event loop: nothing committed, every signal ignored)."""
    index = tmp_path / "index.sqlite"
    p = start(procs, "replay", "-", "--index", str(index), stdin=subprocess.PIPE)
    assert p.stdin is not None
    p.stdin.write(b"".join(jsonio.dumps(r) + b"\n" for r in generate_stream(5, 3)))
    p.stdin.flush()  # and the pipe stays open, with nothing more in it
    deadline = time.monotonic() + READY_S
    while committed_runs(index) < 5 and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert committed_runs(index) == 5, "what was read from the pipe is not committed while it waits"
    code, err = signal_and_wait(p, sig)
    assert code == 128 + sig, (code, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: replay stopped by {sig.name} after "), err
    assert "(the last from stdin:" in lines[0]
    assert committed_runs(index) == 5


def test_replay_of_endless_nul_bytes_makes_bad_records_and_stops(procs: list[subprocess.Popen[bytes]],
                                                                  tmp_path: Path) -> None:
    """``tracker replay - < /dev/zero``: no newline, ever. Every ``MAX_VALUE_BYTES`` of it is a dead letter (it used
    to drain without end on the event loop: a core spun, nothing was written, SIGTERM was ignored)."""
    index = tmp_path / "index.sqlite"
    dead = tmp_path / "index.dead-letters.jsonl"
    with open("/dev/zero", "rb") as zeros:
        p = start(procs, "replay", "-", "--index", str(index), stdin=zeros)
    deadline = time.monotonic() + READY_S
    while (not dead.exists() or dead.read_bytes().count(b"\n") < 2) and p.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert dead.exists() and dead.read_bytes().count(b"\n") >= 2, "no dead letter for a stream of NUL bytes"
    code, err = signal_and_wait(p, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, (code, err)
    assert len(err.strip().splitlines()) == 1 and "replay stopped by SIGTERM" in err and "Traceback" not in err
    letters = [json.loads(line) for line in dead.read_text().splitlines()]
    assert all(dl["source"] == "stdin:1" and dl["reason"].startswith("value too large") for dl in letters)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_replay_refuses_a_device_given_by_name_in_one_line(tmp_path: Path, device: str) -> None:
    """A device never ends (``/dev/zero``, ``/dev/urandom``) or is not a capture: refused at once, exit 2 (it used
    to spin a core until SIGKILL)."""
    try:
        done = subprocess.run([sys.executable, "-c", CLI, "replay", device, "--index", str(tmp_path / "i.sqlite")],
                              capture_output=True, text=True, timeout=60, env=env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"`tracker replay {device}` still running after 60 s")
    assert done.returncode == 2, done
    assert done.stderr == f"error: capture {device} is a character device: give a regular file, a pipe or - " \
                          "(standard input)\n"
    assert not (tmp_path / "i.sqlite").exists()


# ------------------------------------------------------------------------------------------ services


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_sink_index_standing_by_for_the_writer_lock_stops_on_the_first_signal(
        procs: list[subprocess.Popen[bytes]], tmp_path: Path, sig: signal.Signals) -> None:
    """A second ``tracker sink index`` on an index waits without a bound for the writer role; the first signal
    ends the wait and the process (exit 0, "stopped"). It used to wait on: SIGTERM and SIGINT took the whole
    ``ops.shutdown_timeout_s`` (30 s) and exited 1, SIGHUP killed it."""
    index = tmp_path / "index.sqlite"
    holding(procs, index)
    p = start(procs, "sink", "index", "--index", str(index), "--bootstrap-servers", f"127.0.0.1:{closed_port()}")
    wait_for_line(p, "sink_index_waits_for_writer")
    code, err = signal_and_wait(p, sig)
    assert code == 0, (code, err)
    assert "Traceback" not in err
    assert events(err)[-3:] == ["shutting_down_gracefully", "sink_stopped", "stopped"], err


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_reduce_waiting_for_kafka_stops_on_the_first_signal(procs: list[subprocess.Popen[bytes]],
                                                            sig: signal.Signals) -> None:
    """``tracker reduce`` while Kafka does not answer retries its connection with backoff; a signal ends the
    retries (exit 0, "stopped"). It used to retry on until they ran out (about 30 s) and exit 1."""
    p = start(procs, "reduce", "--bootstrap-servers", f"127.0.0.1:{closed_port()}")
    wait_for_line(p, "kafka_call_retrying")
    code, err = signal_and_wait(p, sig)
    assert code == 0, (code, err)
    assert "Traceback" not in err
    assert events(err)[-3:] == ["shutting_down_gracefully", "reducer_stopped", "stopped"], err


def test_serve_waiting_for_kafka_stops_on_the_first_signal(procs: list[subprocess.Popen[bytes]],
                                                           tmp_path: Path) -> None:
    """``tracker serve`` with Kafka stops in data-flow order, draining the reducer and the sinks; a part that has
    not connected yet has nothing to drain and gives up connecting (exit 0). The reducer used to retry on (about
    30 s, asked to drain) and the process exit 1."""
    p = start(procs, "serve", "--bootstrap-servers", f"127.0.0.1:{closed_port()}", "--from-capture", "-",
              "--index", str(tmp_path / "index.sqlite"), stdin=subprocess.PIPE)
    wait_for_line(p, "kafka_call_retrying")
    code, err = signal_and_wait(p, signal.SIGTERM)
    assert code == 0, (code, err)
    assert "Traceback" not in err
    assert events(err)[-4:] == ["shutting_down_gracefully", "reducer_stopped", "sink_stopped", "stopped"], err


# ------------------------------------------------------------------------------------------ tracker demo


def test_demo_never_deletes_an_index_another_writer_holds(procs: list[subprocess.Popen[bytes]],
                                                          tmp_path: Path) -> None:
    """``tracker demo`` replaces an index it made; it used to delete it without the writer role, under a writer
    that was using it. Now it takes the role first and refuses at once in one line, exit 75."""
    index = tmp_path / "demo.sqlite"
    with ExperimentIndex(index) as made:
        made.set_meta("created_by_demo", "true")
    before = index.read_bytes()
    holding(procs, index)
    done = subprocess.run([sys.executable, "-c", CLI, "demo", "--index", str(index)], capture_output=True, text=True,
                          timeout=120, env=env())
    assert done.returncode == WRITER_BUSY_EXIT, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: experiment index {index} is being written by another "
                                                   "writer (pid "), done.stderr
    assert index.exists() and index.read_bytes() == before


# ------------------------------------------------------------------------------------------ one-shot commands


def test_doctor_interrupted_while_kafka_does_not_answer_says_so_in_one_line(
        procs: list[subprocess.Popen[bytes]]) -> None:
    """``tracker doctor`` waits up to ``--timeout`` for each call; a SIGINT meanwhile is one line and exit 130 (it
    used to be a KeyboardInterrupt traceback). The broker here accepts connections and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        p = start(procs, "doctor", "--skip", "kube", "--skip", "adx", "--timeout", "120",
                  "--bootstrap-servers", f"127.0.0.1:{silent.getsockname()[1]}")
        silent.settimeout(READY_S)
        conn, _ = silent.accept()  # the doctor's Kafka check connected: it waits for an answer now
        with conn:
            assert p.poll() is None, "doctor ended before it could be interrupted"
            code, err = signal_and_wait(p, signal.SIGINT)
    assert code == 128 + signal.SIGINT, (code, err)
    assert err == "error: interrupted (SIGINT)\n"
