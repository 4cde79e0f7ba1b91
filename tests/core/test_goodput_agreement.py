"""The tracker's goodput ledger side by side with Google's calculator (``ml-goodput-measurement`` 0.2.3).

The same timelines (attempts, steps, checkpoint saves and restores, disruptions) are fed to Google's calculator
(``tests/support/goodput_reference.py``: offline, its log source in memory) and to the tracker: as the Kubernetes
objects a
Kueue-managed Job writes (Job, Workload, one 8-GPU pod per attempt) and the training process's intake events,
through the reducer. The figures must agree within 1 percentage point on goodput and within 1% per shared category,
once the differences by design are accounted for. Each is named here, computed from the timeline alone (never from
either side's output), and documented in ``schemas/goodput.md`` ("Against Google's ml-goodput-measurement"):

- ``TIME_BASE``: Google's total starts at the first job start (the pods binding); the tracker's wall ledger at the
  queueing. The tracker's time before the first bind (its ``scheduling``) is left out of the comparison.
- ``INTERRUPTION_TAIL``: Google never learns when an attempt was evicted: the last step's start to the eviction is
  its infrastructure recovery; the tracker, which reads the eviction from Kueue, counts it wasted progress.
- ``RESTART``: the program's restart to its first step is Google's OTHER (less the restore); the tracker's
  infrastructure recovery runs to the first step record. The two sums, recovery + OTHER and recovery + startup,
  are compared.
- ``FIRST_STEP``: Google moves each stretch's first step's excess over the mean step time to PROGRAM_STARTUP; the
  tracker counts it productive.
- ``SAVE_IN_WASTED``: Google subtracts every save from productive time, including a save that lies in the wasted
  progress (which it counts there too); the tracker counts each instant once, as ``checkpoint-save``.
- ``RESTART_FROM_SCRATCH``: a restart at step 0 (no checkpoint yet) is no wasted progress for Google (the lost
  steps go to OTHER); for the tracker the whole stretch was wasted.
- ``RESTORE_AVERAGED``: Google counts a checkpoint restored several times (an attempt interrupted before it saved
  a newer one) once, at the mean of its restores; the rest is its OTHER. The tracker counts every restore.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.goodput_reference import (
    GoogleFigures,
    RefAttempt,
    RefTimeline,
    google_figures,
    random_timeline,
    validate,
)
from tracker.core.ledger import LedgerAttempt, LedgerInput, Save, ledger
from tracker.core.model import RunHistory
from tracker.core.reducer import Reducer

Obj = dict[str, Any]
NS, JOB, JOB_UID, WL, WL_UID, RUN = "team-a", "llm-pt", "job-uid-g", "job-llm-pt-1a2b3", "wl-uid-g", "run-goodput"
GPUS = 8
CKPT = "abfss://ckpt@taugrid.dfs.core.windows.net/run-goodput/step-{:08d}"


def _t(sec: float) -> str:
    dt = datetime.fromtimestamp(sec // 1, tz=UTC).replace(microsecond=round((sec % 1) * 1e6) % 1_000_000)
    text = dt.isoformat(timespec="microseconds" if dt.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def whole_seconds(tl: RefTimeline) -> RefTimeline:
    """The timeline with the times the Kubernetes objects carry in whole seconds (metav1.Time): binds rounded down,
    interruptions, releases and the end rounded up. The intake events keep their microseconds."""
    atts = []
    for i, a in enumerate(tl.attempts):
        nxt = tl.attempts[i + 1].bind if i + 1 < len(tl.attempts) else None
        x = math.ceil(a.interrupted_at) if a.interrupted_at is not None else None
        rel = a.release
        if x is not None and rel is not None and nxt is not None:
            rel = float(min(max(math.ceil(rel), x), math.floor(nxt)))
        atts.append(replace(a, bind=float(math.floor(a.bind)), interrupted_at=None if x is None else float(x),
                            release=rel))
    end = float(math.ceil(tl.end))
    atts[-1] = replace(atts[-1], release=end)
    out = RefTimeline(tuple(atts), end)
    validate(out)
    return out


# --------------------------------------------------------------------------- the timeline as the tracker sees it

class _Writer:
    def __init__(self) -> None:
        self.records: list[Obj] = []
        self.rv = 0
        self.intake_n = 0

    def obj(self, etype: str, obj: Obj) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.records.append({"type": etype, "object": obj})

    def intake(self, at: float, kind: str, **fields: Any) -> None:
        self.intake_n += 1
        self.records.append({"schema": "taugrid.io/intake/v2", "event_id": f"e{self.intake_n}", "run_id": RUN,
                             "at": _t(at), "kind": kind, **fields})


def _cond(type_: str, status: str, reason: str, at: float, message: str = "") -> Obj:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": _t(at)}


def _job(created: float, suspend: bool, conds: list[Obj]) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": JOB, "namespace": NS, "uid": JOB_UID, "creationTimestamp": _t(created),
                         "labels": {"taugrid.io/run-id": RUN, "kueue.x-k8s.io/queue-name": "gpu-lq"}},
            "spec": {"suspend": suspend, "parallelism": 1, "completions": 1,
                     "template": {"spec": {"containers": []}}},
            "status": {"conditions": conds}}


def _workload(created: float, conds: list[Obj]) -> Obj:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": WL, "namespace": NS, "uid": WL_UID, "creationTimestamp": _t(created),
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": JOB_UID,
                                              "controller": True}]},
            "spec": {"queueName": "gpu-lq", "podSets": [{"name": "main", "count": 1}]},
            "status": {"conditions": conds, "admission": {"clusterQueue": "gpu-cq", "podSetAssignments": []}}}


def _pod(n: int, created: float, bound: float, started: float, *, finished: float | None = None, code: int = 0,
         deleted: float | None = None) -> Obj:
    meta: Obj = {"name": f"{JOB}-{n}", "namespace": NS, "uid": f"pod-uid-{n}", "creationTimestamp": _t(created),
                 "labels": {"batch.kubernetes.io/controller-uid": JOB_UID, "taugrid.io/run-id": RUN},
                 "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": JOB_UID,
                                      "controller": True}]}
    if deleted is not None:
        meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = _t(deleted + 30), 30
    state: Obj = {"running": {"startedAt": _t(started)}}
    phase = "Running"
    if finished is not None:
        state = {"terminated": {"startedAt": _t(started), "finishedAt": _t(finished), "exitCode": code,
                                "reason": "Completed" if code == 0 else "Error"}}
        phase = "Succeeded" if code == 0 else "Failed"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": f"gpu-node-{n}", "containers": [{
                "name": "main", "resources": {"requests": {"nvidia.com/gpu": str(GPUS)}}}]},
            "status": {"phase": phase, "conditions": [_cond("PodScheduled", "True", "", bound)],
                       "containerStatuses": [{"name": "main", "state": state}]}}


def tracker_records(tl: RefTimeline) -> list[Obj]:
    """The records a Kueue-managed Job with this timeline makes: objects (whole seconds) and intake events."""
    w = _Writer()
    a0 = tl.attempts[0]
    created = a0.bind - 120
    w.obj("ADDED", _job(created, True, []))
    wl_conds = [_cond("QuotaReserved", "False", "Pending", created + 1, "insufficient quota")]
    w.obj("ADDED", _workload(created + 1, list(wl_conds)))
    admitted_prev = created + 1
    for n, a in enumerate(tl.attempts):
        adm = max(admitted_prev + 1, a.bind - 20)
        if n:
            adm = max(adm, (tl.attempts[n - 1].interrupted_at or 0) + 1)
        wl_conds = [c for c in wl_conds if c["type"] not in ("QuotaReserved", "Admitted", "Evicted")]
        wl_conds += [_cond("QuotaReserved", "True", "QuotaReserved", adm), _cond("Admitted", "True", "Admitted", adm)]
        if n:
            wl_conds.append(_cond("Evicted", "False", "QuotaReserved", adm, "Previously: evicted"))
        w.obj("MODIFIED", _workload(created + 1, list(wl_conds)))
        w.obj("MODIFIED", _job(created, False, []))
        started = a.bind + 1
        w.obj("ADDED", _pod(n, a.bind - 10, a.bind, started))
        for step, s, e in a.restores:
            uri = CKPT.format(step)
            w.intake(s, "CheckpointRestore", phase="started", step=step, uri=uri)
            w.intake(e, "CheckpointRestore", phase="completed", step=step, uri=uri)
        for step, at in a.steps:
            w.intake(at, "Progress", step=step, metrics={"loss": 1.0 / (step + 1)})
        for step, s, e in a.saves:
            uri = CKPT.format(step)
            w.intake(s, "CheckpointSave", phase="started", step=step, uri=uri)
            w.intake(e, "CheckpointSave", phase="completed", step=step, uri=uri, bytes=1 << 30)
        if a.interrupted_at is not None:
            x = a.interrupted_at
            assert a.release is not None
            wl_conds = [c for c in wl_conds if c["type"] not in ("QuotaReserved", "Admitted", "Evicted")]
            wl_conds += [_cond("Evicted", "True", "Preempted", x, "Preempted to accommodate a workload"),
                         _cond("QuotaReserved", "False", "Pending", x, "Preempted to accommodate a workload"),
                         _cond("Admitted", "False", "NoReservation", x),
                         _cond("Requeued", "True", "Preempted", x)]
            w.obj("MODIFIED", _workload(created + 1, list(wl_conds)))
            w.obj("MODIFIED", _job(created, True, []))
            w.obj("MODIFIED", _pod(n, a.bind - 10, a.bind, started, deleted=x))
            w.obj("MODIFIED", _pod(n, a.bind - 10, a.bind, started, deleted=x, finished=a.release, code=143))
            w.obj("DELETED", _pod(n, a.bind - 10, a.bind, started, deleted=x, finished=a.release, code=143))
            admitted_prev = x
        else:
            end = tl.end
            w.obj("MODIFIED", _pod(n, a.bind - 10, a.bind, started, finished=end))
            w.obj("MODIFIED", _job(created, False, [_cond("Complete", "True", "CompletionsReached", end)]))
            w.obj("MODIFIED", _workload(created + 1, [*wl_conds, _cond("Finished", "True", "Succeeded", end)]))
    return w.records


def tracker_history(tl: RefTimeline) -> RunHistory:
    red = Reducer()
    for i, rec in enumerate(tracker_records(tl)):
        red.apply(rec, f"timeline:{i}")
    assert not red.dead, red.dead[:3]
    h = red.history(RUN)
    assert h is not None
    return h


# --------------------------------------------------------------------------- the comparison

@dataclass(frozen=True)
class Compared:
    """One figure on both sides: Google's, and the tracker's in Google's terms (the named corrections applied)."""

    name: str
    google: float
    tracker: float

    def ok(self, total: float) -> bool:
        # 1% of the larger of the two, with a floor of 0.01% of the total (a category of a second in a day's run)
        return abs(self.google - self.tracker) <= max(0.01 * max(abs(self.google), abs(self.tracker)),
                                                      1e-4 * total)


