"""Typed decoding of a watch event (and of a LIST response's page): the fields the reducer reads, decoded straight
from the JSON text.

``slim_event(jsonio.loads(text))`` decodes the whole object (a Pod as the API returns it is 5-20 KB: managedFields,
the pod spec, volumes, environment) and then projects it onto its kind's shape (``tracker.shell.slim``). Here the
projection is done by the decoder: msgspec decodes the text into Structs built from the same ``slim.SHAPES``, so
it skips what no shape names without building it (about 7 us instead of orjson's 20 and the projection's 20 for a
5 KB object; bench/README.md). The Structs are turned back into plain dicts and lists at once
(``msgspec.to_builtins``): everything after decoding (metadata's labels and annotations, a Node's resources,
redaction: ``slim.finish``; the reducer) is the code ``slim_event`` runs, on the same values.

``slim_line(text) == slim_event(jsonio.loads(text))`` for every text (``tests/watch/test_typed.py`` proves it with
hypothesis on well-formed and malformed events): whatever the typed decoder does not take exactly as ``slim``
would (a value of an unexpected type, a kind without a shape, an intake event, a key beside ``type`` and
``object``, text that is not JSON, or JSON that msgspec refuses and the standard library takes: ``1e400``, a lone
surrogate) is decoded the general way, by ``jsonio.loads`` and ``slim_event``: a malformed object stays
malformed, and the reducer dead-letters it with the same reason. Only the order of keys may differ (a dict
compares equal whatever its order). Integers of any size are decoded as the standard library decodes them
(``jsonio`` turns to it for those orjson would turn into floats).

``slim_list`` does the same for a page of a LIST, whose items carry no kind: each kind has a Struct of its items.
Besides the decoding, it spares the garbage collector: msgspec builds the slimmed fields only, into Structs the
collector does not track, where a whole page decoded by orjson is thousands of new dicts (bench/README.md).

No I/O: pure functions of their input, as ``slim``'s are.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from tracker.shell import jsonio
from tracker.shell.capture import Decoding
from tracker.shell.slim import META_SHAPE, SHAPES, Shape, finish, slim_event

__all__ = ["SLIMMED", "slim_line", "slim_list"]


def _struct(name: str, shape: Shape, typed: tuple[tuple[str, Any], ...] = (), **options: Any) -> Any:
    """A Struct type with one optional field per key of ``shape`` (and of ``typed``, given its type): ``True`` any
    value, a dict a Struct of its own (or null), a one-element list a list of such Structs (each or null). A field
    absent from the text is UNSET, so ``to_builtins`` leaves it out, as ``slim.project`` does."""
    fields: list[tuple[str, Any, Any]] = []
    for key, sub in shape.items():
        kind: Any = Any
        if isinstance(sub, list):
            item: Any = _struct(f"{name}_{key}", sub[0])
            kind = list[item | None] | None
        elif sub is not True:
            kind = _struct(f"{name}_{key}", sub) | None
        fields.append((key, kind | UnsetType, UNSET))
    fields.extend((key, kind | UnsetType, UNSET) for key, kind in typed)
    return msgspec.defstruct(name, fields, module=__name__, gc=False, **options)


# metadata: META_SHAPE's keys, and the labels and annotations ``slim.finish`` cuts (any value)
_META: Any = _struct("Metadata", META_SHAPE, (("labels", Any), ("annotations", Any)))
_OBJECTS = tuple(_struct(kind, shape, (("apiVersion", Any), ("metadata", _META | None)), tag_field="kind", tag=kind)
                 for kind, shape in SHAPES.items())
_ANY_OBJECT: Any = functools.reduce(operator.or_, _OBJECTS)  # a union tagged by ``kind``
_EVENT = msgspec.defstruct("WatchEvent", [("type", Any | UnsetType, UNSET), ("object", _ANY_OBJECT, UNSET)],
                           module=__name__, gc=False, forbid_unknown_fields=True)
_DECODER = msgspec.json.Decoder(_EVENT)


def _page(kind: str, shape: Shape) -> msgspec.json.Decoder[Any]:
    """The decoder of a LIST response's page of ``kind``: its items carry no kind (the lister gives them theirs), so
    each kind has a Struct of its items, without a tag, and without the apiVersion the lister sets too."""
    item: Any = _struct(f"{kind}Item", shape, (("metadata", _META | None),))
    return msgspec.json.Decoder(msgspec.defstruct(
        f"{kind}List", [("metadata", Any | UnsetType, UNSET), ("items", list[item] | None | UnsetType, UNSET)],
        module=__name__, gc=False))


_PAGES = {kind: _page(kind, shape) for kind, shape in SHAPES.items()}


def slim_line(text: str | bytes) -> Any:
    """``slim_event(jsonio.loads(text))``: a watch event's object slimmed and redacted as the watcher slims it, any
    other value as it is; ValueError (json.JSONDecodeError) if ``text`` is not JSON."""
    try:
        event: Any = _DECODER.decode(text)
    except (msgspec.MsgspecError, RecursionError):
        pass
    else:
        if event.object is not UNSET:
            return _slimmed(msgspec.to_builtins(event))
    return slim_event(jsonio.loads(text))


def slim_list(text: bytes, kind: str, api_version: str) -> dict[str, Any] | None:
    """A LIST response's page of ``kind`` (a JSON object: its ``metadata``, its ``items``) with every item slimmed as
    ``slim.slim`` slims it once its ``kind`` and ``apiVersion`` are set to those given (a LIST's items carry
    none): ``{"metadata": ..., "items": [slim(item), ...]}``; None when the page is not one the typed decoder takes
    exactly (not JSON, a value of an unexpected type, an item that is not an object), for the caller to decode it
    whole (``KubeApi.decoded``) and slim each item as it handles it."""
    decoder = _PAGES.get(kind)
    if decoder is None:
        return None
    try:
        page: dict[str, Any] = msgspec.to_builtins(decoder.decode(text))
    except (msgspec.MsgspecError, RecursionError):
        return None
    items = page.get("items")
    if items:
        page["items"] = [finish(item, kind, api_version, item.pop("metadata", None)) for item in items]
    return page


def _slimmed(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` (its object projected by the decoder) as ``slim_event`` returns it: the object finished as
    ``slim.slim`` finishes it (``slim.finish``)."""
    obj: dict[str, Any] = event["object"]
    kind = obj.pop("kind")
    event["object"] = finish(obj, kind, obj.pop("apiVersion", None), obj.pop("metadata", None))
    return event


#: A capture's values slimmed as the watcher slims them: a JSON line by ``slim_line``, any other value (a
#: pretty-printed one, as ``kubectl -w -o json`` prints them) by ``slim_event``.
SLIMMED = Decoding(slim_line, slim_event)
