"""Dead letters keep what identifies a record and the reason, never a secret, and their file is owner-only and
bounded: it rotates at a size, keeps a bounded number of files, and counts what it dropped."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracker.core.model import DeadLetter
from tracker.core.redact import REDACTED, identity, redact_inline, redact_text
from tracker.core.reducer import Reducer
from tracker.runtime.pipeline import JsonlDeadLetters, run_pipeline
from tracker.runtime.replay import dead_letter_file
from tracker.settings import load_settings
from tracker.shell.capture import interleave

JOB: dict[str, Any] = {
    "type": "ADDED",
    "object": {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": "train", "namespace": "team-a", "uid": "job-uid-1", "resourceVersion": "42",
            "creationTimestamp": "yesterday",  # malformed: a dead letter
            "labels": {"taugrid.io/run-id": "run-1"},
            "annotations": {
                "example.com/api-token": "plain-words-but-named-token",
                "example.com/opaque": "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5",
                "example.com/description": "a note that is kept",
                "taugrid.io/git-commit": "f158cbc3e64c9a1fb45d0263a5bf32bf220b99bf",
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
                    {"spec": {"containers": [{"env": [{"name": "A", "value": "lastappliedenv-value"}]}]}}),
            },
        },
        "spec": {"suspend": True, "template": {"spec": {"containers": [{
            "name": "trainer", "image": "acr.io/train:1",
            "args": ["--password=arg-password", "--hf-token", "flag-token-value", "--epochs", "3"],
            "env": [{"name": "DB_PASSWORD", "value": "env-password"}, {"name": "LR", "value": "env-plain-value"},
                    {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
        }]}}},
        "status": {"message": "pulled from https://bob:url-password@registry.example.com with Bearer bearer-token-1"},
    },
}
SECRETS = ["plain-words-but-named-token", "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5", "lastappliedenv-value", "arg-password",
           "flag-token-value", "env-password", "env-plain-value", "url-password", "bearer-token-1"]
KEPT = ["a note that is kept", "f158cbc3e64c9a1fb45d0263a5bf32bf220b99bf", "--epochs", "acr.io/train:1", "DB_PASSWORD",
        "LR", "FROM_SECRET", "yesterday", "registry.example.com"]
IDENTITY = {"kind": "Job", "apiVersion": "batch/v1", "namespace": "team-a", "name": "train", "uid": "job-uid-1",
            "resourceVersion": "42"}


def test_a_malformed_record_keeps_its_identity_and_reason_and_loses_its_secrets() -> None:
    red = Reducer()
    red.apply(JOB, "jobs.jsonl:7")
    (letter,) = red.flush().dead_letters
    assert (letter.source, letter.reason) == ("jobs.jsonl:7", "malformed Job")
    assert "creationTimestamp" in letter.detail
    assert letter.identity == IDENTITY
    text = letter.model_dump_json()
    assert [s for s in SECRETS if s in text] == []
    assert [k for k in KEPT if k not in letter.excerpt] == []
    assert json.loads(letter.excerpt)["object"]["metadata"]["uid"] == "job-uid-1", "still JSON when it fits"


@pytest.mark.parametrize("cut", [60, 150, 300, 450, 600, 750, 900, 1050])
def test_a_record_cut_anywhere_is_redacted_as_well(cut: int) -> None:
    """A line that did not parse is kept as text: cut short, its secrets are found by the keys that lead to them."""
    text = json.dumps(JOB)[:cut]
    red = redact_text(text)
    assert [s for s in SECRETS if s in red.text] == []
    assert [s[:8] for s in SECRETS if s[:8] in red.text] == [], "nor the start of one cut in the middle"
    assert red.identity == {k: v for k, v in IDENTITY.items() if f'"{v}"' in text}, "only values not cut"


def test_broken_lines_and_text_that_is_no_json() -> None:
    red = Reducer()
    red.reject("capture.jsonl:3", "invalid JSON: Expecting ',' delimiter",
               '{"type":"ADDED","object":{"kind":"Job","metadata":{"name":"j","namespace":"ns","uid":"u-9",'
               '"annotations":{"x/session":"s3ss10nT0ken99"}},"spec":{"template":{"spec":{"containers":[{"env":'
               '[{"name":"K","value":"v4lue-secret"}')
    red.reject("capture.jsonl:9", "invalid JSON: Expecting value", "password=hunter2 user: admin token: abc123xyz")
    red.reject("capture.jsonl:11", "invalid JSON: Expecting value",
               "{'kind': 'Pod', 'password': 'py-repr-secret', 'auth': {'user': 'u', 'key': 'nested-secret'}}")
    first, second, third = red.flush().dead_letters
    assert first.identity == {"kind": "Job", "name": "j", "namespace": "ns", "uid": "u-9"}
    assert "s3ss10nT0ken99" not in first.excerpt and "v4lue-secret" not in first.excerpt
    assert second.excerpt == f"password={REDACTED} user: admin token: {REDACTED}"
    assert "py-repr-secret" not in third.excerpt and "nested-secret" not in third.excerpt


def test_intake_events_and_unknown_kinds() -> None:
    red = Reducer()
    red.apply({"schema": "taugrid.io/intake/v1", "event_id": "e-1", "run_id": "run-1", "kind": "Resolution",
               "at": "2026-08-20T09:00:00Z", "status": "succeeded", "api_key": "intake-api-key",
               "message": "fetched https://x.blob.core.windows.net/c/cfg.yaml?sv=2024&sig=sas-signature-1"}, "i:1")
    red.apply({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Secret",
                                           "metadata": {"name": "db", "namespace": "ns", "uid": "s",
                                                        "resourceVersion": "1"},
                                           "data": {"config": "c2VjcmV0LWRhdGE="}, "stringData": {"u": "string-data"}}},
              "s:1")
    intake, unknown = red.flush().dead_letters
    assert intake.reason == "invalid intake event" and "api_key" in intake.detail
    assert intake.identity == {"kind": "Resolution", "run_id": "run-1", "event_id": "e-1"}
    assert "intake-api-key" not in intake.excerpt and "sas-signature-1" not in intake.excerpt
    assert "cfg.yaml" in intake.excerpt
    assert unknown.reason == "unknown kind" and unknown.identity["name"] == "db"
    assert "c2VjcmV0LWRhdGE=" not in unknown.excerpt and "string-data" not in unknown.excerpt


def test_every_maker_of_a_dead_letter_gets_the_redacted_form() -> None:
    """The Kafka reducer, the watcher and the capture publisher make DeadLetters themselves (a value too large,
    a record without a run key, a watcher error): the model redacts whatever it is given, and redacting again
    changes nothing."""
    raw = json.dumps(JOB)
    letter = DeadLetter(source="changes/0@12", reason="value too large", detail="Bearer abcdefgh12345678",
                        excerpt=raw[:2048])
    assert letter.identity == IDENTITY
    assert [s for s in SECRETS if s in letter.model_dump_json()] == []
    assert "abcdefgh12345678" not in letter.detail
    again = DeadLetter.model_validate_json(letter.model_dump_json())
    assert again == letter
    assert len(DeadLetter(source="s", reason="r", excerpt="x" * 5000).excerpt) == 2048


def test_inline_patterns() -> None:
    assert redact_inline("postgres://app:pa55@db:5432/x") == f"postgres://app:{REDACTED}@db:5432/x"
    assert redact_inline("Authorization: Bearer eyJhbGciOiJI.eyJzdWIiOiIx.c2ln") == \
        f"Authorization: Bearer {REDACTED}"
    assert redact_inline("--api-key sk-live-123 --epochs 3") == f"--api-key {REDACTED} --epochs 3"
    assert redact_inline("AWS_SECRET_ACCESS_KEY=abc/def+ghi") == f"AWS_SECRET_ACCESS_KEY={REDACTED}"
    assert redact_inline("plain text: nothing to hide, 42 epochs") == "plain text: nothing to hide, 42 epochs"
    assert identity({"schema": "x", "kind": "Progress", "run_id": "r", "event_id": "e"}) == {
        "kind": "Progress", "run_id": "r", "event_id": "e"}


# ------------------------------------------------------------------------------------------ the file


def letters(n: int, start: int = 0, size: int = 200) -> list[DeadLetter]:
    return [DeadLetter(source=f"c.jsonl:{i}", reason="invalid JSON", excerpt=f"{i:08d}" + "x" * size)
            for i in range(start, start + n)]


def test_the_file_is_owner_only_even_when_it_existed_before(tmp_path: Path) -> None:
    path = tmp_path / "index.dead-letters.jsonl"
    path.write_text("")
    path.chmod(0o644)
    old = os.umask(0)
    try:
        JsonlDeadLetters(path).write_dead_letters(letters(1))
        JsonlDeadLetters(tmp_path / "new.dead-letters.jsonl").write_dead_letters(letters(1))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "new.dead-letters.jsonl").stat().st_mode) == 0o600


def test_the_file_rotates_at_its_size_and_keeps_a_bounded_number(tmp_path: Path) -> None:
    path = tmp_path / "index.dead-letters.jsonl"
    dropped: list[int] = []
    sink = JsonlDeadLetters(path, max_bytes=10_000, files=3, on_drop=dropped.append)
    line = len(letters(1)[0].model_dump_json()) + 1
    total = 0
    for _ in range(40):
        sink.write_dead_letters(letters(17, start=total))
        total += 17
    kept = [path, *sink.rotated()]
    assert [p.name for p in kept] == [path.name, f"{path.name}.1", f"{path.name}.2"]
    assert all(p.stat().st_size <= 10_000 for p in kept)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in kept)
    lines = [json.loads(x) for p in reversed(kept) for x in p.read_text().splitlines()]
    assert len(lines) + sink.dropped == total and sum(dropped) == sink.dropped > 0
    assert len(lines) >= 2 * (10_000 // line), "the rotated files are full"
    numbers = [int(d["excerpt"][:8]) for d in lines]
    assert numbers == list(range(sink.dropped, total)), "the newest letters are kept, in order"

    one = JsonlDeadLetters(tmp_path / "one.jsonl", max_bytes=1_000, files=1)
    for _ in range(10):
        one.write_dead_letters(letters(3))
    assert not one.rotated() and one.dropped == 30 - len((tmp_path / "one.jsonl").read_text().splitlines())


def test_replay_of_many_bad_lines_stays_within_the_bound(tmp_path: Path) -> None:
    capture = tmp_path / "bad.jsonl"
    with capture.open("w") as fh:
        for i in range(20_000):
            fh.write(f'{{"type": "ADDED", "object": {{"kind": "Pod", "metadata": {{"name": "p-{i}"}}, oops}}\n')
    dead = JsonlDeadLetters(tmp_path / "index.dead-letters.jsonl", max_bytes=256 * 1024, files=4)
    report = asyncio.run(run_pipeline(interleave([capture]), Reducer(), sinks=[], dead_letters=dead))
    assert report.dead_letters == 20_000
    kept = [dead.path, *dead.rotated()]
    assert len(kept) == 4 and sum(p.stat().st_size for p in kept) <= 4 * 256 * 1024
    assert dead.dropped == 20_000 - sum(len(p.read_text().splitlines()) for p in kept) > 0


def test_the_bound_is_a_setting_with_sane_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert (s.embedded.dead_letter_file_bytes, s.embedded.dead_letter_files) == (64 * 1024 * 1024, 5)
    monkeypatch.setenv("TRACKER_EMBEDDED__DEAD_LETTER_FILE_BYTES", "100000")
    monkeypatch.setenv("TRACKER_EMBEDDED__DEAD_LETTER_FILES", "2")
    dead = dead_letter_file(load_settings().embedded, tmp_path / "runs.sqlite")
    assert (dead.path.name, dead.max_bytes, dead.files) == ("runs.dead-letters.jsonl", 100_000, 2)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)
SECRET = "Hyp0thesisSecretValue77"


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300))
def test_any_text_makes_a_dead_letter(text: str) -> None:
    letter = DeadLetter(source="s", reason=text, detail=text, excerpt=text)
    assert len(letter.excerpt) <= 2048
    assert DeadLetter.model_validate_json(letter.model_dump_json()).excerpt == letter.excerpt


@settings(max_examples=300, deadline=None)
@given(value=json_values, key=st.sampled_from(["password", "apiToken", "client_secret", "auth", "sshKey"]),
       cut=st.integers(min_value=1, max_value=600), data=st.data())
def test_a_secret_under_a_secret_key_never_survives_anywhere_in_any_structure(
        value: Any, key: str, cut: int, data: st.DataObject) -> None:
    """The secret is put in a random place of a random structure, under a secret-looking key; the JSON is kept
    whole or cut anywhere: neither the secret nor its first 8 characters survive."""
    def plant(v: Any) -> Any:
        if isinstance(v, dict) and data.draw(st.booleans()):
            return {**{k: plant(x) for k, x in v.items()}, key: SECRET}
        if isinstance(v, dict):
            return {k: plant(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plant(x) for x in v]
        return v
    record = {"type": "ADDED", "object": {"kind": "Pod", "spec": plant(value), key: SECRET}}
    text = json.dumps(record, sort_keys=data.draw(st.booleans()))
    for excerpt in (text, text[:cut]):
        out = DeadLetter(source="s", reason="r", excerpt=excerpt).excerpt
        assert SECRET[:8] not in out
