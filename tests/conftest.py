from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog

pytest_plugins = ["tests.infra.fixtures"]


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Commands run in-process (``run_process``, ``tracker doctor``) configure logging for their process, to stderr:
    they must not leave the root logger writing to a test's captured stderr, which is closed once the test ends."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    config = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)