def _saves_within(a: RefAttempt, lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for _step, s, e in a.saves)


def corrections(tl: RefTimeline) -> dict[str, float]:
    """The named differences by design, in seconds, from the timeline alone."""
    tail = save_in_wasted = scratch = 0.0
    for i, a in enumerate(tl.attempts[:-1]):
        x = a.interrupted_at
        assert x is not None
        resume = tl.attempts[i + 1].steps[0][0]
        last_start = a.steps[-1][1]
        tail += x - last_start
        if resume == 0:  # RESTART_FROM_SCRATCH: the stretch's steps are Google's OTHER, not wasted progress
            scratch += last_start - a.steps[0][1]
            continue
        reached = next(at for step, at in a.steps if step == resume)
        save_in_wasted += _saves_within(a, reached, x)
    restores: dict[int, list[float]] = {}
    for a in tl.attempts:
        for step, s, e in a.restores:
            restores.setdefault(step, []).append(e - s)
    averaged = sum(sum(d) - sum(d) / len(d) for d in restores.values())
    return {"INTERRUPTION_TAIL": tail, "SAVE_IN_WASTED": save_in_wasted, "RESTART_FROM_SCRATCH": scratch,
            "RESTORE_AVERAGED": averaged}


def compare(tl: RefTimeline, h: RunHistory | None = None) -> tuple[list[Compared], float, float, float]:
    """The shared figures, Google's goodput (percent), the tracker's in Google's terms, and the tracker's own
    productive share of the same time (no corrections); ``h``: the tracker's history of the timeline (default: made
    from the timeline's records)."""
    g: GoogleFigures = google_figures(tl)
    h = h or tracker_history(tl)
    wall = h.run.ledger_wall_s_by
    # TIME_BASE: Google's time starts at the first bind; the tracker's ledger at the run's queueing, which is before
    # (its scheduling, and any startup before the first pod bound)
    assert h.run.finished_at is not None
    pre_bind = sum(wall.values()) - (h.run.finished_at.timestamp() - tl.attempts[0].bind)
    total = sum(wall.values()) - pre_bind
    c = corrections(tl)
    gb = g.badput_s
    first_step = gb.get("PROGRAM_STARTUP", 0.0)
    productive = wall.get("productive", 0.0)
    rows = [
        Compared("total", g.total_s, total),
        Compared("productive", g.productive_s + first_step, productive - c["SAVE_IN_WASTED"]),
        Compared("wasted-progress", gb.get("WASTED_PROGRESS_FROM_DISRUPTION", 0.0) + c["RESTART_FROM_SCRATCH"],
                 wall.get("wasted-progress", 0.0) + c["SAVE_IN_WASTED"] - c["INTERRUPTION_TAIL"]),
        Compared("recovery and startup", gb.get("INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", 0.0) +
                 gb.get("OTHER", 0.0) - c["RESTART_FROM_SCRATCH"] - c["RESTORE_AVERAGED"],
                 wall.get("infrastructure-recovery", 0.0) + wall.get("startup", 0.0) + wall.get("scheduling", 0.0) -
                 pre_bind + c["INTERRUPTION_TAIL"]),
        Compared("checkpoint-save", gb.get("UNPRODUCTIVE_CHECKPOINT_SAVE_TIME", 0.0),
                 wall.get("checkpoint-save", 0.0)),
        Compared("checkpoint-restore", gb.get("UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME", 0.0) + c["RESTORE_AVERAGED"],
                 wall.get("checkpoint-restore", 0.0)),
    ]
    in_google_terms = 100 * (productive - c["SAVE_IN_WASTED"] - first_step) / total
    return rows, g.goodput_pct, in_google_terms, 100 * productive / total


