"""The reducer's runs, run id -> facts; a finished run's facts packed while nothing changes them.

A narrow finished run whose derivation a flush freed (``Reducer._frees``) still holds its facts until it retires, an
hour later by default: about 9.5 KiB of small Python objects (dicts, tuples, integers) for a run that rarely changes
again. The reducer packs them (``RunTable.pack``, at the flush after the one that freed the derivation, so that the
run-state snapshot of that flush reads them as they are): their snapshot values (``RunFacts.to_json``, and what
``snapshot_run`` noted of the run's progress minutes) marshalled and compressed, about 1.4 KiB. Reading a packed run
(``get``, ``[]``, ``pop``) unpacks it, as the record that changes it, a read of its history or its retirement needs
it; the reducer packs it again at a later flush if it is still finished and untouched (``take_unpacked``).

A packed run gives back the facts it was packed from: the same snapshot values, so the same history
(``tests/core/test_run_table.py``), and the laws' reducers pack theirs (``tests/core/test_incremental.py``).
Counters that are not facts (``RunFacts.progress_seq``, ``shape_seq``) start again at 0: a packed run has no
derivation that could compare them.

``marshal`` is the standard library's encoder of plain Python values, in C; its format may change between Python
versions, so a packed run stays in this process's memory, never written anywhere (snapshots hold ``to_json``'s
values). Level 1 of zlib: it halves the marshalled bytes in about 40 us a run on a 2-core machine (bench/README.md,
"A finished run's facts packed").
"""

from __future__ import annotations

import marshal
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tracker.core.facts import RunFacts

_LEVEL = 1


def pack(r: RunFacts) -> bytes:
    """The facts of ``r`` as bytes (``unpack`` gives them back)."""
    return zlib.compress(marshal.dumps((r.to_json(), r.minutes_changed)), _LEVEL)


def unpack(packed: bytes) -> RunFacts:
    """The facts ``pack`` packed."""
    doc, minutes = marshal.loads(zlib.decompress(packed))
    r = RunFacts.from_json(doc)
    r.minutes_changed = minutes
    return r


def _doc(packed: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = marshal.loads(zlib.decompress(packed))[0]
    return doc


def _same(a: RunFacts | bytes, b: RunFacts | bytes) -> bool:
    if isinstance(a, RunFacts) and isinstance(b, RunFacts):
        return a == b
    return (_doc(a) if isinstance(a, bytes) else a.to_json()) == (_doc(b) if isinstance(b, bytes) else b.to_json())


class RunTable:
    """Run id -> facts, in the order the runs were added, some of them packed (module docstring). Reads unpack."""

    __slots__ = ("_runs", "_unpacked")

    def __init__(self, runs: Iterable[RunFacts] = ()) -> None:
        self._runs: dict[str, RunFacts | bytes] = {r.run_id: r for r in runs}
        self._unpacked: set[str] = set()  # runs unpacked since the last ``take_unpacked``

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[str]:
        return iter(self._runs)

    def __eq__(self, other: object) -> bool:
        """The same runs with the same facts, as another table or a mapping of run id -> facts: two unpacked runs
        compare as ``RunFacts`` do, a packed one by its snapshot values (its counters are not kept). Unpacks nothing."""
        theirs: Mapping[str, RunFacts | bytes]
        if isinstance(other, RunTable):
            theirs = other._runs
        elif isinstance(other, Mapping):
            theirs = other
        else:
            return NotImplemented
        return self._runs.keys() == theirs.keys() and all(_same(v, theirs[k]) for k, v in self._runs.items())

    def __getitem__(self, run_id: str) -> RunFacts:
        r = self.get(run_id)
        if r is None:
            raise KeyError(run_id)
        return r

    def __setitem__(self, run_id: str, r: RunFacts) -> None:
        self._runs[run_id] = r

    def get(self, run_id: str) -> RunFacts | None:
        """The run's facts (unpacked if they were packed: kept so from now on), None for a run it does not hold."""
        v = self._runs.get(run_id)
        if isinstance(v, bytes):
            r = self._runs[run_id] = unpack(v)
            self._unpacked.add(run_id)
            return r
        return v

    def pop(self, run_id: str) -> RunFacts | None:
        """Remove the run, and give its facts (None if it held none)."""
        v = self._runs.pop(run_id, None)
        return unpack(v) if isinstance(v, bytes) else v

    def items(self) -> Iterator[tuple[str, RunFacts]]:
        """Every run with its facts (each packed one unpacked)."""
        for run_id in list(self._runs):
            yield run_id, self[run_id]

    def values(self) -> Iterator[RunFacts]:
        """Every run's facts (each packed one unpacked)."""
        for _run_id, r in self.items():
            yield r

    def docs(self) -> list[dict[str, Any]]:
        """Every run's facts as snapshot values (``RunFacts.to_json``), a packed run's read without unpacking it."""
        return [_doc(v) if isinstance(v, bytes) else v.to_json() for v in self._runs.values()]

    def pack(self, run_id: str) -> None:
        """Pack the run's facts (a run it does not hold, or holds packed, is left as it is)."""
        v = self._runs.get(run_id)
        if isinstance(v, RunFacts):
            self._runs[run_id] = pack(v)

    def packed(self, run_id: str) -> bool:
        """Whether the run's facts are packed now."""
        return isinstance(self._runs.get(run_id), bytes)

    def packed_size(self) -> tuple[int, int]:
        """How many runs are packed now, and the bytes their packed facts hold."""
        sizes = [len(v) for v in self._runs.values() if isinstance(v, bytes)]
        return len(sizes), sum(sizes)

    def take_unpacked(self) -> set[str]:
        """The runs a read unpacked since the last call."""
        out, self._unpacked = self._unpacked, set()
        return out
