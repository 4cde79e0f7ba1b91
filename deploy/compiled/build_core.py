"""Compile the tracker's core with mypyc, in place (``./run compile``; ``--clean`` removes the build).

Each module of ``tracker.shell.compiled_core.compiled_modules()`` becomes an extension module beside its source,
which Python imports instead of the ``.py`` file; mypyc's shared library (``tracker_core__mypyc.*.so``) goes beside
the ``tracker`` package, and ``tracker/core/compiled-core.json`` records each source's hash, so that ``tracker``
refuses to run a build older than its sources (``compiled_core.check``). Needs a C compiler and the Python headers
(a uv-managed or distribution Python with its ``-dev`` package), mypy (which ships mypyc) and setuptools: the
``compile`` dependency group (``uv sync --group compile``; the dev group includes it).

Usage (from the repository root): ``python deploy/compiled/build_core.py [--clean] [--jobs N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tracker.shell import compiled_core  # noqa: E402  (the repository's package, not an installed one)

BUSY = 75  # EX_TEMPFAIL, as a second writer of an index: try again later


@contextlib.contextmanager
def _only_build() -> Iterator[bool]:
    """Whether this is the only ``./run compile`` of the tree (a lock beside the manifest, held while it runs): two
    at once would each clean and then build in place, one deleting what the other writes."""
    with open(compiled_core.CORE_DIR / "compiled-core.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _compile(work: Path, jobs: int) -> None:
    """mypyc and the C compiler, in this process (``--inner``): the parent keeps their chatter unless they fail."""
    from mypyc.build import mypycify
    from setuptools import setup  # type: ignore[import-untyped]

    paths = [str(Path("tracker/core") / f"{m.rsplit('.', 1)[1]}.py") for m in compiled_core.compiled_modules()]
    os.chdir(ROOT)  # build_ext --inplace writes beside the sources, found from here
    extensions = mypycify(paths, opt_level="3", group_name=compiled_core.GROUP, multi_file=True,
                          target_dir=str(work / "c"))
    setup(name="tracker-core-compiled", packages=[], py_modules=[], ext_modules=extensions,
          script_args=["build_ext", "--inplace", "--build-temp", str(work / "o"), "--parallel", str(jobs)])


def build(jobs: int) -> int:
    try:
        import mypy.version
        import setuptools  # noqa: F401
    except ImportError as exc:
        sys.stderr.write(f"error: {exc.name} is missing: install the compile group (uv sync --group compile)\n")
        return 2
    removed = compiled_core.clean()  # a build of other sources must not be half-replaced
    count = len(compiled_core.compiled_modules())
    print(f"==> compiling {count} modules of tracker.core with mypyc {mypy.version.__version__} "
          f"({len(removed)} files of an earlier build removed); about a minute on 2 cores", file=sys.stderr)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tracker-mypyc-") as work:
        done = subprocess.run([sys.executable, __file__, "--inner", work, "--jobs", str(jobs)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' own build folder, if it left one
    if done.returncode != 0:
        sys.stderr.write("".join(done.stdout.splitlines(keepends=True)[-40:]))
        compiled_core.clean()
        sys.stderr.write(f"error: the compilation failed (exit {done.returncode}, its last lines above); "
                         "the core stays plain Python\n")
        return 1
    manifest = compiled_core.write_manifest(compiled_core.CORE_DIR, f"mypyc {mypy.version.__version__}")
    build_state = compiled_core.check()
    print(f"==> {build_state.describe()} in {time.monotonic() - started:.0f} s; manifest {manifest.relative_to(ROOT)}",
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled core: run it as plain Python")
    parser.add_argument("--inner", metavar="DIR", help=argparse.SUPPRESS)  # the compilation itself, in DIR
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="C compilations at once (default: the CPUs)")
    args = parser.parse_args(argv)
    if args.inner:
        _compile(Path(args.inner), args.jobs)
        return 0
    with _only_build() as alone:
        if not alone:
            sys.stderr.write("error: another ./run compile is building or removing this tree's compiled core; "
                             "run this again once it is done\n")
            return BUSY
        if args.clean:
            removed = compiled_core.clean()
            print(f"==> removed {len(removed)} files: the core runs as plain Python", file=sys.stderr)
            return 0
        return build(args.jobs)


if __name__ == "__main__":
    sys.exit(main())
