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

from collections.abc import Iterable, Mapping
from typing import Any

from tracker import errors
from tracker.core.correlate import Held
from tracker.core.limits import ReducerLimits
from tracker.core.reducer import Reducer
from tracker.core.snapshot_shape import INT64_MAX, check_marks, check_pod
from tracker.shell import jsonio
from tracker.shell.index import ExperimentIndex, StateRows
from tracker.shell.slim import slim
from tracker.shell.state_codec import HELD_RECORD_BYTES, POD_STATE_BYTES, BadBlob, decode, encode, run_state_cap

COMPRESSION_LEVEL = 1  # fast: about 3x smaller than the JSON, at a small share of the fold's time


class StateError(errors.Fatal, RuntimeError):
    """The index's stored reducer state cannot be used (e.g. written by an incompatible tracker)."""

    exit_code = 2  # the command line says why and exits 2


def _encode(value: object) -> bytes:
    return encode(value, COMPRESSION_LEVEL)


class StateTracker:
    """Encodes, at each flush, the state of the flushed runs and (when they changed) the held records."""

    def __init__(self, reducer: Reducer) -> None:
        self.reducer = reducer
        self._held_version = reducer.corr.held_version()
        self._clock = list(reducer.marks)

    def capture(self, run_ids: Iterable[str], forgotten_seq: Mapping[str, int] | None = None) -> StateRows:
        """``forgotten_seq``: the runs retired and forgotten since the last flush (``Flushed.forgotten_seq``); a
        run among ``run_ids`` that is one gets its retirement marker all the same, so that the index remembers it
        (else its history would be held without state, and a later replay would refuse the index)."""
        red = self.reducer
        runs: dict[str, bytes | None] = {}
        retired = {}
        pods: dict[tuple[str, str], bytes | None] = {}
        for run_id in dict.fromkeys(run_ids):
            snap = red.snapshot_run(run_id, forgotten_seq)
            if snap is None:
                runs[run_id] = None
                continue
            for uid, pod in snap.pop("pods").items():
                pods[(run_id, uid)] = _encode(pod)
            for uid in snap.pop("pods_removed"):
                pods[(run_id, uid)] = None
            runs[run_id] = _encode(snap)
            if snap.get("retired") is True:
                retired[run_id] = snap["retired_seq"]
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


REBUILD = ("the reducer state cannot be used and nothing was written: replay the captures into a new index "
           "(tracker replay CAPTURE... --index NEW.sqlite)")
WATCH_EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")  # what the reducer holds (BOOKMARK and ERROR are not objects)


def _bad(index: ExperimentIndex, where: str, what: str) -> StateError:
    """The one line of an unusable stored state: the index, the table and row, what is wrong, how to rebuild."""
    return StateError(f"{index.path}: {where}: {what}; {REBUILD}")


def _name(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key(value: object, what: str) -> str:
    """A row's text key (a run id, a uid, an owner uid): a non-empty string."""
    if not (isinstance(value, str) and value):
        raise BadBlob(f"its {what} is {_name(value)}, not a non-empty string")
    return value


def restore(index: ExperimentIndex, limits: ReducerLimits | None = None) -> Reducer:
    """A reducer holding the state the index keeps (an empty one for a new index): its live runs, its held
    records, its watermark and the latest ``max_retired`` retired runs (the index remembers the others).

    Every stored value is checked before the reducer takes it: each blob inflates within its cap and is JSON
    (``tracker.shell.state_codec``), of the shape the reducer wrote (``tracker.core.snapshot_shape``), and its row
    agrees with it (a run's row names the run its state is of; a retired marker has its retirement ordinal in
    ``retired_seq``, a live run none). Anything else is a StateError naming the index, the table and the row:
    nothing is written, so the index stays as it was."""
    reducer = Reducer(limits)
    stored = index.reducer_state(reducer.limits.max_retired)
    where = "meta, key reducer_clock"
    try:
        if stored.clock is not None:
            try:
                clock = jsonio.loads(stored.clock) if isinstance(stored.clock, str | bytes) else stored.clock
            except (ValueError, RecursionError):
                raise BadBlob(f"{_name(stored.clock)} is not JSON") from None
            check_marks(clock, "value")
            reducer.marks = list(clock)
        items: list[tuple[int, str, Held]] = []
        for seq, owner, blob in stored.held:
            where = f"table reducer_held, row seq={_name(seq)}"
            if not (isinstance(seq, int) and 0 <= seq <= INT64_MAX):
                raise BadBlob(f"seq {_name(seq)} is not an integer from 0 to 2**63-1")
            _key(owner, "owner")
            record = decode(blob, HELD_RECORD_BYTES)
            if not (isinstance(record, list) and len(record) == 3 and record[0] in WATCH_EVENT_TYPES
                    and isinstance(record[1], dict) and isinstance(record[2], str)):
                raise BadBlob(f"record {_name(record)} is not [{'|'.join(WATCH_EVENT_TYPES)}, object, source]")
            items.append((seq, owner, (record[0], record[1], record[2])))
        pods: dict[str, dict[str, Any]] = {}
        pod_cap = POD_STATE_BYTES
        for run_id, uid, blob in stored.pods:
            where = f"table reducer_pods, run {_name(run_id)}, pod {_name(uid)}"
            pod = decode(blob, pod_cap)
            check_pod(pod, "state")
            pods.setdefault(_key(run_id, "run_id"), {})[_key(uid, "uid")] = pod
        cap = run_state_cap(reducer.limits.metric_points_per_run)
        for run_id, blob, retired_seq in stored.runs:
            where = f"table reducer_runs, run {_name(run_id)}"
            _key(run_id, "run_id")
            snap = decode(blob, cap)
            reducer.restore_run(snap, pods.get(run_id, {}))  # checks it first (core.snapshot_shape); then its row
            if snap["run_id"] != run_id:
                raise BadBlob(f"its state is of run {_name(snap['run_id'])}")
            if snap.get("retired") is True and retired_seq != snap["retired_seq"]:
                raise BadBlob(f"retired_seq {_name(retired_seq)} is not its state's retirement ordinal "
                              f"{snap['retired_seq']}")
            if snap.get("retired") is not True and retired_seq is not None:
                raise BadBlob(f"retired_seq {_name(retired_seq)} marks a run whose state is not retired")
        where = "table reducer_held"
        reducer.corr.load_held(items)
    except (BadBlob, errors.StoredStateError) as exc:
        raise _bad(index, where, str(exc)) from None
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
