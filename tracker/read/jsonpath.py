"""``-o jsonpath=TEMPLATE`` and ``-o custom-columns=SPEC`` as kubectl does them, over the readers' JSON documents.

The template language is kubectl's (https://kubernetes.io/docs/reference/kubectl/jsonpath/), the part of it a
reader of run histories needs:

- text outside braces is printed as it is; ``{"\\n"}`` and ``{"\\t"}`` print a newline and a tab (JSON escapes);
- ``{.a.b}``, ``{.a['b-c']}``, ``{.items[0]}``, ``{.items[-1]}``, ``{.items[1:3]}``, ``{.items[*].run_id}``,
  ``{.*}``, ``{..reason}`` (every ``reason`` at any depth), ``{$.items[0]}`` (from the document's top, also inside
  a range), ``{@}`` (the current value);
- filters ``[?(@.status=="failed")]``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` against a string or number, and
  ``[?(@.reason)]`` (present and not empty);
- ``{range .items[*]}...{end}``, nested.

Like kubectl (``--allow-missing-template-keys``, on by default), a key that is missing prints nothing; several
values of one expression are printed separated by spaces; a mapping or a list is printed as compact JSON, ``true``
and ``false`` as such, null as nothing. ``tracker runs`` applies a template to ``{"kind": "List", "items": [runs]}``,
as kubectl applies one to a list, so ``{.items[*].run_id}`` and ``{range .items[*]}...{end}`` read as they do there;
``tracker show`` applies it to the run's document.

A template or a column spec that does not parse is a ``JsonPathError`` (the command line: one line, exit 2), raised
before the index is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tracker import errors

MAX_TEMPLATE_CHARS = 4_096  # a longer template or column spec is refused


class JsonPathError(errors.InvalidInput):
    """A ``jsonpath=`` template or ``custom-columns=`` spec that does not parse."""


# ------------------------------------------------------------------------------------------ paths

@dataclass(frozen=True, slots=True)
class _Key:
    name: str


@dataclass(frozen=True, slots=True)
class _Index:
    at: int


@dataclass(frozen=True, slots=True)
class _Slice:
    start: int | None
    stop: int | None


@dataclass(frozen=True, slots=True)
class _All:
    pass


@dataclass(frozen=True, slots=True)
class _Descend:
    name: str | None  # None: every value at any depth


@dataclass(frozen=True, slots=True)
class _Filter:
    path: tuple[_Step, ...]
    op: str | None  # None: the value is present and not empty
    value: object


_Step = _Key | _Index | _Slice | _All | _Descend | _Filter


@dataclass(frozen=True, slots=True)
class Path:
    """A parsed path: from the document's top (``$``) or the current value, and its steps."""

    from_root: bool
    steps: tuple[_Step, ...]

    def values(self, root: Any, current: Any) -> list[Any]:
        found = [root if self.from_root else current]
        for step in self.steps:
            found = [v for node in found for v in _apply(step, node, root)]
        return found


_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_FILTER = re.compile(r"\?\(\s*@((?:\.[A-Za-z0-9_\-]+|\['[^']*'\])*)\s*(?:(==|!=|<=|>=|<|>)\s*(.+?))?\s*\)")


def parse_path(text: str) -> Path:
    """``.a.b[0]``, ``$.items[*].name``, ``@`` and the like (the inside of a template's braces)."""
    s = text.strip()
    from_root = s.startswith("$")
    if s.startswith(("$", "@")):
        s = s[1:]
    steps: list[_Step] = []
    i = 0
    while i < len(s):
        if s.startswith("..", i):
            i += 2
            m = _NAME.match(s, i)
            if m is None and s.startswith("*", i):
                steps.append(_Descend(None))
                i += 1
            elif m is None:
                raise JsonPathError(f"a name is needed after '..' at {i} in {text!r}")
            else:
                steps.append(_Descend(m.group()))
                i = m.end()
        elif s[i] == ".":
            i += 1
            if i == len(s):
                break  # "." alone: the current value
            if s[i] == "*":
                steps.append(_All())
                i += 1
                continue
            m = _NAME.match(s, i)
            if m is None:
                raise JsonPathError(f"a name is needed after '.' at {i} in {text!r}")
            steps.append(_Key(m.group()))
            i = m.end()
        elif s[i] == "[":
            end = _bracket_end(s, i, text)
            steps.append(_bracket(s[i + 1:end], text))
            i = end + 1
        else:
            raise JsonPathError(f"unexpected {s[i]!r} at {i} in {text!r} (a path starts with '.', '$' or '@')")
    return Path(from_root, tuple(steps))


