"""Redaction: the one policy for every text the tracker shows, and what it keeps of an input it could not use.

Pure functions (no I/O, no clock), deterministic and idempotent (``redact_inline(redact_inline(t)) ==
redact_inline(t)``). README "What is redacted" is the policy in short; this is where it is applied:

- where an object's text enters the tracker's facts (``tracker.core.extract``: ``text_at``, ``cut_text``,
  ``annotation``, ``label``; ``tracker.core.queues``; the reducer's intake events, ``redact_value``), so that
  histories, run-state, the index, ADX rows, the Kafka records and the pages only ever see redacted text;
- where an object is slimmed (``tracker.shell.slim``: ``redact_object``, ``redact_intake``), so that the objects
  the watcher publishes and checkpoints, and the records a replay folds and the reducer holds, carry none either;
- in every log line (``tracker.runtime.ops.redact_log``) and every dead letter (``DeadLetter``, ``redact_text``).

Inside any text (``redact_inline``) the secret is replaced by ``[redacted]``, what names it is kept:

- ``name=value`` / ``name: value`` / ``--name value`` where the name looks secret (``password``, ``passwd``,
  ``pwd``, ``secret``, ``token``, ``access_token``, ``credential``, ``auth``, ``api_key``, ``access_key``,
  ``AccountKey`` (a storage connection string), ``private_key``, ``cookie``, ``session``, ``signature``, ...);
- signed-URL signatures: ``?sig=`` / ``&sig=`` (an Azure SAS), ``signature=``, ``X-Amz-Signature=``,
  ``X-Goog-Signature=``, ``code=``;
- the password of a URL (``scheme://user:password@host``);
- ``Bearer``/``Basic`` credentials (``Authorization: Bearer ...``);
- JWTs (``eyJ...`` dot-separated) and well-known token shapes: AWS access key ids (``AKIA``/``ASIA``), GitHub
  (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``), Slack (``xoxb-`` ...), ``sk-`` and GitLab (``glpat-``) tokens.

Ordinary text is left alone: reasons (``Preempted``, ``OOMKilled``), names, image tags, paths, URLs without
credentials. Which fields are free text: messages, reasons, an Event's note, eviction causes (``TEXT_KEYS``), the
values of annotations (whole ``[redacted]`` under a secret-looking key or when token-like, but TauGrid's digest
and reference annotations), of labels (but the ones that identify objects, ``IDENTITY_LABELS``), an intake event's
messages, reasons and URLs (``INTAKE_TEXT_KEYS``), a root's images and command lines (``COMMAND_KEYS``: the argument
after a secret-looking flag too, ``redact_argv``) and an intake event's image, entrypoint and hyperparameters (a value
under a secret-looking key whole, ``redact_hyperparameter``). Names, uids, times, counts are identities and kept.

A dead letter keeps what identifies its record (kind, namespace, name, uid, resourceVersion; an intake event's
kind, run_id and event_id) and the reason; besides the above, every value that may be a secret is replaced by
``[redacted]``:

- the value of any key that looks secret (``password``, ``token``, ``secret``, ``key``, ``credential``, ``auth``,
  ``cookie``, ``signature``, ... in its name), whole, including what is nested in it;
- environment variable values (``env[].value`` of every container), a top-level object's ``data``,
  ``stringData`` and ``binaryData`` (a Secret's or ConfigMap's contents);
- annotation values that look like tokens (long, no spaces, letters and digits); an annotation holding JSON (such
  as ``kubectl.kubernetes.io/last-applied-configuration``, which repeats the whole object) is redacted inside.

``redact_text`` works on JSON text that may be cut short or not be JSON at all (a line that did not parse): it reads
it as a stream of tokens with the keys that lead to each value, so the same rules apply to a record's JSON and to
the first bytes of a broken one.

Cost: a text without any trigger word is returned after one scan; texts of at most 96 characters (reasons, names)
are remembered (8,192 of them); ``redact_object`` copies an object only on the way to a change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from sys import intern
from typing import Any, get_args

from pydantic import BaseModel, SecretStr

from tracker.core.vocab import (
    LABEL_CONTROLLER_UID,
    LABEL_JOB_UID,
    LABEL_QUEUE,
    LABEL_RAY_CLUSTER,
    LABEL_RAY_NODE_TYPE,
    LABEL_RUN_ID,
)

REDACTED = "[redacted]"
_REDACTED_JSON = json.dumps(REDACTED)

_SECRET_WORDS = (r"passw(?:or)?d|passphrase|pwd|secret|token(?!s)|credential|auth|api[-_]?key|private[-_]?key"
                 r"|access[-_]?key|account[-_]?key|cookie|session|signature|connection[-_]?string|sas[-_]?url|bearer")
_TRIGGER_WORDS = (r"pass|pwd|secret|token|credential|auth|key|cookie|session|signature|connection|sas|bearer")
_SECRET_KEY = re.compile(rf"(?i)(?:{_SECRET_WORDS})|(?:^|[-_.\s/])keys?$|[a-z]Keys?$|^keys?$|^sig$|^sas$")
_CONTENT_KEYS = frozenset({"data", "stringData", "binaryData"})
_IDENTITY_KEYS = {("kind",): "kind", ("apiVersion",): "apiVersion", ("metadata", "namespace"): "namespace",
                  ("metadata", "name"): "name", ("metadata", "uid"): "uid",
                  ("metadata", "resourceVersion"): "resourceVersion", ("run_id",): "run_id",
                  ("event_id",): "event_id"}
IDENTITY_FIELDS = ("kind", "apiVersion", "namespace", "name", "uid", "resourceVersion", "run_id", "event_id")
_IDENTITY_MAX = 253
# Annotations of TauGrid runs whose values are digests or references, not credentials.
_PLAIN_ANNOTATIONS = frozenset({"taugrid.io/git-commit", "taugrid.io/config-digest", "taugrid.io/config-ref",
                                "taugrid.io/input-refs", "taugrid.io/storage-output", "taugrid.io/resume-of"})

# (what the lower-cased text must contain for the pattern to match, the pattern, its replacement)
_INLINE: tuple[tuple[re.Pattern[str], re.Pattern[str], str], ...] = (
    # scheme://user:password@host
    (re.compile("://"), re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@\"']+:)(?!\[redacted\])[^/\s@\"']+@"),
     rf"\g<1>{REDACTED}@"),
    # Authorization: Bearer xxx / Basic xxx
    (re.compile("bearer|basic"), re.compile(r"(?i)\b(bearer|basic)(\s+)(?!\[redacted\])[A-Za-z0-9._~+/=-]{6,}"),
     rf"\g<1>\g<2>{REDACTED}"),
    # name=value, name: value, "name": "value", --name value (a secret-looking name)
    (re.compile(_TRIGGER_WORDS),
     re.compile(rf"(?i)((?<![\w.-])(?:[\w.-]*?(?:{_SECRET_WORDS})[\w.-]*|[\w.-]*?[-_.]keys?|keys?)"
                r"[\"']?\s*[:=]\s*[\"']?)(?!\[redacted\]|(?:bearer|basic)\s)[^\s\"',;&{}\[\]()]+"),
     rf"\g<1>{REDACTED}"),
    (re.compile(_TRIGGER_WORDS),
     re.compile(rf"(?i)((?<![\w-])--?[\w-]*?(?:{_SECRET_WORDS})[\w-]*\s+)(?!\[redacted\])(?!-)[^\s\"',;&{{}}\[\]()]+"),
     rf"\g<1>{REDACTED}"),
    # signed URLs: ?sig=..., &signature=..., &X-Amz-Signature=..., &code=...
    (re.compile("sig|code="),
     re.compile(r"(?i)([?&](?:sig|signature|x-amz-signature|x-goog-signature|code)=)(?!\[redacted\])[^&\s\"']+"),
     rf"\g<1>{REDACTED}"),
    # JWTs and well-known token shapes
    (re.compile("eyj"), re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}(?:\.[A-Za-z0-9_-]*)?"), REDACTED),
    (re.compile("akia|asia|gh[pousr]_|xox|sk-|glpat-"),
     re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{20,}|\bxox[abposr]-[A-Za-z0-9-]{10,}"
                r"|\bsk-[A-Za-z0-9_-]{20,}|\bglpat-[A-Za-z0-9_-]{20,}"), REDACTED),
)
_ANY_TRIGGER = re.compile("|".join(trigger.pattern for trigger, _, _ in _INLINE))
_FLAG = re.compile(rf"(?i)--?[\w-]*(?:{_SECRET_WORDS})[\w-]*")
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9+/=_.~-]{16,}")

_TOKENS = re.compile(r'("(?:[^"\\]++|\\.)*+"?|[{}\[\]:,])', re.S)


@lru_cache(maxsize=4096)
def secret_key(name: str) -> bool:
    """Whether a key or setting name looks like it holds a secret."""
    return bool(_SECRET_KEY.search(name))


def redact_inline(text: str) -> str:
    """``text`` with the secrets that can be recognised inside free text replaced (see the module docstring)."""
    out = _redact_short(text) if len(text) <= _SHORT else _redact_inline(text)
    return text if out == text else out  # the same object when nothing changed: callers copy only on a change


_SHORT = 96  # texts this short (reasons, names) repeat: their redaction is remembered


@lru_cache(maxsize=8192)
def _redact_short(text: str) -> str:
    return _redact_inline(text)


def _redact_inline(text: str) -> str:
    low = text.lower()
    if _ANY_TRIGGER.search(low) is None:
        return text
    for trigger, pattern, repl in _INLINE:
        if trigger.search(low) is not None:
            text = pattern.sub(repl, text)
    return text


# ------------------------------------------------------------------------------------------ what the tracker reads

#: The keys whose values are free text wherever they occur in an object the tracker reads: conditions', a
#: container's termination, a pod's, an Event's (``note`` in events.k8s.io/v1), a RayJob status's, a Workload's
#: admission checks' and evictions'.
TEXT_KEYS = frozenset({"message", "reason", "note", "underlyingCause"})
#: Labels whose values identify objects and bind them to their run: kept as they are (a label value is at most 63
#: letters, digits, ``-``, ``_`` and ``.``: no URL, no ``name=value``, no Bearer credential fits in one).
IDENTITY_LABELS = frozenset({LABEL_RUN_ID, LABEL_JOB_UID, LABEL_CONTROLLER_UID, LABEL_RAY_CLUSTER,
                             LABEL_RAY_NODE_TYPE, LABEL_QUEUE})
REDACT_DEPTH = 100  # levels of a value ``redact_value`` looks into; what is deeper is replaced whole (as validate's)


def redact_value(value: Any, depth: int = REDACT_DEPTH) -> Any:
    """A JSON value with every string inside it redacted by ``redact_inline`` (keys are kept); what nests deeper
    than ``depth`` levels is replaced by ``[redacted]`` whole. Returns ``value`` itself when nothing changed."""
    if value.__class__ is str:
        return redact_inline(value)
    if value.__class__ is dict:
        if depth <= 0:
            return REDACTED
        out = {k: redact_value(v, depth - 1) for k, v in value.items()}
        return value if all(out[k] is v for k, v in value.items()) else out
    if value.__class__ is list:
        if depth <= 0:
            return REDACTED
        items = [redact_value(v, depth - 1) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def redact_object(obj: dict[str, Any]) -> dict[str, Any]:
    """A Kubernetes object (whole or slimmed) with its free text redacted: the values of ``TEXT_KEYS`` and
    ``COMMAND_KEYS`` at any depth, and of its annotations and labels (but ``IDENTITY_LABELS``).
    Names, uids, times and counts are kept.
    Returns ``obj`` itself when nothing changed (the usual case: a copy is made only on the way to a change)."""
    return _object(obj, REDACT_DEPTH)


def annotation(key: str, value: Any, depth: int = REDACT_DEPTH) -> Any:
    """An annotation's (or a label's) value as the tracker keeps it: whole ``[redacted]`` under a secret-looking key
    or when it looks like a token (but TauGrid's digest and reference annotations), else with the secrets inside
    redacted (``redact_value``: an annotation holding JSON is redacted inside)."""
    if value.__class__ is str and (secret_key(key) or (key not in _PLAIN_ANNOTATIONS and looks_like_token(value))):
        return REDACTED
    return redact_value(value, depth)


#: The free-text and URL fields of an intake event (``tracker.core.intake``).
INTAKE_TEXT_KEYS = frozenset({"message", "reason", "input_refs", "config_ref", "output_uri", "uri", "checkpoint_uri"})


def redact_intake(record: dict[str, Any]) -> dict[str, Any]:
    """An intake event with its free text and URLs redacted (``INTAKE_TEXT_KEYS``), the rest as it is (a record
    that does not validate still does not). Returns ``record`` itself when nothing changed."""
    out: dict[str, Any] | None = None
    for k in record.keys() & (INTAKE_TEXT_KEYS | INTAKE_COMMAND_KEYS | {"hyperparameters"}):
        v = record[k]
        new = redact_hyperparameters(v) if k == "hyperparameters" else redact_value(v)
        if new is not v:
            if out is None:
                out = dict(record)
            out[k] = new
    return record if out is None else out


#: The keys of a root object's workload whose values are command lines or image references (``tracker.core.provenance``
#: reads them): a string with ``redact_inline``, a list (``command``, ``args``) with ``redact_argv``.
COMMAND_KEYS = frozenset({"image", "entrypoint", "command", "args"})
#: Of an intake event, the image and command line (``redact_inline``); its hyperparameters: ``redact_hyperparameters``.
INTAKE_COMMAND_KEYS = frozenset({"image", "entrypoint"})


def redact_argv(argv: list[Any]) -> list[Any]:
    """A container's ``command``/``args`` with each string redacted by ``redact_inline``, and the argument after a
    secret-looking flag (``["--token", "xyz"]``) replaced whole. Returns ``argv`` itself when nothing changed."""
    out: list[Any] = []
    after_flag = False
    for a in argv:
        if a.__class__ is not str:
            out.append(a)
            after_flag = False
            continue
        out.append(REDACTED if after_flag and not a.startswith("-") else redact_inline(a))
        after_flag = _FLAG.fullmatch(a) is not None
    return argv if all(x is y for x, y in zip(out, argv, strict=True)) else out


def redact_hyperparameter(key: str, value: Any) -> Any:
    """A hyperparameter's value as the tracker keeps it: whole ``[redacted]`` under a secret-looking key
    (``hf_token``, ``wandb_api_key``), a string with ``redact_inline``, any other scalar as it is."""
    if value is not None and secret_key(key):
        return REDACTED
    return redact_inline(value) if value.__class__ is str else redact_value(value)


def redact_hyperparameters(value: Any) -> Any:
    """An intake event's ``hyperparameters`` (any value: the event is not validated yet) with ``redact_hyperparameter``
    applied to each entry of an object, anything else by ``redact_value``."""
    if value.__class__ is not dict:
        return redact_value(value)
    out = {redact_inline(k) if k.__class__ is str else k: redact_hyperparameter(str(k), v) for k, v in value.items()}
    return value if list(out.items()) == list(value.items()) else out


def label(key: str, value: Any) -> Any:
    """A label's value as the tracker keeps it: ``IDENTITY_LABELS`` as they are, others with the secret shapes inside
    redacted (a label value is short and plain: token-likeness is not a sign, project names look like that); interned,
    as ``extract.str_at``'s strings are."""
    if value.__class__ is not str:
        return value
    return intern(value if key in IDENTITY_LABELS else redact_inline(value))


def _object(obj: dict[str, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] | None = None
    for k, v in obj.items():
        if v.__class__ is str:
            new: Any = redact_inline(v) if k in TEXT_KEYS or k in COMMAND_KEYS else v
        elif depth <= 0:  # deeper than the extractor reads (and than a held record is kept: validate.pruned)
            new = v
        elif v.__class__ is dict:
            if k in TEXT_KEYS:
                new = redact_value(v, depth - 1)
            elif k == "annotations":
                new = {ak: annotation(ak, av, depth - 2) for ak, av in v.items()}
                new = v if all(new[ak] is av for ak, av in v.items()) else new
            elif k == "labels":
                new = {lk: label(lk, lv) for lk, lv in v.items()}
                new = v if all(new[lk] is lv for lk, lv in v.items()) else new
            else:
                new = _object(v, depth - 1)
        elif v.__class__ is list:
            if k in TEXT_KEYS:
                new = redact_value(v, depth - 1)
            elif k in COMMAND_KEYS:
                new = redact_argv(v)
            else:
                items = [_object(i, depth - 2) if i.__class__ is dict else i for i in v]
                new = v if all(a is b for a, b in zip(items, v, strict=True)) else items
        else:
            new = v
        if new is not v:
            if out is None:
                out = dict(obj)
            out[k] = new
    return obj if out is None else out


def looks_like_token(value: str) -> bool:
    """A long string without spaces made of letters and digits, as API tokens, keys and passwords are."""
    if not _TOKEN_LIKE.fullmatch(value):
        return False
    kinds = sum((any(c.islower() for c in value), any(c.isupper() for c in value), any(c.isdigit() for c in value)))
    return kinds >= 2


def identity(record: Any) -> dict[str, str]:
    """What identifies a parsed record: a watch event's object (or a bare object), or an intake event."""
    if not isinstance(record, dict):
        return {}
    obj = record.get("object")
    out: dict[str, str] = {}
    for path, name in _IDENTITY_KEYS.items():
        for root in ((obj, record) if isinstance(obj, dict) else (record,)):
            value: Any = root
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, (str, int)) and not isinstance(value, bool) and name not in out:
                out[name] = _identity_value(str(value))
    return out


def _identity_value(value: str) -> str:
    return redact_inline(value[:_IDENTITY_MAX])


@dataclass(slots=True)
class _Frame:
    array: bool
    key: str | None  # the key this container is the value of (an array's elements inherit the array's)
    secret: bool  # everything inside is redacted
    path: tuple[str, ...] | None  # keys from the root, while short enough to name an identity field
    expect_key: bool = True  # objects: the next string is a key
    current: str | None = None  # objects: the key whose value comes next
    after_flag: bool = False  # arrays: the previous element was a secret-looking flag (--token)


@dataclass(frozen=True, slots=True)
class Redacted:
    text: str
    identity: dict[str, str]


def redact_text(text: str) -> Redacted:
    """``text`` (JSON, possibly cut short, or anything else) with secrets redacted, and the identity found in it."""
    parts = _TOKENS.split(text)  # blanks or bare words, a string or punctuation, blanks or bare words, ...
    found: dict[str, str] = {}
    stack: list[_Frame] = []
    top: _Frame | None = None
    for i in range(1, len(parts), 2):
        gap = parts[i - 1]
        if gap and not gap.isspace():  # a bare word: a number, a literal, anything that is not JSON
            parts[i - 1] = _gap(gap, top, found)
        tok = parts[i]
        c = tok[0]
        if c == '"':
            closed = (len(tok) > 1 and tok[-1] == '"' and tok[-2] != "\\") or _closed(tok)
            if top is not None and top.expect_key and not top.array:
                top.current = tok[1:-1] if closed and "\\" not in tok else _decode(tok, closed)
            else:
                parts[i] = _string(tok, closed, top, found)
        elif c == "{" or c == "[":
            key, secret, path = _context(top)
            top = _Frame(c == "[", key, secret, path)
            stack.append(top)
        elif c == "}" or c == "]":
            if stack:
                stack.pop()
            top = stack[-1] if stack else None
        elif top is not None and not top.array:
            top.expect_key = c == ","
            if top.expect_key:
                top.current = None
    if parts[-1] and not parts[-1].isspace():
        parts[-1] = _gap(parts[-1], top, found)
    return Redacted(redact_inline("".join(parts)), found)


def _closed(tok: str) -> bool:
    """Whether a string token has its closing quote (the text may be cut inside it, or after a backslash)."""
    if len(tok) < 2 or tok[-1] != '"':
        return False
    escapes, i = 0, len(tok) - 2
    while i > 0 and tok[i] == "\\":
        escapes, i = escapes + 1, i - 1
    return escapes % 2 == 0


def _gap(gap: str, top: _Frame | None, found: dict[str, str]) -> str:
    """What lies between two tokens: blanks around a bare word."""
    word = gap.strip()
    lead = gap[:len(gap) - len(gap.lstrip())]
    return lead + _word(word, top, found) + gap[len(lead) + len(word):]


def _word(word: str, top: _Frame | None, found: dict[str, str]) -> str:
    """A bare word: a key of text that is not JSON, or a value (number, literal, or anything else)."""
    if top is not None and not top.array and top.expect_key:
        top.current = word.strip("'")
        return word
    _key, secret, path = _context(top)
    if secret:
        return _REDACTED_JSON
    if path is not None:
        field = _identity_field(path)
        if field is not None and field not in found:
            found[field] = _identity_value(word)
    return word


def _context(top: _Frame | None) -> tuple[str | None, bool, tuple[str, ...] | None]:
    """The key, secrecy and path of the value that comes next inside ``top``."""
    if top is None:
        return None, False, ()
    if top.array:
        return top.key, top.secret, None
    key = top.current
    if key is None:
        return None, top.secret, None
    path = top.path
    if path is not None:
        path = (*path, key) if len(path) < 3 else None
    return key, top.secret or _secret_in(key, top), path


def _secret_in(key: str, top: _Frame) -> bool:
    """Whether the value of ``key`` inside the object ``top`` is redacted whole."""
    return secret_key(key) or (key == "value" and top.key == "env") or (
        key in _CONTENT_KEYS and top.path is not None and (not top.path or top.path == ("object",)))


def _identity_field(path: tuple[str, ...]) -> str | None:
    return _IDENTITY_KEYS.get(path[1:] if path[:1] == ("object",) else path)


def _string(tok: str, closed: bool, top: _Frame | None, found: dict[str, str]) -> str:
    """A string value."""
    if not closed:  # the text was cut inside it: what is left could be the start of a secret, and is no identity
        return _REDACTED_JSON
    if top is None:
        return tok
    if top.array:  # ["--token", "xyz"]: the argument after a secret-looking flag is redacted too
        after_flag = top.after_flag
        top.after_flag = tok.startswith('"-') and _FLAG.fullmatch(_decode(tok, closed)) is not None
        return _REDACTED_JSON if top.secret or after_flag else tok
    key = top.current
    if top.secret or (key is not None and _secret_in(key, top)):
        return _REDACTED_JSON
    if top.path is not None and key is not None and len(top.path) < 3:
        field = _identity_field((*top.path, key))
        if field is not None:
            if field not in found:
                found[field] = _identity_value(_decode(tok, closed))
            return tok
    if top.key == "annotations" and key not in _PLAIN_ANNOTATIONS:
        value = _decode(tok, closed)
        if value.lstrip()[:1] in ("{", "["):
            return json.dumps(redact_text(value).text, ensure_ascii=False)
        if looks_like_token(value):
            return _REDACTED_JSON
    return tok


def _decode(tok: str, closed: bool) -> str:
    """The value of a JSON string token, which may be cut short (no closing quote) or hold bad escapes."""
    if closed and "\\" not in tok:
        return tok[1:-1]
    body = tok if closed else re.sub(r"\\(?:u[0-9a-fA-F]{0,3})?$", "", tok) + '"'
    try:
        value = json.loads(body)
    except ValueError:
        return body[1:-1]
    return value if isinstance(value, str) else body[1:-1]


# ------------------------------------------------------------------------------------------ settings errors


def validation_problems(errors: Iterable[Mapping[str, Any]], secret_fields: Collection[str] = (),
                        secret_values: Iterable[str] = ()) -> list[str]:
    """``dotted.field: message`` for each error of a pydantic ``ValidationError.errors()``, never with a value.

    Pydantic's messages do not quote the input, but an error of a secret field (one named in ``secret_fields``)
    says only what kind of error it is, and any secret value given in ``secret_values``
    that still occurs in a message is replaced, whatever the parser said."""
    values = sorted({v for v in secret_values if len(v) >= 4}, key=len, reverse=True)
    lines = []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ())]
        name = ".".join(loc) or "(root)"
        if any(p in secret_fields for p in loc):
            msg = f"invalid ({e.get('type', 'error')}); the value is a secret and not shown"
        else:
            msg = str(e.get("msg", "invalid"))
        for v in values:
            msg = msg.replace(v, "**********")
        lines.append(f"{name}: {msg}")
    return lines


def secret_fields(model: type[BaseModel]) -> frozenset[str]:
    """The names of the ``SecretStr`` fields of a settings model and of the models it nests."""
    names: set[str] = set()
    for name, info in model.model_fields.items():
        types = (info.annotation, *get_args(info.annotation))
        if SecretStr in types:
            names.add(name)
        for t in types:
            if isinstance(t, type) and issubclass(t, BaseModel):
                names |= secret_fields(t)
    return frozenset(names)


def secret_values(data: Any, fields: Collection[str]) -> list[str]:
    """Every value under a key named in ``fields`` in nested settings data (to keep them out of messages)."""
    out: list[str] = []

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, secret or str(k).lower() in fields)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v, secret)
        elif secret and value is not None:
            out.append(str(value))

    walk(data, False)
    return out


def secret_env(environ: Mapping[str, str], prefix: str, fields: Collection[str]) -> list[str]:
    """The values of the environment variables ``<prefix>...<FIELD>`` of secret ``fields``."""
    upper = tuple(f.upper() for f in fields)
    return [v for k, v in environ.items() if k.upper().startswith(prefix) and k.upper().endswith(upper)]
