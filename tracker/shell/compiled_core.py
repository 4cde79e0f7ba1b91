"""The compiled core: which modules of ``tracker.core`` mypyc compiles, and whether a build in the tree is current.

The core runs as plain Python by default. ``./run compile`` (``deploy/compiled/build_core.py``) compiles the
modules of ``compiled_modules()`` with mypyc into extension modules beside their sources, which Python then imports
instead of the ``.py`` files, and writes a manifest (``MANIFEST``): the hash of each compiled module's source.
``./run compile --clean`` removes them again. The container image builds it with ``--build-arg TRACKER_CORE=compiled``.

An extension module is not rebuilt when its source changes (a ``git pull``, an edit): it would go on running the old
code. ``check`` therefore runs before every command (``tracker.cli``) and refuses, in one line, a tree whose
compiled modules do not match their sources. A tree without any compiled module costs one directory listing.

Kept as plain Python (``PURE_ONLY``): the modules whose classes pydantic builds or describes (mypyc does not compile
them) and the package's ``__init__``.
"""

from __future__ import annotations

import os
from importlib import machinery
from pathlib import Path
from typing import Any

from tracker import errors

CORE_DIR = Path(__file__).resolve().parent.parent / "core"
GROUP = "tracker_core"  # mypyc's shared library of the build: ``tracker_core__mypyc.*.so``, beside the package
MANIFEST = "compiled-core.json"  # in CORE_DIR
MANIFEST_VERSION = 1
# modules whose classes pydantic builds or describes (models; model.py's dataclasses with pydantic annotations and its
# lazy re-exports), which mypyc does not compile; __init__ is empty
PURE_ONLY = frozenset({"__init__", "dead_letter", "intake", "model", "stuck"})
_EXTENSIONS = tuple(machinery.EXTENSION_SUFFIXES)


class StaleCompiledCore(errors.ConfigError):
    """Compiled core modules that do not match their sources: the tree would run other code than it shows."""

    exit_code = 2


class CoreBuild:
    """What the tree's core runs as: ``compiled`` names the modules loaded from mypyc extension modules. (A plain
    class: every command imports this module first, and ``dataclasses`` would cost its start-up 10 ms.)"""

    __slots__ = ("compiled", "compiler")

    def __init__(self, compiled: tuple[str, ...], compiler: str = "") -> None:
        self.compiled = compiled
        self.compiler = compiler

    def describe(self) -> str:
        if not self.compiled:
            return "pure Python (./run compile builds it with mypyc)"
        return f"compiled with {self.compiler or 'mypyc'}: {len(self.compiled)} modules of tracker.core"


def compiled_modules(core_dir: Path | None = None) -> list[str]:
    """The module names (``tracker.core.x``) that a build compiles: every module of the core but ``PURE_ONLY``."""
    core_dir = core_dir or CORE_DIR
    return sorted(f"tracker.core.{p.stem}" for p in core_dir.glob("*.py") if p.stem not in PURE_ONLY)


def source_hash(path: Path) -> str:
    import hashlib  # only where a build is there: a tree without one costs a directory listing

    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(core_dir: Path, compiler: str) -> Path:
    """The manifest of a build just made: each compiled module's source hash (``deploy/compiled/build_core.py``)."""
    import json

    modules = {name: source_hash(core_dir / f"{name.rsplit('.', 1)[1]}.py") for name in compiled_modules(core_dir)}
    path = core_dir / MANIFEST
    path.write_text(json.dumps({"version": MANIFEST_VERSION, "compiler": compiler, "modules": modules},
                               indent=2, sort_keys=True) + "\n")
    return path


def extension_stems(core_dir: Path) -> set[str]:
    """The module names (stems) of the extension modules in ``core_dir``."""
    with os.scandir(core_dir) as entries:
        return {e.name.split(".", 1)[0] for e in entries if e.name.endswith(_EXTENSIONS)}


def clean(core_dir: Path | None = None) -> list[Path]:
    """Remove a build's extension modules and manifest from ``core_dir`` and its shared library from beside the
    package; the paths removed."""
    core_dir = core_dir or CORE_DIR
    gone = [p for p in core_dir.iterdir() if p.name.endswith(_EXTENSIONS) or p.name == MANIFEST]
    gone += [p for p in core_dir.parent.parent.glob(f"{GROUP}__mypyc.*") if p.name.endswith(_EXTENSIONS)]
    for p in gone:
        p.unlink()
    return gone


def check(core_dir: Path | None = None) -> CoreBuild:
    """What the core (``core_dir``, by default the package's) runs as, or ``StaleCompiledCore`` (one line, the
    remedy in it) when a compiled module's source changed since it was built, or extension modules are there
    without a manifest."""
    core_dir = core_dir or CORE_DIR
    stems = extension_stems(core_dir)
    if not stems:
        return CoreBuild(())
    import json

    redo = "run ./run compile again, or ./run compile --clean to run the core as plain Python"
    manifest = core_dir / MANIFEST
    try:
        data: Any = json.loads(manifest.read_text())
        modules = data["modules"]
        compiler = str(data.get("compiler", ""))
        if data.get("version") != MANIFEST_VERSION or not isinstance(modules, dict):
            raise ValueError(f"version {data.get('version')!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StaleCompiledCore(f"compiled core modules in {core_dir} without a readable {MANIFEST} "
                                f"({type(exc).__name__}): {redo}") from None
    compiled = []
    for stem in sorted(stems):
        name = f"tracker.core.{stem}"
        source = core_dir / f"{stem}.py"
        if name not in modules:  # left by another build (of other sources): it would run code nobody compiled here
            raise StaleCompiledCore(f"an extension module of {name} that no build of these sources made; {redo}")
        if not source.exists() or source_hash(source) != modules[name]:
            raise StaleCompiledCore(f"the compiled core is older than its source: {source.name} changed since "
                                    f"it was compiled; {redo}")
        compiled.append(name)
    return CoreBuild(tuple(compiled), compiler)