def _assert_agree(tl: RefTimeline, h: RunHistory | None = None) -> tuple[float, float]:
    rows, google, tracker, raw = compare(tl, h)
    total = rows[0].google
    bad = [r for r in rows if not r.ok(total)]
    assert not bad, f"disagree: {bad}"
    assert abs(google - tracker) <= 1.0, (google, tracker)
    return abs(google - tracker), abs(google - raw)


# a restore of the same checkpoint twice is averaged by Google, and a checkpoint saved twice too: the generator
# saves a step once and restores each checkpoint once per interruption (see goodput_reference.random_timeline)
SEEDS = range(60)  # each its own test case; the figures test goes over FIGURE_SEEDS
FIGURE_SEEDS = range(400)


@pytest.mark.parametrize("seed", SEEDS)
def test_goodput_agrees_with_googles_calculator_on_generated_runs(seed: int) -> None:
    tl = whole_seconds(random_timeline(random.Random(seed)))
    _assert_agree(tl)


def test_agreement_figures() -> None:
    """The worst differences over every generated run, for the record (printed with -s), and a bound on each."""
    worst = worst_raw = 0.0
    worst_cat: dict[str, float] = {}
    n = disrupted = 0
    for seed in FIGURE_SEEDS:
        tl = whole_seconds(random_timeline(random.Random(seed)))
        d, raw = _assert_agree(tl)
        worst, worst_raw, n = max(worst, d), max(worst_raw, raw), n + 1
        disrupted += len(tl.attempts) > 1
        rows, *_ = compare(tl)
        for r in rows:
            if max(abs(r.google), abs(r.tracker)) >= 1.0:  # relative differences of categories of a second or more
                rel = abs(r.google - r.tracker) / max(abs(r.google), abs(r.tracker))
                worst_cat[r.name] = max(worst_cat.get(r.name, 0.0), rel)
    print(f"\ngoodput agreement: {n} runs ({disrupted} with disruptions), worst |google - tracker| {worst:.4f} pp "
          f"(before the named corrections: {worst_raw:.2f} pp); worst relative difference per category: " +
          ", ".join(f"{k} {v:.2e}" for k, v in worst_cat.items()))
    assert n == len(FIGURE_SEEDS) and worst <= 1.0 and max(worst_cat.values()) <= 0.01


