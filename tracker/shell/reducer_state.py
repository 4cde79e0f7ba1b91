"""The reducer's state kept in the experiment index, so that a replay (or a restarted embedded ``serve``) continues
from what earlier calls folded instead of replacing their histories with what its own records alone give.

The index stores, in the same transaction as the history rows (``ExperimentIndex.write(..., state=...)``):
- each written run's state as ``Reducer.snapshot_run`` gives it (facts and owner uids), zlib-compressed JSON, and
  apart, one row per pod, the state of each of its pods that changed (so that a change of one pod of a wide run
  rewrites that pod's row, not the run's every pod);
- the records still waiting for their owner object (a Pod seen in one capture, its Job in the next).

``StateTracker.capture`` encodes what changed at a flush; ``restore`` loads it all into a new reducer. Runs the
index holds without state (written by the Kafka sink, whose reducer keeps its state in Kafka, or by a tracker
before schema 2) cannot be continued: ``runs_without_state`` lets a caller refuse rather than overwrite them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from tracker import errors
from tracker.core.correlate import Held
from tracker.core.reducer import Reducer, ReducerLimits
from tracker.shell import jsonio
from tracker.shell.index import ExperimentIndex, StateRows
from tracker.shell.slim import slim

COMPRESSION_LEVEL = 1  # fast: about 3x smaller than the JSON, at a small share of the fold's time


class StateError(errors.Fatal, RuntimeError):
    """The index's stored reducer state cannot be used (e.g. written by an incompatible tracker)."""

    exit_code = 2  # the command line says why and exits 2


def _encode(value: object) -> bytes:
    return zlib.compress(jsonio.dumps(value), COMPRESSION_LEVEL)


def _decode(blob: bytes) -> object:
    return jsonio.loads(zlib.decompress(blob))


class StateTracker:
    """Encodes, at each flush, the state of the flushed runs and (when they changed) the held records."""

    def __init__(self, reducer: Reducer) -> None:
        self.reducer = reducer
        self._held_version = reducer.corr.held_version()
        self._clock = list(reducer.marks)

    def capture(self, run_ids: Iterable[str]) -> StateRows:
        red = self.reducer
        runs: dict[str, bytes | None] = {}
        retired = {}
        pods: dict[tuple[str, str], bytes | None] = {}
        for run_id in dict.fromkeys(run_ids):
            snap = red.snapshot_run(run_id)
            if snap is None:
                runs[run_id] = None
                continue
            for uid, pod in snap.pop("pods").items():
                pods[(run_id, uid)] = _encode(pod)
            for uid in snap.pop("pods_removed"):
                pods[(run_id, uid)] = None
            runs[run_id] = _encode(snap)
            if run_id in red.retired:
                retired[run_id] = red.retired[run_id]
        clock = None
        if red.marks != self._clock:
            clock = self._clock = list(red.marks)
        held = None
        version = red.corr.held_version()
        if version != self._held_version:
            self._held_version = version
            # held objects are stored slimmed to what the reducer reads (no env values, no managedFields)
            held = [(seq, owner, _encode([etype, slim(obj), source]))
                    for seq, owner, (etype, obj, source) in red.corr.held_items()]
        return StateRows(runs, held, retired, clock, pods)


def restore(index: ExperimentIndex, limits: ReducerLimits | None = None) -> Reducer:
    """A reducer holding the state the index keeps (an empty one for a new index): its live runs, its held
    records, its watermark and the latest ``max_retired`` retired runs (the index remembers the others)."""
    reducer = Reducer(limits)
    stored = index.reducer_state(reducer.limits.max_retired)
    runs, held = stored.runs, stored.held
    if len(stored.clock) == len(reducer.marks):
        reducer.marks = list(stored.clock)
    try:
        items: list[tuple[int, str, Held]] = []
        for seq, owner, blob in held:
            record = _decode(blob)
            if not (isinstance(record, list) and len(record) == 3 and isinstance(record[1], dict)):
                raise ValueError("a held record is not [type, object, source]")
            items.append((seq, owner, (str(record[0]), record[1], str(record[2]))))
        reducer.corr.load_held(items)
        for run_id, blob in runs:
            snap = _decode(blob)
            if not isinstance(snap, dict):
                raise ValueError("a run's state is not a JSON object")
            reducer.restore_run(snap, {uid: _decode(b) for uid, b in stored.pods.get(run_id, {}).items()})
    except (ValueError, TypeError, KeyError, IndexError, zlib.error) as exc:
        raise StateError(f"the reducer state kept in {index.path} cannot be read ({exc}); replay every capture "
                         "into a new index") from exc
    return reducer


def refuse_runs_without_state(index: ExperimentIndex) -> None:
    """StateError when the index holds runs whose state it does not keep: continuing would replace them."""
    missing = index.runs_without_state()
    if missing:
        raise StateError(
            f"{index.path} holds {len(missing)} run(s) written without the reducer state a replay continues from "
            f"(e.g. {missing[0]}; written by `tracker sink index` or a tracker before index schema 2): replaying "
            "into it would replace their histories with what this call's records alone give. Replay into a new "
            "index instead")
