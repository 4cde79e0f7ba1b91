"""The reducer's runs, run id -> facts; a finished run's facts packed while nothing changes them.

A narrow finished run whose derivation a flush freed (``Reducer._frees``) still holds its facts until it retires, an
hour later by default: about 9.5 KiB of small Python objects (dicts, tuples, integers) for a run that rarely changes
again. The reducer packs them (``RunTable.pack``, at the flush after the one that freed the derivation, so that the
run-state snapshot of that flush reads them as they are): their snapshot values (``RunFacts.to_json``, and what
``snapshot_run`` noted of the run's progress minutes) marshalled and compressed, about 0.7 KiB. Reading a packed run
(``get``, ``[]``, ``pop``) unpacks it, as the record that changes it, a read of its history or its retirement needs
it; the reducer packs it again at a later flush if it is still finished and untouched (``take_unpacked``).

A packed run gives back the facts it was packed from: the same snapshot values, so the same history
(``tests/core/test_run_table.py``), and the laws' reducers pack theirs (``tests/core/test_incremental.py``).
Counters that are not facts (``RunFacts.progress_seq``, ``shape_seq``) start again at 0: a packed run has no
derivation that could compare them.

``marshal`` is the standard library's encoder of plain Python values, in C; its format may change between Python
versions, so a packed run stays in this process's memory, never written anywhere (snapshots hold ``to_json``'s
values).

Compressed with raw deflate (zlib level 1) against a preset dictionary the table learns: the marshalled facts of the
first run it packs (in run-id order at a flush: the same in every process) that are between ``LEARN_MIN`` and
``LEARN_MAX`` bytes (the deflate window). Most of a run's packed bytes are what every run repeats (the snapshot keys,
condition types and reasons, the run's queue and namespace, the timestamps' high bytes), and one run holds them all:
the generator's runs pack to ~0.65 KiB with it, ~1.4 KiB without, and pack and unpack faster (bench/README.md,
"Finished runs packed against a learned dictionary"). A run packed before the table learned one is packed without; the
first byte of packed facts says which. The dictionary depends on which run was packed first, so on the records and the
flushes only; it changes no fact, history or snapshot.
"""

from __future__ import annotations

import marshal
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tracker.core.facts import RunFacts

_LEVEL = 1
_WBITS = -15  # raw deflate with a 32 KiB window: no header or checksum (packed facts never leave the process)
# the marshalled facts a dictionary is learned from: at least this (a smaller run holds few of what runs repeat; on
# the generator's runs, 1.9-4.7 KiB, a dictionary of at least 1 KiB packed them to 730 bytes a run, of 3 KiB to 679)
LEARN_MIN = 3072
LEARN_MAX = 32 * 1024  # and at most the window (the start of a larger dictionary is out of reach)
_PLAIN, _PRESET = b"\x00", b"\x01"  # the first byte of packed facts: without a dictionary, against it


def _raw(r: RunFacts) -> bytes:
    return marshal.dumps((r.to_json(), r.minutes_changed))


def _deflate(raw: bytes, zdict: bytes | None) -> bytes:
    if zdict is None:
        c = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS)
        return _PLAIN + c.compress(raw) + c.flush()
    c = zlib.compressobj(_LEVEL, zlib.DEFLATED, _WBITS, zlib.DEF_MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, zdict)
    return _PRESET + c.compress(raw) + c.flush()


def pack(r: RunFacts, zdict: bytes | None = None) -> bytes:
    """The facts of ``r`` as bytes, against the preset dictionary ``zdict`` (``unpack`` with it gives them back)."""
    return _deflate(_raw(r), zdict)


def _loads(packed: bytes, zdict: bytes | None) -> tuple[dict[str, Any], set[int] | None]:
    if packed[:1] == _PRESET:
        if zdict is None:
            raise ValueError("facts packed against a dictionary, unpacked without one")
        d = zlib.decompressobj(_WBITS, zdict)
    else:
        d = zlib.decompressobj(_WBITS)
    value: tuple[dict[str, Any], set[int] | None] = marshal.loads(d.decompress(memoryview(packed)[1:]) + d.flush())
    return value


