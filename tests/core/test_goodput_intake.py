"""Intake schema v2 (step records, checkpoint saves and restores, the run a resume came from): what it accepts,
that every v1 event is still read as before, that a bad event is a dead letter with its reason and stops nothing,
and that the published schemas say the same as the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tracker.core.model import INTAKE_SCHEMA, IntakeEnvelope, to_json
from tracker.core.reducer import Reducer

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "intake"
Obj = dict[str, Any]


def ev(kind: str, at: str, event_id: str, schema: str = INTAKE_SCHEMA, **fields: Any) -> Obj:
    return {"schema": schema, "event_id": event_id, "run_id": "run-1", "at": at, "kind": kind, **fields}


V1 = [
    ev("Resolution", "2026-08-20T10:00:00Z", "r1", "taugrid.io/intake/v1", status="succeeded", project="p",
       workspace="w", target="t"),
    ev("Rendering", "2026-08-20T10:00:01Z", "r2", "taugrid.io/intake/v1", status="succeeded", workload_kind="Job",
       namespace="ns", name="job"),
    ev("Progress", "2026-08-20T10:05:00Z", "p1", "taugrid.io/intake/v1", step=100, metrics={"loss": 2.0}),
    ev("Progress", "2026-08-20T10:10:00Z", "p2", "taugrid.io/intake/v1", step=200, metrics={"loss": 1.0},
       checkpoint_uri="abfss://c/run-1/step-200"),
]
V2 = [
    ev("CheckpointSave", "2026-08-20T10:11:00Z", "s1", phase="started", step=300, uri="abfss://c/run-1/step-300"),
    ev("CheckpointSave", "2026-08-20T10:11:20.5Z", "s2", phase="completed", step=300, uri="abfss://c/run-1/step-300",
       bytes=12_884_901_888),
    ev("CheckpointRestore", "2026-08-20T10:30:00Z", "x1", phase="started", step=300, uri="abfss://c/run-1/step-300"),
    ev("CheckpointRestore", "2026-08-20T10:30:40Z", "x2", phase="completed", step=300,
       uri="abfss://c/run-1/step-300"),
    ev("Resume", "2026-08-20T10:00:02Z", "m1", resume_of="run-0", checkpoint_uri="abfss://c/run-0/step-900",
       step=900),
]


def test_every_v1_and_v2_event_validates_against_its_published_schema_and_the_model() -> None:
    v1 = json.loads((SCHEMAS / "v1.schema.json").read_text())
    v2 = json.loads((SCHEMAS / "v2.schema.json").read_text())
    for e in V1:
        jsonschema.validate(e, v1)  # the published v1 contract is unchanged...
        jsonschema.validate(e, v2)  # ...and v2 reads every v1 event
        IntakeEnvelope.model_validate({"event": e})
    for e in V2:
        jsonschema.validate(e, v2)
        IntakeEnvelope.model_validate({"event": e})
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(e, v1)


def test_v1_events_read_as_they_did_and_v1s_checkpoint_is_a_completed_save() -> None:
    red = Reducer()
    for i, e in enumerate(V1):
        red.apply(e, f"v1:{i}")
    h = red.history("run-1")
    assert h is not None and not red.dead
    assert [(m.metric, m.first_step, m.latest_step) for m in h.metrics] == [("loss", 100, 200)]
    assert h.run.last_checkpoint == "abfss://c/run-1/step-200"
    assert [(c.kind, c.step, c.status, c.started_at) for c in h.checkpoints] == [("save", 200, "completed", None)]
    assert h.run.checkpoints_saved == 1


def test_v2_checkpoints_and_the_resume_make_the_runs_checkpoint_history_and_lineage() -> None:
    red = Reducer()
    for i, e in enumerate([*V1, *V2]):
        red.apply(e, f"in:{i}")
    h = red.history("run-1")
    assert h is not None and not red.dead
    saves = [c for c in h.checkpoints if c.kind == "save"]
    assert [(c.step, c.status, c.bytes) for c in saves] == [(200, "completed", None),
                                                            (300, "completed", 12_884_901_888)]
    assert saves[1].ended_at is not None and saves[1].started_at is not None
    assert (saves[1].ended_at - saves[1].started_at).total_seconds() == 20.5
    restores = [c for c in h.checkpoints if c.kind == "restore"]
    assert [(c.step, c.status) for c in restores] == [(300, "completed")]
    assert h.run.resume_of == "run-0" and h.run.resumed_from == "abfss://c/run-0/step-900"
    assert h.run.last_checkpoint == "abfss://c/run-1/step-300"
    assert [link.resume_of for link in h.resume_links] == ["run-0"]


@pytest.mark.parametrize(("record", "detail"), [
    (ev("CheckpointSave", "2026-08-20T10:11:00Z", "b1", phase="begun", step=1, uri="u"), "phase"),
    (ev("CheckpointSave", "2026-08-20T10:11:00Z", "b2", phase="started", step=-1, uri="u"), "step"),
    (ev("CheckpointSave", "2026-08-20T10:11:00Z", "b3", phase="started", step=1, uri=""), "uri"),
    (ev("CheckpointSave", "2026-08-20T10:11:00Z", "b4", phase="started", step=1, uri="u" * 5000), "uri"),
    (ev("CheckpointRestore", "2026-08-20T10:11:00Z", "b5", phase="completed", step=1), "uri"),
    (ev("Resume", "2026-08-20T10:11:00Z", "b6"), "resume_of"),
    (ev("CheckpointSave", "2026-08-20T10:11:00Z", "b7", "taugrid.io/intake/v1", phase="started", step=1, uri="u"),
     "schema"),
    (ev("CheckpointSave", "not a time", "b8", phase="started", step=1, uri="u"), "at"),
])
def test_a_bad_v2_event_is_a_dead_letter_saying_why_and_stops_nothing(record: Obj, detail: str) -> None:
    red = Reducer()
    red.apply(V2[0], "good:0")
    red.apply(record, "bad:0")
    red.apply(V2[1], "good:1")
    out = red.flush()
    assert [d.reason for d in out.dead_letters] == ["invalid intake event"]
    assert detail in out.dead_letters[0].detail
    h = red.history("run-1")
    assert h is not None and [(c.step, c.status) for c in h.checkpoints] == [(300, "completed")]


def test_checkpoint_events_in_any_order_and_repeated_give_the_same_history() -> None:
    def history(records: list[Obj]) -> Any:
        red = Reducer()
        for i, e in enumerate(records):
            red.apply(e, f"r:{i}")
        h = red.history("run-1")
        assert h is not None
        return h.checkpoints, h.run.resumed_from, h.run.last_checkpoint, h.run.ledger_wall_s_by

    once = history([*V1, *V2])
    assert history([*reversed(V2), *V1, *V2]) == once


@pytest.mark.parametrize("schema", [["taugrid.io/intake/v2"], {"v": 2}, 2, None])
def test_an_intake_event_whose_schema_is_not_a_string_is_a_dead_letter(schema: Any) -> None:
    red = Reducer()
    red.apply({**V2[0], "schema": schema}, "bad:0")
    red.apply(V2[1], "good:0")
    out = red.flush()
    assert [d.reason for d in out.dead_letters] == ["unknown intake schema version"]
    h = red.history("run-1")
    assert h is not None and [(c.step, c.status) for c in h.checkpoints] == [(300, "completed")]


def test_a_checkpoint_uris_credentials_are_never_kept() -> None:
    """A checkpoint URI may carry a credential (a SAS signature, a password): the history, and so the index, the
    topic, ADX and every view, holds it redacted."""
    sas = "https://acct.blob.core.windows.net/ckpt/step-300?sv=2024-08-04&sig=s3cr3tSIGNATURE%2Bx&se=2026-12-31"
    pw = "https://trainer:hunter2pass@store.example/ckpt/step-200"
    red = Reducer()
    for i, e in enumerate([
            ev("Progress", "2026-08-20T10:10:00Z", "p", "taugrid.io/intake/v1", step=200, checkpoint_uri=pw),
            ev("CheckpointSave", "2026-08-20T10:11:00Z", "s1", phase="started", step=300, uri=sas),
            ev("CheckpointSave", "2026-08-20T10:11:20Z", "s2", phase="completed", step=300, uri=sas),
            ev("CheckpointRestore", "2026-08-20T10:30:00Z", "x1", phase="started", step=300, uri=sas),
            ev("Resume", "2026-08-20T10:00:02Z", "m1", resume_of="run-0", checkpoint_uri=sas)]):
        red.apply(e, f"in:{i}")
    h = red.history("run-1")
    assert h is not None
    text = json.dumps(to_json(h))
    assert "s3cr3tSIGNATURE" not in text and "hunter2pass" not in text
    assert {c.uri for c in h.checkpoints} == {"https://trainer:[redacted]@store.example/ckpt/step-200",
                                              sas.replace("s3cr3tSIGNATURE%2Bx", "[redacted]")}
    assert h.run.resumed_from is not None and "[redacted]" in h.run.resumed_from