def _bracket_end(s: str, start: int, text: str) -> int:
    quote, depth = "", 0
    for j in range(start, len(s)):
        c = s[j]
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
            if depth == 0:
                return j
    raise JsonPathError(f"unclosed '[' in {text!r}")


def _bracket(inner: str, text: str) -> _Step:
    inner = inner.strip()
    if inner == "*":
        return _All()
    if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "'\"":
        return _Key(inner[1:-1])
    if re.fullmatch(r"-?\d+", inner):
        return _Index(int(inner))
    if m := re.fullmatch(r"(-?\d*):(-?\d*)", inner):
        return _Slice(int(m.group(1)) if m.group(1) else None, int(m.group(2)) if m.group(2) else None)
    if m := _FILTER.fullmatch(inner):
        path = parse_path("@" + m.group(1)).steps
        op, raw = m.group(2), m.group(3)
        return _Filter(path, op, _literal(raw, text) if op else None)
    raise JsonPathError(f"cannot read [{inner}] in {text!r} (an index, a slice, *, 'name' or ?(@.x==value))")


def _literal(raw: str, text: str) -> object:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    try:
        return json.loads(raw)
    except ValueError:
        raise JsonPathError(f"cannot read the value {raw!r} in {text!r} (a quoted string or a number)") from None


def _children(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return list(node.values())
    if isinstance(node, list):
        return list(node)
    return []


def _descend(node: Any, name: str | None) -> Iterator[Any]:
    if isinstance(node, dict):
        if name is None:
            yield from node.values()
        elif name in node:
            yield node[name]
    for child in _children(node):
        yield from _descend(child, name)


def _compare(left: Any, op: str, right: object) -> bool:
    if op == "==":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    if isinstance(left, bool) or isinstance(right, bool):
        return False
    if (isinstance(left, int | float) and isinstance(right, int | float)) or \
            (isinstance(left, str) and isinstance(right, str)):
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]  # type: ignore[operator]
    return False


def _apply(step: _Step, node: Any, root: Any) -> list[Any]:
    if isinstance(step, _Key):
        return [node[step.name]] if isinstance(node, dict) and step.name in node else []
    if isinstance(step, _Index):
        if isinstance(node, list) and -len(node) <= step.at < len(node):
            return [node[step.at]]
        return []
    if isinstance(step, _Slice):
        return list(node[step.start:step.stop]) if isinstance(node, list) else []
    if isinstance(step, _All):
        return _children(node)
    if isinstance(step, _Descend):
        return list(_descend(node, step.name))
    kept = []
    for item in _children(node):
        found = Path(False, step.path).values(root, item)
        if step.op is None:
            if any(v not in (None, "", [], {}) for v in found):
                kept.append(item)
        elif any(_compare(v, step.op, step.value) for v in found):
            kept.append(item)
    return kept