def test_a_checkpointed_eviction_is_wasted_only_since_the_checkpoint_on_both_sides() -> None:
    """A hand-made timeline: 100 steps of 10 s, a checkpoint of step 50 (5 s), evicted 3 s into step 99's
    interval, back 600 s later, restoring step 50 (20 s) and running to step 120."""
    t0 = 1_787_216_400.0
    steps1 = []
    now = t0 + 60
    saves1 = []
    for s in range(100):
        steps1.append((s, now))
        if s == 50:
            saves1.append((50, now, now + 5))
            now += 5
        now += 10
    x = steps1[-1][1] + 3
    a1 = RefAttempt(t0, tuple(steps1), tuple(saves1), (), x, x + 10)
    b2 = x + 600
    steps2 = [(50 + i, b2 + 60 + 10 * i) for i in range(71)]
    a2 = RefAttempt(b2, tuple(steps2), (), ((50, b2 + 20, b2 + 40),), None, None)
    end = steps2[-1][1] + 10
    tl = whole_seconds(RefTimeline((a1, replace(a2, release=end)), end))
    h = tracker_history(tl)
    wall = h.run.ledger_wall_s_by
    save_end = saves1[0][2]
    assert wall["wasted-progress"] == pytest.approx(x - save_end, abs=1e-6)
    assert wall["checkpoint-save"] == pytest.approx(5.0)
    assert wall["checkpoint-restore"] == pytest.approx(20.0)
    assert h.attempts[0].ledger_gpu_hours_by["wasted-progress"] == pytest.approx(GPUS * (x - save_end) / 3600)
    assert h.run.ledger_basis == "progress" and h.run.checkpoints_saved == 1
    assert h.run.resumed_from == CKPT.format(50)
    _assert_agree(tl)


