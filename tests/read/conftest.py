"""What the reading commands' tests share: no ``TRACKER_INDEX`` or ``COLUMNS`` from the environment that runs them
(a module that wants a width sets ``COLUMNS`` in a fixture of its own, which runs after this one), and the bundled
demo replayed once per module into an index of its own (a module that needs another index defines its own ``index``
fixture, which wins)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from tracker.cli.args import DEMO_CAPTURES
from tracker.runtime.replay import replay


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACKER_INDEX", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's captures replayed into a fresh index (``tracker replay``, quiet)."""
    path = tmp_path_factory.mktemp("idx") / "index.sqlite"
    replay(captures=[DEMO_CAPTURES], index_path=path, console=Console(quiet=True), quiet=True)
    return path
