"""The bytes of the reducer state an experiment index keeps: zlib-compressed JSON, inflated within a bound.

A stored blob is inflated by ``inflate`` with ``zlib.decompressobj().decompress(blob, max_length)``: never more
than its cap plus one byte comes out, whatever the blob (a 1 MB blob of zeros inflates to 1 GB; here it stops at
the cap). The caps (docs/limits.md, "The reducer state an index keeps"), each well above what the reducer's own
bounds let the state grow to:

- a run's state (``reducer_runs.state``): ``RUN_STATE_BYTES`` (64 MiB) plus ``POINT_BYTES`` per metric point the
  reducer keeps per run (``reduce.metric_points_per_run``): the facts are bounded by ``tracker.core.facts``
  (64 events, 10,000 progress ids, 20,000 progress buckets, 2,048 step buckets, 1,024 checkpoint saves...), a
  few MiB at most;
- a pod's state (``reducer_pods.state``): ``POD_STATE_BYTES`` (1 MiB; a pod's facts are some hundred bytes);
- a held record (``reducer_held.record``): ``HELD_RECORD_BYTES``, a capture's largest value
  (``tracker.shell.capture.MAX_VALUE_BYTES``, 8 MiB) plus 64 KiB for its event type and source.

``BadBlob`` says in a few words what is wrong (not bytes, not zlib data, cut short, bytes after its end, larger
than the cap, not JSON); the caller names the index, the table and the row.
"""

from __future__ import annotations

import zlib
from typing import Any

from tracker.shell import jsonio
from tracker.shell.capture import MAX_VALUE_BYTES

MIB = 1024 * 1024
RUN_STATE_BYTES = 64 * MIB
POINT_BYTES = 128  # a metric point [step, value, at] as JSON, with its share of the curve's keys: well under this
POD_STATE_BYTES = 1 * MIB
HELD_RECORD_BYTES = MAX_VALUE_BYTES + 64 * 1024


def run_state_cap(metric_points_per_run: int) -> int:
    """The largest a run's inflated state may be, given the reducer's metric points per run."""
    return RUN_STATE_BYTES + POINT_BYTES * max(0, metric_points_per_run)


class BadBlob(ValueError):
    """A stored blob that does not decode (the message says why, in a few words)."""


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n:,} bytes"


def inflate(blob: object, cap: int) -> bytes:
    """The inflated bytes of ``blob``; BadBlob when it is not a whole zlib stream or inflates to more than ``cap``
    bytes (at most ``cap + 1`` bytes are ever produced)."""
    if not isinstance(blob, bytes):
        raise BadBlob(f"a {type(blob).__name__} where zlib-compressed bytes belong")
    d = zlib.decompressobj()
    try:
        out = d.decompress(blob, cap + 1)
    except zlib.error as exc:
        raise BadBlob(f"not zlib-compressed data ({exc})") from None
    if len(out) > cap:
        raise BadBlob(f"inflates to more than {_size(cap)} (the cap of this table's values)")
    if not d.eof:
        raise BadBlob("zlib data cut short")
    if d.unused_data:
        raise BadBlob(f"{len(d.unused_data)} byte(s) after the end of its zlib data")
    return out


def decode(blob: object, cap: int) -> Any:
    """The JSON value ``blob`` holds (``inflate``, then JSON); BadBlob when it does not decode."""
    raw = inflate(blob, cap)
    try:
        return jsonio.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested deeper than the parser goes
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadBlob(f"not JSON ({first[:80]})") from None


def encode(value: object, level: int) -> bytes:
    return zlib.compress(jsonio.dumps(value), level)