def text_of(value: Any) -> str:
    """A value as kubectl prints it in a template."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


# ------------------------------------------------------------------------------------------ templates

@dataclass(frozen=True, slots=True)
class _Text:
    text: str


@dataclass(frozen=True, slots=True)
class _Expr:
    path: Path


@dataclass(frozen=True, slots=True)
class _Range:
    path: Path
    body: tuple[_Node, ...]


_Node = _Text | _Expr | _Range


@dataclass(frozen=True, slots=True)
class Template:
    nodes: tuple[_Node, ...]

    def render(self, document: Any) -> str:
        out: list[str] = []
        _render(self.nodes, document, document, out)
        return "".join(out)


def _render(nodes: Sequence[_Node], root: Any, current: Any, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, _Text):
            out.append(node.text)
        elif isinstance(node, _Expr):
            out.append(" ".join(text_of(v) for v in node.path.values(root, current)))
        else:
            for item in node.path.values(root, current):
                _render(node.body, root, item, out)


def _pieces(template: str) -> Iterator[tuple[bool, str]]:
    """(inside braces, text) in order; a brace inside a quoted string does not end an expression."""
    i = 0
    while i < len(template):
        start = template.find("{", i)
        if start < 0:
            yield False, template[i:]
            return
        if start > i:
            yield False, template[i:start]
        quote, j = "", start + 1
        while j < len(template):
            c = template[j]
            if quote:
                if c == "\\":
                    j += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c == "}":
                break
            j += 1
        else:
            raise JsonPathError(f"unclosed '{{' at {start} in the template {template!r}")
        yield True, template[start + 1:j]
        i = j + 1


def parse_template(template: str) -> Template:
    """A kubectl JSONPath template (``{.items[*].run_id}``, ``{range .items[*]}{.run_id}{"\\n"}{end}``)."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise JsonPathError(f"the template is {len(template):,} characters long (at most {MAX_TEMPLATE_CHARS:,})")
    if not template.strip():
        raise JsonPathError("the template is empty (e.g. jsonpath='{.items[*].run_id}')")
    stack: list[tuple[Path | None, list[_Node]]] = [(None, [])]
    for inside, text in _pieces(template):
        body = stack[-1][1]
        if not inside:
            body.append(_Text(text))
            continue
        expr = text.strip()
        if expr.startswith("range ") or expr == "range":
            stack.append((parse_path(expr[5:] or "@"), []))
        elif expr == "end":
            if len(stack) == 1:
                raise JsonPathError(f"{{end}} without {{range}} in the template {template!r}")
            path, inner = stack.pop()
            assert path is not None
            stack[-1][1].append(_Range(path, tuple(inner)))
        elif len(expr) >= 2 and expr[0] == expr[-1] == '"':
            try:
                body.append(_Text(json.loads(expr)))
            except ValueError:
                raise JsonPathError(f"cannot read the string {expr} in the template {template!r}") from None
        elif expr.startswith(("$", "@", ".", "[")) and expr:
            body.append(_Expr(parse_path(expr)))
        else:
            raise JsonPathError(f"cannot read {{{expr}}} in the template {template!r} (a path such as "
                                ".items[*].run_id, range, end, or a quoted string)")
    if len(stack) > 1:
        raise JsonPathError(f"{{range}} without {{end}} in the template {template!r}")
    return Template(tuple(stack[0][1]))


# ------------------------------------------------------------------------------------------ custom columns

@dataclass(frozen=True, slots=True)
class Columns:
    """``NAME:.run_id,STATUS:.status``: a header and a path per column, as kubectl's ``custom-columns``."""

    names: tuple[str, ...]
    paths: tuple[Path, ...]

    def render(self, items: Sequence[Any], *, headers: bool = True) -> str:
        rows = [[", ".join(text_of(v) for v in p.values(item, item)) or "<none>" for p in self.paths]
                for item in items]
        if headers:
            rows.insert(0, list(self.names))
        widths = [max((len(r[i]) for r in rows), default=0) for i in range(len(self.names))]
        return "".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n"
                       for r in rows)


def parse_columns(spec: str) -> Columns:
    if len(spec) > MAX_TEMPLATE_CHARS:
        raise JsonPathError(f"the column spec is {len(spec):,} characters long (at most {MAX_TEMPLATE_CHARS:,})")
    names, paths = [], []
    for part in spec.split(","):
        name, sep, path = part.partition(":")
        if not sep or not name.strip() or not path.strip():
            raise JsonPathError(f"cannot read the column {part!r}: custom-columns=NAME:.path[,NAME:.path...] "
                                "(e.g. custom-columns=RUN:.run_id,STATUS:.status)")
        expr = path.strip()
        if expr.startswith("{") and expr.endswith("}"):
            expr = expr[1:-1]
        names.append(name.strip())
        paths.append(parse_path(expr))
    return Columns(tuple(names), tuple(paths))


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """An ``-o`` value: a named format, or a parsed template or column spec."""

    name: str  # "jsonpath", "custom-columns" or a format's own name
    template: Template | None = None
    columns: Columns | None = None


def output_format(value: str, named: Sequence[str]) -> OutputFormat:
    """Reads ``-o``: one of ``named``, ``jsonpath=TEMPLATE`` or ``custom-columns=SPEC``."""
    if value in named:
        return OutputFormat(value)
    kind, sep, rest = value.partition("=")
    if sep and kind == "jsonpath":
        return OutputFormat("jsonpath", template=parse_template(rest))
    if sep and kind == "custom-columns":
        return OutputFormat("custom-columns", columns=parse_columns(rest))
    every = ", ".join(repr(n) for n in (*named, "jsonpath=TEMPLATE", "custom-columns=SPEC"))
    raise JsonPathError(f"invalid choice: {value!r} (choose from {every})")
