"""Detached child processes that are tracked, and stopped, by pid only."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


class InfraError(RuntimeError):
    """Something in the test environment could not be built, started or reached."""


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`, held for the `with` block (across processes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def log(message: str) -> None:
    print(f"[testenv] {message}", file=sys.stderr, flush=True)


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes)}m{secs:04.1f}s" if minutes else f"{secs:.1f}s"


def free_port() -> int:
    """A loopback port that was free a moment ago (the usual race is acceptable for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"


def _start_time(pid: int) -> int | None:
    """Kernel start time of `pid` in clock ticks, or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses; fields after it are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Process:
    """A process we started; `start_time` guards against signalling a recycled pid."""

    name: str
    pid: int
    start_time: int
    log: str

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start_time

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; reaps the child if it is ours."""
        if not self.alive():
            self._reap()
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._reap()
            if not self.alive():
                return
            time.sleep(0.1)
        log(f"{self.name} (pid {self.pid}) ignored SIGTERM for {timeout:.0f}s, killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        while self.alive():
            self._reap()
            time.sleep(0.05)

    def _reap(self) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Process:
        return cls(name=data["name"], pid=data["pid"], start_time=data["start_time"], log=data["log"])


def spawn(name: str, argv: Sequence[str | Path], *, log_path: Path, env: Mapping[str, str] | None = None) -> Process:
    """Start `argv` in its own session with stdout and stderr appended to `log_path`; `env` replaces the
    environment it inherits."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        popen = subprocess.Popen(
            [str(arg) for arg in argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else dict(env),
        )
    start_time = _start_time(popen.pid)
    if start_time is None:
        popen.wait()
        raise InfraError(f"{name} exited immediately (rc={popen.returncode}):\n{tail(log_path)}")
    # The Popen object is dropped on purpose: the process outlives this Python process when
    # started by the CLI, and Process.stop() reaps it when started by a pytest session.
    return Process(name=name, pid=popen.pid, start_time=start_time, log=str(log_path))


class Launcher:
    """Starts the processes of one component; stops all of them again if start-up fails half-way."""

    def __init__(self) -> None:
        self.processes: list[Process] = []

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is not None:
            for process in reversed(self.processes):
                process.stop()

    def spawn(
        self, name: str, argv: Sequence[str | Path], *, log_path: Path, env: Mapping[str, str] | None = None
    ) -> Process:
        process = spawn(name, argv, log_path=log_path, env=env)
        self.processes.append(process)
        return process


def wait_for(
    what: str,
    ready: Callable[[], bool],
    *,
    timeout: float,
    process: Process | None = None,
) -> None:
    """Poll `ready` until it is true; fail early with the log tail if `process` dies."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        if process is not None and not process.alive():
            raise InfraError(f"{process.name} exited while waiting for {what}:\n{tail(Path(process.log))}")
        if time.monotonic() > deadline:
            detail = f"\n{tail(Path(process.log))}" if process is not None else ""
            raise InfraError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(0.2)


def run(argv: Sequence[str | Path], *, what: str) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion; raise with its output if it fails."""
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise InfraError(f"{what} failed (rc={result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """True if GET `url` answers 200 within two seconds."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