def unpack(packed: bytes, zdict: bytes | None = None) -> RunFacts:
    """The facts ``pack`` packed (against ``zdict``)."""
    doc, minutes = _loads(packed, zdict)
    r = RunFacts.from_json(doc)
    r.minutes_changed = minutes
    return r


class RunTable:
    """Run id -> facts, in the order the runs were added, some of them packed (module docstring). Reads unpack."""

    __slots__ = ("_packed", "_packed_bytes", "_runs", "_unpacked", "zdict")

    def __init__(self, runs: Iterable[RunFacts] = ()) -> None:
        self._runs: dict[str, RunFacts | bytes] = {r.run_id: r for r in runs}
        self._unpacked: set[str] = set()  # runs unpacked since the last ``take_unpacked``
        self.zdict: bytes | None = None  # the preset dictionary, once learned (module docstring)
        self._packed = self._packed_bytes = 0  # the runs packed now, and their bytes (``packed_size``)

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
            theirs, zdict = other._runs, other.zdict
        elif isinstance(other, Mapping):
            theirs, zdict = other, None
        else:
            return NotImplemented
        if self._runs.keys() != theirs.keys():
            return False
        for k, a in self._runs.items():
            b = theirs[k]
            if isinstance(a, RunFacts) and isinstance(b, RunFacts):
                if a != b:
                    return False
            elif self._doc(a) != (_loads(b, zdict)[0] if isinstance(b, bytes) else b.to_json()):
                return False
        return True

    def _doc(self, v: RunFacts | bytes) -> dict[str, Any]:
        return _loads(v, self.zdict)[0] if isinstance(v, bytes) else v.to_json()

    def __getitem__(self, run_id: str) -> RunFacts:
        r = self.get(run_id)
        if r is None:
            raise KeyError(run_id)
        return r

    def __setitem__(self, run_id: str, r: RunFacts) -> None:
        old = self._runs.get(run_id)
        if isinstance(old, bytes):
            self._unpacked_one(old)
        self._runs[run_id] = r

    def _unpacked_one(self, packed: bytes) -> None:
        self._packed -= 1
        self._packed_bytes -= len(packed)

    def get(self, run_id: str) -> RunFacts | None:
        """The run's facts (unpacked if they were packed: kept so from now on), None for a run it does not hold."""
        v = self._runs.get(run_id)
        if isinstance(v, bytes):
            r = self._runs[run_id] = unpack(v, self.zdict)
            self._unpacked.add(run_id)
            self._unpacked_one(v)
            return r
        return v

    def pop(self, run_id: str) -> RunFacts | None:
        """Remove the run, and give its facts (None if it held none)."""
        v = self._runs.pop(run_id, None)
        if isinstance(v, bytes):
            self._unpacked_one(v)
            return unpack(v, self.zdict)
        return v

    def discard(self, run_id: str) -> None:
        """Remove the run if it holds it, without reading its facts (packed ones are not unpacked)."""
        v = self._runs.pop(run_id, None)
        if isinstance(v, bytes):
            self._unpacked_one(v)

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
        return [self._doc(v) for v in self._runs.values()]

    def pack(self, run_id: str) -> None:
        """Pack the run's facts (a run it does not hold, or holds packed, is left as it is); the first run packed
        whose marshalled facts are ``LEARN_MIN`` to ``LEARN_MAX`` bytes is the dictionary of the rest."""
        v = self._runs.get(run_id)
        if isinstance(v, RunFacts):
            raw = _raw(v)
            if self.zdict is None and LEARN_MIN <= len(raw) <= LEARN_MAX:
                self.zdict = raw
            packed = self._runs[run_id] = _deflate(raw, self.zdict)
            self._packed += 1
            self._packed_bytes += len(packed)

    def packed(self, run_id: str) -> bool:
        """Whether the run's facts are packed now."""
        return isinstance(self._runs.get(run_id), bytes)

    def packed_size(self) -> tuple[int, int]:
        """How many runs are packed now, and the bytes their packed facts hold (kept as they change: a metrics
        refresh reads them without a pass over the runs)."""
        return self._packed, self._packed_bytes

    def take_unpacked(self) -> set[str]:
        """The runs a read unpacked since the last call."""
        out, self._unpacked = self._unpacked, set()
        return out
