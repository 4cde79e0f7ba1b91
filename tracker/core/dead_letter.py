"""``DeadLetter``: an input the tracker could not use, with the reason (a pydantic model: its JSON Schema is
published, schemas/dead-letter/v1.schema.json). Re-exported by ``tracker.core.model``, which imports it on first use
so that the readers that never make one start without pydantic."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracker.core.redact import redact_inline, redact_text

EXCERPT_MAX = 2048  # characters of a dead letter's excerpt


class DeadLetter(BaseModel):
    """An input the tracker could not use, with the reason. Nothing else is affected.

    It keeps what identifies the record and never a secret: whoever makes one, the excerpt and the detail are
    redacted when it is made (``tracker.core.redact``: values of secret-looking keys, environment variable values,
    token-like annotation values, credentials inside text), and the identity is read from the excerpt when it is
    not given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="Where the record was: path:line of a capture, topic/partition@offset, a watch.")
    reason: str
    detail: str = ""
    identity: dict[str, str] = Field(
        default_factory=dict,
        description="What identifies the record, as far as it could be read: kind, apiVersion, namespace, name, uid, "
                    "resourceVersion of an object; kind, run_id, event_id of an intake event.")
    excerpt: str = Field(default="", max_length=EXCERPT_MAX,
                         description="The record's JSON (or the text that did not parse), redacted, cut at 2048 "
                                     "characters.")

    @model_validator(mode="before")
    @classmethod
    def _redact(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        given = data.get("identity")
        if isinstance(given, dict) and given:
            data["identity"] = {str(k): redact_inline(str(v)) for k, v in given.items()}
        excerpt = data.get("excerpt")
        if isinstance(excerpt, str):
            red = redact_text(excerpt)
            data["excerpt"] = red.text[:EXCERPT_MAX]
            if not given:
                data["identity"] = red.identity  # redacted already
        for name in ("detail", "reason"):
            if isinstance(data.get(name), str):
                data[name] = redact_inline(data[name])
        return data