def test_a_run_waiting_after_its_eviction_is_in_recovery_and_has_wasted_only_since_its_checkpoint() -> None:
    """The records of a two-attempt timeline up to the first attempt's pod deletion: the run waits to be admitted
    again. Its ledger goes on in infrastructure recovery (not scheduling: it was interrupted), and what it has
    wasted so far is the time since its last checkpoint."""
    t0 = 1_787_216_400.0
    steps = tuple((s, t0 + 60 + 10 * s) for s in range(40))
    save = (30, steps[30][1], steps[30][1] + 4)
    x = steps[-1][1] + 5.0
    a1 = RefAttempt(t0, steps, (save,), (), x, x + 10)
    a2 = RefAttempt(x + 900, ((30, x + 960), (31, x + 970)), (), (), None, x + 980)
    tl = whole_seconds(RefTimeline((a1, a2), x + 980))
    records = tracker_records(tl)
    cut = next(i for i, r in enumerate(records) if r.get("type") == "DELETED")
    x1 = tl.attempts[0].interrupted_at
    assert x1 is not None
    red = Reducer()
    for i, rec in enumerate(records[:cut + 1]):
        red.apply(rec, f"cut:{i}")
    h = red.history(RUN)
    assert h is not None and h.run.status.value == "pending" and h.run.attempts == 2
    assert h.run.ledger_open == "infrastructure-recovery"
    assert h.run.ledger_wall_s_by["wasted-progress"] == pytest.approx(x1 - save[2], abs=1e-6)
    assert "scheduling" not in h.attempts[1].ledger_wall_s_by


def test_a_pending_span_known_past_the_last_pod_keeps_the_waiting_run_in_recovery() -> None:
    """The ledger's horizon covers every time it was given: a re-queued attempt's backoff span that ended after the
    evicted pods' release (Requeued=True a minute later) is recovery up to its end, and the run is in recovery
    there (it was scheduling when the horizon stopped at the release)."""
    s = 1_000_000
    a1 = LedgerAttempt(0, 100 * s, True, [], [(10 * s, 8), (105 * s, -8)], 8 * 95 * s, 8 * 95 * s)
    a2 = LedgerAttempt(100 * s, None, False, [("backoff", 100 * s, 160 * s), ("queued", 160 * s, None)], [], 0, 0)
    led = ledger(LedgerInput([a1, a2], [(20 * s, 0), (50 * s, 30)], [Save(50 * s, 54 * s, 30, True)], [], None,
                             False))
    assert led.until == 160 * s and led.open == "infrastructure-recovery"
    assert led.wall_us[1] == {"infrastructure-recovery": 60 * s}
    assert led.gpu_us[0]["wasted-progress"] == 8 * (100 - 54) * s


