"""What ran: a run's container image(s), its entrypoint and its hyperparameters, compact, bounded and redacted.

Where each comes from (README "What ran"):

- **images** and **entrypoint**: the root object is the truth (what Kubernetes runs). A Job: the images of
  ``spec.template.spec.containers[]`` in order, and the first container's ``command`` + ``args`` (the main
  container, Kubernetes' default one; sidecars follow it). A RayJob: ``spec.entrypoint`` (what ``ray job submit``
  runs), and the images of the head group's containers, then of each worker group's. The newest version of the root
  gives them (``extract.merge_root``), like its labels and annotations.
- the **Rendering** intake event (``tracker.core.intake.RenderingEvent``) may say ``image``, ``entrypoint`` and
  ``hyperparameters`` (what ``tau`` rendered). Its image is added after the objects' when it is not among them (so a
  run whose object disagrees with what ``tau`` rendered shows both, the objects' first); its entrypoint is used only
  when the root gives none (a run whose rendering failed, or whose root was never seen). The hyperparameters come
  only from the intake event: Kubernetes has no such field.

Bounds, so that a run's summary stays small wherever it is stored (run-state, the index, ADX): at most
``MAX_IMAGES`` images of at most ``IMAGE_MAX`` characters, an entrypoint of at most ``ENTRYPOINT_MAX`` characters
(the readers' tables cut it further, with an ellipsis; JSON has it whole), at most ``MAX_HYPERPARAMETERS``
hyperparameters (the first in key order; ``hyperparameters_omitted`` counts the rest), each string value cut at
``VALUE_MAX`` characters. A cut text is redacted before it is cut (a secret the cut splits is still seen).

Redaction (``tracker.core.redact``): images and the entrypoint with ``redact_inline`` (a ``--token=...`` flag, a
signed URL's ``sig=``, a password in a URL), the argument after a secret-looking flag (``--token xyz``) by
``redact.redact_argv``; a hyperparameter under a secret-looking key (``hf_token``, ``wandb_api_key``) whole, any
other string value with ``redact_inline``. Every function here is idempotent, so reading a slimmed object (already
redacted by ``tracker.shell.slim``) gives what reading the original gives. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from sys import intern
from typing import Any

from tracker.core.redact import REDACTED, redact_argv, redact_hyperparameter, redact_inline

MAX_IMAGES = 8
IMAGE_MAX = 512
ENTRYPOINT_MAX = 2048
MAX_HYPERPARAMETERS = 64
VALUE_MAX = 256
KEY_MAX = 256

Scalar = str | int | float | bool | None
Workload = tuple[tuple[str, ...], str | None]  # (images, entrypoint) of a root object


def _cut(text: str, limit: int) -> str:
    """Redacted, then cut to ``limit`` characters (what lies past ``4 * limit`` is not read: as extract.cut_text)."""
    return redact_inline(text[:4 * limit])[:limit]


def _dict(value: Any, key: str) -> dict[str, Any]:
    v = value.get(key) if isinstance(value, dict) else None
    return v if isinstance(v, dict) else {}


def _list(value: Any, key: str) -> list[Any]:
    v = value.get(key) if isinstance(value, dict) else None
    return v if isinstance(v, list) else []


def _containers(template: Any) -> list[dict[str, Any]]:
    """The containers of a pod template (values of a wrong type are skipped: the API server validates these, and
    provenance is no reason to refuse a root whose lifecycle is fine)."""
    return [c for c in _list(_dict(template, "spec"), "containers") if isinstance(c, dict)]


_UNSAFE = re.compile(r"[^\w@%+=:,./-]", re.ASCII)


def _quote(arg: str) -> str:
    """``shlex.quote``, but ``[redacted]`` counts as plain: quoting must not depend on whether an argument was
    redacted already (a slimmed object's is), so that the joined text is the same either way."""
    if not arg:
        return "''"
    if _UNSAFE.search(arg.replace(REDACTED, "x")) is None:
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def join_argv(argv: list[str]) -> str:
    """``command`` + ``args`` as one shell-style line, redacted (argument by argument, then as a line) and cut."""
    return _cut(" ".join(_quote(a) for a in redact_argv(argv)), ENTRYPOINT_MAX)


def workload(kind: str, spec: dict[str, Any]) -> Workload:
    """The images and the entrypoint a Job's or RayJob's spec runs (see the module docstring)."""
    if kind == "Job":
        containers = _containers(_dict(spec, "template"))
        first = containers[0] if containers else {}
        argv = [a for a in (*_list(first, "command"), *_list(first, "args")) if isinstance(a, str)]
        entrypoint = join_argv(argv) if argv else None
    else:
        rc = _dict(spec, "rayClusterSpec")
        groups = [_dict(rc, "headGroupSpec"), *(g for g in _list(rc, "workerGroupSpecs") if isinstance(g, dict))]
        containers = [c for g in groups for c in _containers(_dict(g, "template"))]
        ep = spec.get("entrypoint")
        entrypoint = _cut(ep, ENTRYPOINT_MAX) if isinstance(ep, str) and ep else None
    return images(c.get("image") for c in containers), entrypoint


def images(values: Any) -> tuple[str, ...]:
    """Distinct non-empty image references, in order of first appearance, redacted and bounded."""
    out: dict[str, None] = {}
    for v in values:
        if isinstance(v, str) and v and len(out) < MAX_IMAGES:
            out.setdefault(_cut(v, IMAGE_MAX))
    return tuple(out)


def hyperparameters(raw: Mapping[str, Any]) -> tuple[dict[str, Scalar], int]:
    """A flat map of scalars as the tracker keeps it: the first ``MAX_HYPERPARAMETERS`` keys in sorted order, each
    value redacted (``redact.redact_hyperparameter``) and a string cut at ``VALUE_MAX``; and how many keys were left
    out."""
    keys = sorted(raw)
    kept: dict[str, Scalar] = {}
    for k in keys[:MAX_HYPERPARAMETERS]:
        v = redact_hyperparameter(k, raw[k])
        kept[_cut(k, KEY_MAX)] = _cut(v, VALUE_MAX) if isinstance(v, str) else v
    return kept, max(0, len(keys) - MAX_HYPERPARAMETERS)


def merged(root: Workload | None, intake_image: Any, intake_entrypoint: Any) -> Workload:
    """The run's images and entrypoint: the root's, then the Rendering event's image when it is not among them;
    the Rendering event's entrypoint only when the root gives none."""
    imgs, entrypoint = root if root is not None else ((), None)
    if isinstance(intake_image, str) and intake_image:
        imgs = images((*imgs, intake_image))
    if entrypoint is None and isinstance(intake_entrypoint, str) and intake_entrypoint:
        entrypoint = _cut(intake_entrypoint, ENTRYPOINT_MAX)
    return imgs, entrypoint


def intake_data(data: dict[str, Any]) -> dict[str, Any]:
    """A Resolution or Rendering event's fields as the run's facts keep them (``RunFacts.intake``): what ran bounded
    (an image, an entrypoint, the hyperparameters and how many of them were left out), and the fields a Rendering
    event leaves null dropped (so that an event without them is kept as before they existed). Its strings are
    interned (every run of a project repeats its workspace, target, image and entrypoint)."""
    out = {k: intern(v) if v.__class__ is str else v for k, v in data.items() if not (k in _WHAT_RAN and v is None)}
    if isinstance(out.get("image"), str):
        out["image"] = intern(_cut(out["image"], IMAGE_MAX))
    if isinstance(out.get("entrypoint"), str):
        out["entrypoint"] = intern(_cut(out["entrypoint"], ENTRYPOINT_MAX))
    hp = out.pop("hyperparameters", None)
    if isinstance(hp, dict) and hp:
        out["hyperparameters"], out["hyperparameters_omitted"] = hyperparameters(hp)
    return out


_WHAT_RAN = frozenset({"image", "entrypoint", "hyperparameters"})
