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


@pytest.fixture(autouse=True)
def _shared_empties_stay_empty() -> Iterator[None]:
    """The pod side's shared empty containers (``tracker.core.derive_pods``) are never changed: one changed would give
    its items to every attempt made after."""
    yield
    from tracker.core import derive_pods

    changed = [name for name in ("_NO_ITEMS", "_NO_LOSSES", "_NO_UIDS") if len(getattr(derive_pods, name))]
    assert not changed, f"shared empty containers of tracker.core.derive_pods changed: {changed}"


def pytest_sessionstart(session: pytest.Session) -> None:
    """The compiled core's run (``python -m tests.compiled``) sets TRACKER_EXPECT_COMPILED_CORE: there, every module
    the build compiles must be loaded from its extension module, or the run would test the pure core again."""
    import os

    if os.environ.get("TRACKER_EXPECT_COMPILED_CORE") != "1":
        return
    import importlib

    from tracker.shell import compiled_core

    names = compiled_core.compiled_modules()
    pure = [n for n in names if not str(importlib.import_module(n).__file__).endswith(".so")]
    if pure or not names:
        raise pytest.UsageError(f"TRACKER_EXPECT_COMPILED_CORE=1 but {len(pure)} of {len(names)} core modules are "
                                f"plain Python: {', '.join(pure[:5])}")
