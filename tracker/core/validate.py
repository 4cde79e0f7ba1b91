"""Guards at the reducer's edge for records of any shape: whatever a record is, looking at it must not fail.

A record is a decoded JSON value, so it may be anything: a ``kind`` that is a list, a string of megabytes, a value
nested thousands of levels deep. The extractor reads only the fields it knows, a few levels deep, and raises
``Malformed`` for a wrong type; what is left are the places that look at a record *whole*: the excerpt of a dead
letter (JSON-encoded), the records held for their owner (kept, and encoded with the reducer's state), the text of a
reason (``repr``) and the validation of an intake event. These helpers make each of them safe. Pure functions.
"""

from __future__ import annotations

from typing import Any

# Deeper than any Kubernetes object (a RayJob's pod template affinity with its managedFields is ~25 levels) and well
# within what the JSON encoders handle (orjson stops at 255 levels, the standard library at the recursion limit).
MAX_DEPTH = 100
CUT = "…nested too deeply"


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` levels deep (stops as soon as it knows)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if v.__class__ is dict:
            children: Any = v.values()
        elif v.__class__ is list:
            children = v
        else:
            continue
        if depth > limit:
            return True
        for child in children:
            if child.__class__ is dict or child.__class__ is list:
                stack.append((child, depth + 1))
    return False


def pruned(value: Any, limit: int = MAX_DEPTH) -> Any:
    """``value`` itself when it is at most ``limit`` levels deep, else a copy with what is deeper replaced by a marker.

    The extractor reads no field that deep, so a pruned object folds exactly as the original would."""
    if not too_deep(value, limit):
        return value
    return _cut(value, limit)


def _cut(value: Any, levels: int) -> Any:
    if value.__class__ is dict:
        return {k: _cut(v, levels - 1) for k, v in value.items()} if levels > 0 else CUT
    if value.__class__ is list:
        return [_cut(v, levels - 1) for v in value] if levels > 0 else CUT
    return value


def brief(value: Any, limit: int = 64) -> str:
    """A short ``repr`` for a reason's detail: strings and numbers as they are (cut), anything else by its type."""
    if isinstance(value, str):
        return repr(value[:limit]) + ("…" if len(value) > limit else "")
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if -(10**18) < value < 10**18 else "a very large integer"
    return f"a JSON {'object' if isinstance(value, dict) else 'array' if isinstance(value, list) else 'value'}"
