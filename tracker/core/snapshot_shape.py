"""The shape of a stored run snapshot, checked before the reducer takes it back (``Snapshots.restore_run``).

A snapshot comes back from storage (the index's ``reducer_runs`` and ``reducer_pods``, the ``run-state`` topic) as
JSON values that anything may have changed. ``check_run_snapshot`` and ``check_pod`` walk them against the format
``RunFacts.to_json`` / ``PodFacts.to_json`` / ``Snapshots.snapshot_run`` write, and raise
``errors.StoredStateError`` naming the first value that is not what the format says (its path inside the snapshot,
what was expected, what was found), so that the reducer never meets a value of a wrong type or out of range and
never fails later, in the middle of a fold, on stored state.

What "in range" means (the bounds the fold itself keeps):
- a time (microseconds since the epoch, UTC) lies within the years 1 to 9999 (``timefmt.MIN_US``..``MAX_US``);
- a count, an ordinal, a step, a resourceVersion is an integer of 0 to 2**63 - 1 (a signed 64-bit integer, as the
  index stores it); a bucket width is at least 1;
- a float is finite; a boolean is ``true`` or ``false`` (not 0 or 1);
- the watermark (``marks``) has exactly ``STREAM_COUNT`` times.

The check follows the specification down, never the data: its depth is that of the format, whatever the nesting of
the values. Keys the format does not know are ignored (a newer tracker's additions, within one version). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from tracker import errors
from tracker.core.retire import STREAM_COUNT
from tracker.core.timefmt import MAX_US, MIN_US

INT64_MAX = 2**63 - 1
# A check takes a value and its path in the snapshot; the path is None on the first, fast pass (no path text is built
# for the values that are fine), and a failure then checks again with paths to name the value (``_checked``).
Check = Callable[[Any, str | None], None]


class _Again(Exception):
    """A value failed on the fast pass: check again with paths."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(path: str | None, expected: str, value: Any) -> Exception:
    if path is None:
        return _Again()
    return errors.StoredStateError(f"{path or 'the snapshot'}: expected {expected}, found {_show(value)}")


def _at(path: str | None, key: object) -> str | None:
    """The path of an item or a key below ``path`` (None on the fast pass)."""
    if path is None:
        return None
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _checked(check: Check, value: Any, path: str) -> None:
    """``check`` on the fast pass, then, when it fails, again with paths (which raises StoredStateError)."""
    try:
        check(value, None)
    except _Again:
        check(value, path)
        raise errors.StoredStateError(f"{path or 'the snapshot'}: not of the format") from None  # a safety: not reached


def _int(lo: int, hi: int, what: str) -> Check:
    def check(v: Any, path: str | None) -> None:
        if not (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi):
            raise _bad(path, what, v)
    return check


TIME = _int(MIN_US, MAX_US, "a time in microseconds within the years 1 to 9999")
COUNT = _int(0, INT64_MAX, "an integer from 0 to 2**63-1")
WIDTH = _int(1, 2**63, "a bucket width of at least 1")
STEP = COUNT


def STR(v: Any, path: str | None) -> None:
    if not isinstance(v, str):
        raise _bad(path, "a string", v)


def BOOL(v: Any, path: str | None) -> None:
    if not isinstance(v, bool):
        raise _bad(path, "true or false", v)


def FLOAT(v: Any, path: str | None) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not math.isfinite(v)):
        raise _bad(path, "a finite number", v)


def one_of(*values: object) -> Check:
    """One of ``values``, of its type too (``true`` is not 1)."""
    def check(v: Any, path: str | None) -> None:
        if not any(v == x and type(v) is type(x) for x in values):
            raise _bad(path, "one of " + ", ".join(map(repr, values)), v)
    return check


def opt(inner: Check) -> Check:
    def check(v: Any, path: str | None) -> None:
        if v is not None:
            inner(v, path)
    return check


def list_of(inner: Check) -> Check:
    def check(v: Any, path: str | None) -> None:
        if not isinstance(v, list):
            raise _bad(path, "a list", v)
        if path is None:
            for item in v:
                inner(item, None)
        else:
            for i, item in enumerate(v):
                inner(item, f"{path}[{i}]")
    return check


