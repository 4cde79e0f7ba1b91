"""The compiled core's guard (``tracker.shell.compiled_core``): a tree runs its core as plain Python, or compiled
from exactly its sources, and says which; a build older than its sources is refused in one line before any command.

The build itself (mypyc, a C compiler) is exercised by ``python -m tests.compiled``, which ``./run test`` runs after
this suite: here the extension modules are stand-in files, which is all the guard reads."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import machinery
from pathlib import Path

import pytest

from tracker.cli import main
from tracker.shell import compiled_core

SUFFIX = machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so


def _core(tmp_path: Path) -> Path:
    """A core folder of three modules (one of them kept plain Python), as a checkout has it."""
    core = tmp_path / "tracker" / "core"
    core.mkdir(parents=True)
    for name in ("__init__", "reducer", "extract", "model"):
        (core / f"{name}.py").write_text(f"# {name}\n")
    return core


def _build(core: Path) -> None:
    """What ``build_core.py`` leaves: an extension module per compiled module, the shared library, the manifest."""
    for name in compiled_core.compiled_modules(core):
        (core / f"{name.rsplit('.', 1)[1]}{SUFFIX}").write_bytes(b"\x7fELF")
    (core.parent.parent / f"{compiled_core.GROUP}__mypyc{SUFFIX}").write_bytes(b"\x7fELF")
    compiled_core.write_manifest(core, "mypyc 9.9")


def test_the_build_compiles_every_core_module_but_the_pydantic_ones_and_init(tmp_path: Path) -> None:
    assert compiled_core.compiled_modules(_core(tmp_path)) == ["tracker.core.extract", "tracker.core.reducer"]
    real = compiled_core.compiled_modules()
    assert "tracker.core.reducer" in real and "tracker.core.derive" in real and "tracker.core.redact" in real
    assert not {"tracker.core.model", "tracker.core.intake", "tracker.core.__init__"} & set(real)
    assert all((compiled_core.CORE_DIR / f"{m.rsplit('.', 1)[1]}.py").is_file() for m in real)
    for kept in compiled_core.PURE_ONLY - {"__init__"}:  # each is kept for the reason given: pydantic
        assert "from pydantic import" in (compiled_core.CORE_DIR / f"{kept}.py").read_text(), kept


def test_a_tree_without_extension_modules_is_pure_python(tmp_path: Path) -> None:
    state = compiled_core.check(_core(tmp_path))
    assert state.compiled == () and state.describe().startswith("pure Python")


def test_a_build_of_these_sources_is_compiled_and_says_so(tmp_path: Path) -> None:
    core = _core(tmp_path)
    _build(core)
    state = compiled_core.check(core)
    assert state.compiled == ("tracker.core.extract", "tracker.core.reducer")
    assert state.describe() == "compiled with mypyc 9.9: 2 modules of tracker.core"
    manifest = json.loads((core / compiled_core.MANIFEST).read_text())
    assert set(manifest["modules"]) == {"tracker.core.extract", "tracker.core.reducer"}


def test_a_source_changed_after_the_build_is_refused_in_one_line(tmp_path: Path) -> None:
    core = _core(tmp_path)
    _build(core)
    (core / "reducer.py").write_text("# reducer, edited\n")
    with pytest.raises(compiled_core.StaleCompiledCore) as caught:
        compiled_core.check(core)
    assert "reducer.py changed since it was compiled" in str(caught.value)
    assert "./run compile" in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2
    (core / "reducer.py").unlink()  # a compiled module whose source is gone is as stale
    with pytest.raises(compiled_core.StaleCompiledCore, match=r"reducer\.py changed"):
        compiled_core.check(core)


def test_an_extension_module_the_manifest_does_not_name_is_refused(tmp_path: Path) -> None:
    """One left by another build (say, of a module since kept plain Python): it would shadow its source."""
    core = _core(tmp_path)
    _build(core)
    (core / f"model{SUFFIX}").write_bytes(b"\x7fELF")
    with pytest.raises(compiled_core.StaleCompiledCore, match=r"tracker\.core\.model that no build of these sources"):
        compiled_core.check(core)


@pytest.mark.parametrize("manifest", [None, "{not json", '{"version": 99, "modules": {}}', '{"version": 1}'])
def test_extension_modules_without_a_readable_manifest_are_refused(tmp_path: Path, manifest: str | None) -> None:
    core = _core(tmp_path)
    _build(core)
    if manifest is None:
        (core / compiled_core.MANIFEST).unlink()
    else:
        (core / compiled_core.MANIFEST).write_text(manifest)
    with pytest.raises(compiled_core.StaleCompiledCore, match=r"without a readable compiled-core\.json"):
        compiled_core.check(core)


def test_clean_removes_the_build_and_leaves_the_sources(tmp_path: Path) -> None:
    core = _core(tmp_path)
    _build(core)
    removed = compiled_core.clean(core)
    assert len(removed) == 4  # two extension modules, the manifest, the shared library
    assert sorted(p.name for p in core.iterdir()) == ["__init__.py", "extract.py", "model.py", "reducer.py"]
    assert not list(tmp_path.glob(f"{compiled_core.GROUP}__mypyc*"))
    assert compiled_core.check(core).compiled == ()


def test_every_command_refuses_a_stale_build_before_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    core = _core(tmp_path)
    _build(core)
    (core / "extract.py").write_text("# extract, edited\n")
    monkeypatch.setattr(compiled_core, "CORE_DIR", core)
    index = tmp_path / "never-made.sqlite"
    assert main(["runs", "--index", str(index)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "extract.py changed since it was compiled" in err, err
    assert not index.exists()


def test_version_names_what_the_core_runs_as() -> None:
    done = subprocess.run([sys.executable, "-m", "tracker.cli", "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tracker ") and "; core: " in done.stdout
    assert compiled_core.check().describe() in done.stdout


def test_a_second_compile_of_the_tree_at_once_is_refused_in_one_line() -> None:
    """Two ``./run compile`` at once would each clean and then build in place; the second is refused (exit 75,
    try again later) while the first holds the tree's lock, and touches nothing."""
    import fcntl

    root = Path(__file__).resolve().parents[2]
    with open(compiled_core.CORE_DIR / "compiled-core.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = subprocess.run([sys.executable, str(root / "deploy" / "compiled" / "build_core.py"), "--clean"],
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 75, done.stderr
    assert done.stderr.splitlines() == ["error: another ./run compile is building or removing this tree's compiled "
                                        "core; run this again once it is done"]


def test_a_stale_extension_module_that_fails_to_load_is_the_one_line_too(tmp_path: Path) -> None:
    """An extension module of an older build may fail to load at all (here: not a shared object) before any command
    runs; the command line then says why in one line, exit 2, rather than with the import's traceback."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    tree = tmp_path / "tree"
    shutil.copytree(root / "tracker", tree / "tracker", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (tree / "tracker" / "core" / f"vocab{SUFFIX}").write_bytes(b"not a shared object")
    done = subprocess.run([sys.executable, "-c", "import tracker.cli, sys; sys.exit(tracker.cli.main(['runs']))"],
                          cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and "compiled" in line and "Traceback" not in done.stderr
