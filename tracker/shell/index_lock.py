"""One writer per experiment index: the writer role, held for the whole life of a writer, across processes.

SQLite serialises transactions, but a writer's life is longer than one: a replay restores the reducer from the
index's state, folds its records and writes histories and state back (``runtime.replay.fold``). Two writers at
once each restored the same state, and each wrote over the other's runs and state: both exited 0 and the index
missed hundreds of rows (issue 27). So ``ExperimentIndex`` takes the writer role when it opens and keeps it until it
closes: an exclusive ``flock`` on ``<index>.writer.lock`` beside the index (created 0600 and never deleted, so no
writer races another's delete; it holds the holder's pid and host, for the messages). The kernel frees the lock
when its holder exits, even by SIGKILL. Readers (``tracker.read``) never take it, so they need no write access and
never wait.

A second writer waits up to ``index.writer_wait_s`` (one line on stderr says for whom), then goes on, or stops
with ``WriterBusy``: one line naming the index and the writer that holds it, exit ``WRITER_BUSY_EXIT`` (75,
EX_TEMPFAIL: try again later). ``tracker sink index`` waits without a bound: a second sink on one index file
stands by until the first exits. A wait is never deaf to a stop: its ``stop`` event (a SIGTERM to the standing-by
sink sets it) ends it within ``_POLL_S`` (0.1 s) with ``WaitStopped``, and the process stops as asked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tracker import errors

__all__ = ["WRITER_BUSY_EXIT", "WaitStopped", "WriterBusy", "WriterLock", "lock_path"]

WRITER_BUSY_EXIT = 75  # EX_TEMPFAIL (sysexits.h): another writer holds the index; try again later
_POLL_S = 0.1


class WriterBusy(errors.Fatal, RuntimeError):
    """Another writer holds the index and did not let go within ``index.writer_wait_s`` (exit 75)."""

    exit_code = WRITER_BUSY_EXIT


class WaitStopped(errors.TrackerError):
    """A wait for the writer role ended by its ``stop`` event (a SIGTERM to a standing-by ``tracker sink index``):
    nothing was taken, the caller stops as it was asked to."""


def lock_path(index_path: Path) -> Path:
    """The writer lock file of the index at ``index_path``: ``<index>.writer.lock``."""
    return index_path.with_name(index_path.name + ".writer.lock")


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class WriterLock:
    """The writer role of one index, taken by ``acquire`` and given back by ``release`` (or by the process's end).

    ``wait_s``: how long to wait for another writer (0: refuse at once; None: without a bound). ``on_wait``: told
    once, in one line, that this writer waits (default: stderr). ``stop``: set (from another thread: a signal
    handler's loop), it ends the wait within ``_POLL_S`` with ``WaitStopped``."""

    def __init__(self, index_path: Path, *, wait_s: float | None = 30.0,
                 on_wait: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> None:
        self.path = lock_path(index_path)
        self.index_path = index_path
        self.wait_s = wait_s
        self.on_wait = on_wait or _say
        self.stop = stop or threading.Event()
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            self._take(fd)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except BaseException:
            os.close(fd)  # frees the lock too, if taken
            raise
        self._fd = fd

    def _take(self, fd: int) -> None:
        deadline = None if self.wait_s is None else time.monotonic() + self.wait_s
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                waited = f" after waiting {self.wait_s:g} s" if self.wait_s else ""
                raise WriterBusy(f"experiment index {self.index_path} is being written by another writer "
                                 f"({self._holder(fd)}){waited}: one writer per index; try again when it is done, "
                                 "or raise index.writer_wait_s") from None
            if not said:
                bound = "" if deadline is None else f" (at most {self.wait_s:g} s, index.writer_wait_s)"
                self.on_wait(f"waiting for the writer of {self.index_path} ({self._holder(fd)}) to finish{bound}")
                said = True
            if self.stop.wait(_POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))):
                raise WaitStopped(f"stopped waiting for the writer of {self.index_path} ({self._holder(fd)})")

    def _holder(self, fd: int) -> str:
        with contextlib.suppress(OSError):
            text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            if text:
                return text
        return f"see {self.path}"

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # the lock goes with the descriptor; the file stays (never deleted)
