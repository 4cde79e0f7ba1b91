"""The error tree drawn in ``tracker/errors.py`` is the tree of the classes: every class that derives from
``TrackerError`` (in any tracker module) is drawn under its real parent, with its real module, and nothing drawn is
missing; every ``Fatal`` carries an int exit code."""

from __future__ import annotations

import gc
import importlib
import pkgutil
import re

import tracker
from tracker import errors

_ENTRY = re.compile(r"^(?P<lead>[\s│]*)(?:[├└]── )?(?P<name>[A-Za-z_][\w.]*)")


def drawn_tree() -> dict[str, str | None]:
    """Each drawn name (``module.Class`` relative to ``tracker``, or a class of ``tracker.errors`` alone) and the
    drawn name of its parent (None for the root), from the indentation of the docstring's picture."""
    doc = errors.__doc__ or ""
    picture = doc.split("::", 1)[1].split("\n\n", 2)[1]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in picture.splitlines():
        if "── " not in line and line.strip() != "TrackerError":
            continue  # a description's continuation
        m = _ENTRY.match(line)
        assert m is not None, line
        depth = len(line[:line.index(m.group("name"))])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        name = m.group("name")
        assert name not in parents, f"{name} is drawn twice"
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def every_error_class() -> set[type[errors.TrackerError]]:
    for info in pkgutil.walk_packages(tracker.__path__, "tracker."):
        if not info.name.endswith(".__main__"):  # a program, not a module: importing it runs it
            importlib.import_module(info.name)
    found: set[type[errors.TrackerError]] = set()
    todo: list[type[errors.TrackerError]] = [errors.TrackerError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("tracker."):  # not a test's own subclass
            found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def drawn_name(cls: type) -> str:
    """The name a class is drawn by: its module relative to ``tracker`` (none for ``tracker.errors``) and its name."""
    module = cls.__module__.removeprefix("tracker.")
    return cls.__qualname__ if module == "errors" else f"{module}.{cls.__qualname__}"


def real_name(drawn: str) -> str:
    module, _, name = drawn.rpartition(".")
    return f"{module}.{name}" if module else name


def problems() -> list[str]:
    """How the drawn tree and the classes differ (empty: they agree)."""
    drawn = {real_name(name): None if parent is None else real_name(parent)
             for name, parent in drawn_tree().items()}
    classes = {drawn_name(cls): cls for cls in every_error_class()}
    out = [f"{name}: not drawn in tracker/errors.py" for name in sorted(set(classes) - set(drawn))]
    out += [f"{name}: drawn in tracker/errors.py, but no such class" for name in sorted(set(drawn) - set(classes))]
    for name, cls in sorted(classes.items()):
        bases = [drawn_name(b) for b in cls.__bases__ if issubclass(b, errors.TrackerError)]
        expected = bases or [None]
        if name in drawn and drawn[name] not in expected:
            out.append(f"{name}: drawn under {drawn[name]}, its parents are {expected}")
    return out


def test_every_error_class_is_drawn_under_its_parent_and_nothing_else_is() -> None:
    assert problems() == []


def test_every_fatal_carries_an_int_exit_code() -> None:
    fatal = [cls for cls in every_error_class() if issubclass(cls, errors.Fatal)]
    assert errors.Fatal in fatal and len(fatal) > 10
    for cls in fatal:
        assert isinstance(cls.exit_code, int) and not isinstance(cls.exit_code, bool), cls
        assert cls.exit_code != 0, cls


def test_the_tree_check_sees_a_class_left_out() -> None:
    """The check is real: a tracker class that the picture lacks is reported."""
    unlisted = type("Unlisted", (errors.InvalidInput,), {"__module__": "tracker.shell.unlisted"})
    try:
        assert problems() == ["shell.unlisted.Unlisted: not drawn in tracker/errors.py"]
    finally:
        del unlisted
        gc.collect()
    assert problems() == []