# --------------------------------------------------------------------------- the bundled scenarios

def timeline_of(h: RunHistory, intake: list[Obj]) -> RefTimeline | None:
    """A bundled run's timeline as Google's calculator reads it, from its history (attempts, pods) and its intake
    events; None for a run it cannot read as one job of stretches (a restart inside an attempt, pods of an attempt
    binding apart, steps not recorded after the bind). ``SAMPLED_STEPS``: the scenarios report every 500th step,
    and Google counts only intervals between consecutive step numbers, so the recorded steps are numbered 1, 2, 3...
    for it (a restart names the number of the step it restored)."""
    def ts(x: str) -> float:
        return datetime.fromisoformat(x.replace("Z", "+00:00")).timestamp()

    assert h.pods is not None
    number = {s: i + 1 for i, s in enumerate(sorted({e["step"] for e in intake if e["kind"] == "Progress"}))}
    atts: list[RefAttempt] = []
    for i, a in enumerate(h.attempts):
        binds = [p.scheduled_at.timestamp() for p in h.pods if p.attempt == a.attempt and p.scheduled_at and p.gpus]
        if not binds or max(binds) - min(binds) > 5:
            return None
        lo = a.queued_at.timestamp() if a.queued_at else -math.inf
        nxt = h.attempts[i + 1].queued_at if i + 1 < len(h.attempts) else None
        hi = nxt.timestamp() if nxt else math.inf
        mine = [e for e in intake if lo <= ts(e["at"]) < hi]
        steps = tuple((number[e["step"]], ts(e["at"])) for e in mine if e["kind"] == "Progress")
        if not steps or steps[0][1] < min(binds):
            return None

        def ops(kind: str, events: list[Obj] = mine) -> tuple[tuple[int, float, float], ...]:
            start = {(e["step"], e["uri"]): ts(e["at"]) for e in events
                     if e["kind"] == kind and e["phase"] == "started"}
            return tuple((number.get(e["step"], 0), start[(e["step"], e["uri"])], ts(e["at"])) for e in events
                         if e["kind"] == kind and e["phase"] == "completed" and (e["step"], e["uri"]) in start)

        last = i == len(h.attempts) - 1
        x = None if last or a.ended_at is None else a.ended_at.timestamp()
        releases = [p.released_at.timestamp() for p in h.pods if p.attempt == a.attempt and p.released_at]
        atts.append(RefAttempt(min(binds), steps, ops("CheckpointSave"), ops("CheckpointRestore"), x,
                               max(releases) if releases else None))
    if h.run.finished_at is None:
        return None
    tl = RefTimeline(tuple(atts), h.run.finished_at.timestamp())
    try:
        validate(tl)
    except ValueError:
        return None
    return tl


def test_goodput_agrees_with_googles_calculator_on_the_bundled_scenarios() -> None:
    """Every bundled run that reported progress, finished, and that Google's calculator can read as one job of
    stretches (``timeline_of``); the others are named, and at least three are compared."""
    from sim.scenarios import SCENARIOS

    compared, skipped = [], []
    for name, sc in SCENARIOS.items():
        red = Reducer()
        intake: list[Obj] = []
        for stream, records in sc.streams().items():
            for rec in records:
                red.apply(rec, name)
                if stream == "intake":
                    intake.append(rec)
        for run_id in sc.run_ids:
            h = red.history(run_id)
            if h is None or h.run.ledger_basis != "progress" or h.run.status.value != "succeeded":
                continue
            tl = timeline_of(h, [e for e in intake if e.get("run_id") == run_id])
            if tl is None:
                skipped.append(run_id)
                continue
            _assert_agree(tl, h)
            compared.append(run_id)
    print(f"\nbundled scenarios: compared {compared}; not readable as one job by Google's calculator: {skipped}")
    assert len(compared) >= 3, (compared, skipped)
