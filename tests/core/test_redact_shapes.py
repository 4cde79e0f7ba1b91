"""The redactor's shapes (README "What is redacted"): each credential shape is redacted with what names it kept,
ordinary text is left alone, and redaction is idempotent and copies an object only when it changes it."""

from __future__ import annotations

import pytest

from tracker.core.redact import REDACTED, redact_inline, redact_intake, redact_object

SHAPES = [
    ("https://a.blob.core.windows.net/c/o?sv=2022-11-02&sp=r&sig=AbC%2Bsecret1",
     "https://a.blob.core.windows.net/c/o?sv=2022-11-02&sp=r&sig=[redacted]"),
    ("https://user:hunter2@host/x", "https://user:[redacted]@host/x"),
    ("login failed: password=hunter2 retrying", "login failed: password=[redacted] retrying"),
    ("https://hub.example.com/m?token=abc123", "https://hub.example.com/m?token=[redacted]"),
    ("access_token=abc123", "access_token=[redacted]"),
    ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=abc+/def==;EndpointSuffix=core.windows.net",
     "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=[redacted];EndpointSuffix=core.windows.net"),
    ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer [redacted]"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJydW4ifQ.c2lnbmF0dXJl end", "jwt [redacted] end"),
    ("ghp_0123456789abcdefghijABCDEFGHIJ0123", REDACTED),
    ("xoxb-1234567890-abcdefghij", REDACTED),
]
PLAIN = ["Preempted", "OOMKilled", "Workload was evicted: preempted to accommodate a higher priority workload",
         "registry.example.com/team/img:v1.2", "/mnt/checkpoints/step-100", "qwen-rm-5vt2j",
         "https://storage.example.com/bucket/run/out", "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."]


@pytest.mark.parametrize(("text", "kept"), SHAPES)
def test_each_shape_is_redacted_and_idempotent(text: str, kept: str) -> None:
    assert redact_inline(text) == kept
    assert redact_inline(kept) == kept


@pytest.mark.parametrize("text", PLAIN)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_inline(text) == text


def test_redact_object_redacts_free_text_and_keeps_identities() -> None:
    obj = {"kind": "Pod", "metadata": {"name": "p", "uid": "u", "labels": {"taugrid.io/run-id": "r",
                                                                          "example.com/gh": SHAPES[8][0]},
                                       "annotations": {"taugrid.io/storage-output": SHAPES[0][0],
                                                       "example.com/api-token": "plain"}},
           "status": {"message": SHAPES[2][0],
                      "conditions": [{"type": "Ready", "reason": "x", "message": SHAPES[1][0]}],
                      "containerStatuses": [{"state": {"terminated": {"message": SHAPES[6][0], "exitCode": 1}}}]}}
    out = redact_object(obj)
    assert out["metadata"]["labels"] == {"taugrid.io/run-id": "r", "example.com/gh": REDACTED}
    assert out["metadata"]["annotations"] == {"taugrid.io/storage-output": SHAPES[0][1],
                                              "example.com/api-token": REDACTED}
    assert out["status"]["message"] == SHAPES[2][1]
    assert out["status"]["conditions"][0]["message"] == SHAPES[1][1]
    assert out["status"]["containerStatuses"][0]["state"]["terminated"] == {"message": SHAPES[6][1], "exitCode": 1}
    assert obj["status"]["message"] == SHAPES[2][0]  # the input is not changed
    assert redact_object(out) is out  # idempotent, and nothing is copied when nothing changes


def test_redact_intake_redacts_messages_and_urls_only() -> None:
    ev = {"schema": "taugrid.io/intake/v2", "run_id": "r", "kind": "Rendering", "output_uri": SHAPES[0][0],
          "message": SHAPES[2][0], "input_refs": [SHAPES[1][0]], "name": "job-1"}
    out = redact_intake(ev)
    assert out == {**ev, "output_uri": SHAPES[0][1], "message": SHAPES[2][1], "input_refs": [SHAPES[1][1]]}
    assert redact_intake(out) is out