def dict_of(inner: Check) -> Check:
    """An object of string keys (JSON's keys are strings) whose values ``inner`` checks."""
    def check(v: Any, path: str | None) -> None:
        if not isinstance(v, dict):
            raise _bad(path, "an object", v)
        if path is None:
            for item in v.values():
                inner(item, None)
        else:
            for k, item in v.items():
                inner(item, _at(path, k))
    return check


def row(*items: Check, optional: int = 0) -> Check:
    """A list of ``len(items)`` values (the last ``optional`` ones may be missing), each checked by its own."""
    def check(v: Any, path: str | None) -> None:
        if not (isinstance(v, list) and len(items) - optional <= len(v) <= len(items)):
            n = f"{len(items) - optional} to {len(items)}" if optional else str(len(items))
            raise _bad(path, f"a list of {n} values", v)
        if path is None:
            for item, c in zip(v, items, strict=False):
                c(item, None)
        else:
            for i, (item, c) in enumerate(zip(v, items, strict=False)):
                c(item, _at(path, i))
    return check


def fields(required: Mapping[str, Check], optional: Mapping[str, Check] | None = None) -> Check:
    """An object with every key of ``required`` and maybe those of ``optional``, each checked by its own."""
    def check(v: Any, path: str | None) -> None:
        if not isinstance(v, dict):
            raise _bad(path, "an object", v)
        for k, c in required.items():
            if k not in v:
                if path is None:
                    raise _Again()
                raise errors.StoredStateError(f"{_at(path, k)}: missing")
            c(v[k], _at(path, k))
        for k, c in (optional or {}).items():
            if k in v:
                c(v[k], _at(path, k))
    return check


def falsy_or(inner: Check) -> Check:
    """Older snapshots keep an empty value (None, [], {}) for what they did not have."""
    def check(v: Any, path: str | None) -> None:
        if v not in (None, [], {}):
            inner(v, path)
    return check


_COND = row(STR, STR, STR, TIME, STR, COUNT, optional=1)  # type, status, reason, lastTransitionTime, message, rv
_CONDS = list_of(_COND)
POD = row(STR, opt(STR), opt(STR), opt(TIME), opt(STR), opt(TIME),  # name, owner, ray cluster, created, node, bound
          opt(row(TIME, STR, STR)), opt(TIME),  # unschedulable, started
          opt(row(TIME, one_of("Succeeded", "Failed"), STR, _int(-(2**31), 2**31 - 1, "an exit code"), STR)),
          opt(TIME), BOOL, opt(STR), opt(COUNT), opt(COUNT), COUNT,  # deletion asked, disrupted, waiting, rvs, gpus
          optional=3)


def _scalar(v: Any, path: str | None) -> None:
    """A hyperparameter's value: null, a string, true or false, or a finite number."""
    if not (v is None or isinstance(v, str | bool)):
        FLOAT(v, path)


def _intake_value(v: Any, path: str | None) -> None:
    """A Resolution or Rendering event's field: null, a string, a list of strings (input_refs), an object of scalars
    (hyperparameters) or a count (hyperparameters_omitted)."""
    if v is None or isinstance(v, str):
        return
    if isinstance(v, dict):
        dict_of(_scalar)(v, path)
    elif isinstance(v, int) and not isinstance(v, bool):
        COUNT(v, path)
    else:
        list_of(STR)(v, path)


