"""Runs with a goodput ledger, made by the reducer in memory: the bundled preemption scenario's ``bert-pt-2c5nw``
with progress and checkpoint events of its own (``checkpointed``), a run that resumes it (``resumer``), and the same
run while it goes on (``checkpointed(until=...)``).

``bert-pt-2c5nw`` (two 8-GPU pods per attempt): queued 09:59:59, bound 10:00:04, steps 0 at 10:05, 1000 at 10:10
(a checkpoint of it saved 10:10:00 to 10:11:00), 2000 at 10:20, 3000 at 10:30; preempted at 10:40:01 (its pods hold
their GPUs to 10:40:03); admitted again 11:10:00, bound 11:10:01, the checkpoint of step 1000 restored 11:12:00 to
11:13:00, steps 1000 at 11:15 to 4000 at 11:45, pods released 11:52:20 and 11:52:22, the run ends 11:52:24. Its ledger
by hand (schemas/goodput.md; wall seconds, GPU-seconds = GPUs held x seconds):

=========================  ============================================  ====  ===========================
category                   when                                          wall  GPU-seconds
=========================  ============================================  ====  ===========================
scheduling                 09:59:59-10:00:04 (queued, scheduling)           5  0 (no pod bound)
startup                    10:00:04-10:05:00                              296  16 x 296
productive                 10:05-10:10, 11:15:00-11:52:24                2544  16 x 300 + 16 x 2240 + 8 x 2
checkpoint-save            10:10-10:11                                     60  16 x 60
wasted-progress            10:11:00-10:40:01 (after the checkpoint kept)  1741  16 x 1741
infrastructure-recovery    10:40:01-11:15:00 but the restore              2039  16 x 2 + 16 x 239
checkpoint-restore         11:12-11:13                                     60  16 x 60
=========================  ============================================  ====  ===========================

Wall 6745 s (09:59:59 to 11:52:24), ETTR 2544 / 6745; GPU-time 79,024 GPU-s, goodput 40,656 / 79,024.
"""

from __future__ import annotations

from typing import Any

from sim import builders as b
from sim.builders import Ms, at
from tests.core.test_gpu import _writes
from tracker.core.model import RunHistory
from tracker.core.reducer import Reducer

RUN = "bert-pt-2c5nw"
RESUMER = "bert-ft-7kq2x"
CKPT = "abfss://runs@taugridml.dfs.core.windows.net/nlp/bert-pt-2c5nw/checkpoints/step-001000/"
WALL = {"scheduling": 5, "startup": 296, "productive": 300 + 2244, "checkpoint-save": 60, "wasted-progress": 1741,
        "infrastructure-recovery": 2099 - 60, "checkpoint-restore": 60}
GPU_S = {"startup": 16 * 296, "productive": 16 * 300 + 16 * 2240 + 8 * 2, "checkpoint-save": 16 * 60,
         "wasted-progress": 16 * 1741, "infrastructure-recovery": 16 * 2 + 16 * 239, "checkpoint-restore": 16 * 60}
ATTEMPT_GPU_S = [{"startup": 16 * 296, "productive": 16 * 300, "checkpoint-save": 16 * 60,
                  "wasted-progress": 16 * 1741, "infrastructure-recovery": 16 * 2},
                 {"productive": 16 * 2240 + 8 * 2, "infrastructure-recovery": 16 * 239, "checkpoint-restore": 16 * 60}]


def _event(run_id: str, kind: str, n: int, when: Ms, **fields: Any) -> tuple[Ms, dict[str, Any]]:
    return when, {"schema": "taugrid.io/intake/v2", "event_id": f"{run_id}-{kind}-{n}", "run_id": run_id,
                  "at": b.ts(when), "kind": kind, **fields}


def intake(run_id: str = RUN) -> list[tuple[Ms, dict[str, Any]]]:
    steps = [("10:05:00", 0), ("10:10:00", 1000), ("10:20:00", 2000), ("10:30:00", 3000), ("11:15:00", 1000),
             ("11:25:00", 2000), ("11:35:00", 3000), ("11:45:00", 4000)]
    out = [_event(run_id, "Progress", i, at(t), step=s, metrics={"loss": 8.0 - s / 1000})
           for i, (t, s) in enumerate(steps)]
    out += [_event(run_id, "CheckpointSave", 1, at("10:10:00"), phase="started", step=1000, uri=CKPT),
            _event(run_id, "CheckpointSave", 2, at("10:11:00"), phase="completed", step=1000, uri=CKPT,
                   bytes=2_000_000_000),
            _event(run_id, "CheckpointRestore", 1, at("11:12:00"), phase="started", step=1000, uri=CKPT),
            _event(run_id, "CheckpointRestore", 2, at("11:13:00"), phase="completed", step=1000, uri=CKPT)]
    return out


def resumer_intake(run_id: str = RESUMER, uri: str = CKPT) -> list[tuple[Ms, dict[str, Any]]]:
    """A run that resumes bert-pt-2c5nw from a checkpoint (Resolution and Resume events only)."""
    return [_event(run_id, "Resolution", 1, at("12:00:00"), status="succeeded", project="nlp"),
            _event(run_id, "Resume", 1, at("12:00:01"), resume_of=RUN, checkpoint_uri=uri, step=1000)]


def intake_only(events: list[tuple[Ms, dict[str, Any]]]) -> RunHistory:
    """The history of a run made of intake events only."""
    red = Reducer()
    for _, record in events:
        red.apply(record, "intake")
    [run_id] = red.runs
    h = red.history(run_id)
    assert h is not None
    return h


_OWN = ("Progress", "CheckpointSave", "CheckpointRestore", "Resume")  # the scenario's own training events


def reducer(until: Ms | None = None) -> Reducer:
    """The preemption scenario with bert-pt-2c5nw's training events replaced by ``intake()``, and the resumer; with
    ``until``, only what happened before it."""
    writes = [(w.at, w.record) for w in _writes("preemption")
              if not (w.stream == "intake" and w.record.get("kind") in _OWN and w.record["run_id"] == RUN)]
    writes += intake() + resumer_intake()
    red = Reducer()
    for when, record in sorted(writes, key=lambda w: w[0]):
        if until is not None and when >= until:
            break
        red.apply(record, "preemption")
    return red


def checkpointed(until: Ms | None = None) -> RunHistory:
    h = reducer(until).history(RUN)
    assert h is not None
    return h


def resumer() -> RunHistory:
    h = reducer().history(RESUMER)
    assert h is not None
    return h