_INTAKE_DATA = dict_of(_intake_value)
_FACTS = fields({
    "run_id": STR, "kind": opt(STR), "uid": opt(STR), "namespace": opt(STR), "name": opt(STR),
    "created": opt(TIME), "labels": dict_of(STR), "annotations": dict_of(STR), "expected_pods": COUNT,
    "root_deleted": opt(TIME), "job_conds": _CONDS, "job_failed": COUNT, "wl_uid": opt(STR), "wl_name": opt(STR),
    "wl_created": opt(TIME), "wl_conds": _CONDS, "wl_evictions": dict_of(COUNT), "wl_queue": opt(STR),
    "cq_by_admission": list_of(row(TIME, STR)), "wl_pending": opt(row(STR, STR)),
    "ray": list_of(row(TIME, row(opt(STR), COUNT, opt(TIME), opt(row(TIME, STR, STR, STR, STR))))),
    "ray_clusters": dict_of(row(STR, opt(TIME), opt(TIME))),
    "events": dict_of(row(STR, STR, STR, STR, STR, TIME, TIME, COUNT)),
    "intake": dict_of(row(one_of("Resolution", "Rendering"), one_of("started", "succeeded", "failed"), TIME,
                          _INTAKE_DATA)),
    "progress_seen": list_of(row(STR, TIME)), "progress_buckets": list_of(row(_int(-(2**63), INT64_MAX, "a bucket"),
                                                                              TIME)),
    "metrics": dict_of(row(row(STEP, FLOAT), row(STEP, FLOAT), FLOAT, FLOAT, COUNT)),
    "checkpoint": opt(row(STEP, TIME, STR)),
}, {
    "root_rv": opt(COUNT), "wl_rv": opt(COUNT), "wl_checks": falsy_or(_CONDS), "wl_deletion": opt(TIME),
    "root_deletion": opt(TIME), "pods_deleted": opt(TIME), "pods_finished": opt(TIME), "pods": dict_of(POD),
    "workload": opt(row(list_of(STR), opt(STR))),  # (images, entrypoint); older snapshots: none
    "points": falsy_or(row(WIDTH, dict_of(list_of(row(STEP, FLOAT, TIME))))),
    "steps": falsy_or(row(WIDTH, list_of(row(TIME, STEP, TIME, STEP)))),
    "ckpts": falsy_or(fields({
        "saves": list_of(row(STEP, STR, opt(TIME), opt(TIME), opt(TIME), opt(COUNT))),
        "restores": list_of(row(STEP, STR, list_of(TIME), list_of(TIME))),
        "resume": opt(row(TIME, STR, opt(STR), opt(STEP))),
    })),
})
MARKS = row(*[TIME] * STREAM_COUNT)
_COMMON = {"owners": list_of(STR)}
_COMMON_OPTIONAL = {"pods_removed": list_of(STR), "marks": MARKS, "lost": list_of(STR), "pods": dict_of(POD),
                    "pods_own": BOOL}
_LIVE = fields({"version": one_of(1, 2, 3, 4), "run_id": STR, "facts": _FACTS, **_COMMON},
               {**_COMMON_OPTIONAL, "retired": one_of(False), "quiet": TIME})
_RETIRED = fields({"version": one_of(1, 2, 3, 4), "run_id": STR, "retired": one_of(True),
                   "retired_seq": _int(1, INT64_MAX, "a retirement ordinal from 1 to 2**63-1"), **_COMMON},
                  _COMMON_OPTIONAL)


def check_run_snapshot(snap: Any) -> None:
    """StoredStateError unless ``snap`` is a run snapshot as ``snapshot_run`` writes it (version 1 to 4, facts or a
    retired marker) whose facts name the same run."""
    if not isinstance(snap, dict):
        raise _bad("", "a JSON object", snap)
    version = snap.get("version")
    if version not in (1, 2, 3, 4) or isinstance(version, bool):
        raise errors.StoredStateError(f"unsupported run snapshot version {_show(version)} (this tracker reads 1 "
                                      "to 4)")
    _checked(_RETIRED if snap.get("retired") is True else _LIVE, snap, "")
    facts = snap.get("facts")
    if isinstance(facts, dict) and facts["run_id"] != snap["run_id"]:
        raise errors.StoredStateError(f"facts.run_id {_show(facts['run_id'])} is not the snapshot's run "
                                      f"{_show(snap['run_id'])}")


def check_pod(value: Any, path: str = "pod") -> None:
    """StoredStateError unless ``value`` is one pod's facts as ``PodFacts.to_json`` writes them."""
    _checked(POD, value, path)


def check_marks(value: Any, path: str = "marks") -> None:
    """StoredStateError unless ``value`` is a watermark state (``Reducer.marks``: STREAM_COUNT times)."""
    _checked(MARKS, value, path)


__all__ = ["INT64_MAX", "check_marks", "check_pod", "check_run_snapshot"]
