"""Renders the adx-mon CRDs that install the schema from schemas/kusto/*.kql (run from the repo root):

    uv run python -m tests.kql.render_adxmon          # rewrite deploy/adx-mon/schema.yaml and functions.yaml
    uv run python -m tests.kql.render_adxmon --check  # exit 1 if they are out of date (also a test)

- schema.yaml: one ManagementCommand whose body is every command of the table, mapping, policy and view scripts,
  in order (adx-mon runs a body as `.execute database script`, so the order holds);
- functions.yaml: one Function per `.create-or-alter function` command (adx-mon's one function per resource).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tracker.shell.kusto_apply import SCHEMA_DIR, schema_commands

DEPLOY_DIR = SCHEMA_DIR.parents[1] / "deploy" / "adx-mon"
NAMESPACE = "adx-mon"
HEADER = ("# Generated from schemas/kusto/*.kql by `uv run python -m tests.kql.render_adxmon`: edit the .kql files\n"
          "# and re-render (tests/deploy/test_kusto.py fails while this file is out of date).\n")
_FUNCTION = re.compile(r"^\.create-or-alter\s+function\s+with\s*\((?:[^()\"]|\"[^\"]*\")*\)\s*(\w+)\s*\(")


def _doc(kind: str, name: str, database: str, body: str, comment: str) -> str:
    indented = "\n".join(f"    {line}" if line else "" for line in body.split("\n"))
    return (f"# {comment}\napiVersion: adx-mon.azure.com/v1\nkind: {kind}\nmetadata:\n  name: {name}\n"
            f"  namespace: {NAMESPACE}\nspec:\n  database: {database}\n  body: |\n{indented}\n")


def _kebab(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def render() -> dict[Path, str]:
    database = json.loads((SCHEMA_DIR / "schema.json").read_text())["database"]
    commands = schema_commands(SCHEMA_DIR)
    schema = [c for c in commands if not _FUNCTION.match(c.text)]
    functions = [c for c in commands if _FUNCTION.match(c.text)]
    files = sorted({c.file for c in schema})
    schema_doc = _doc("ManagementCommand", "taugrid-schema", database, "\n\n".join(c.text for c in schema),
                      f"Tables, ingestion mappings, policies and materialized views ({', '.join(files)}).")
    function_docs = []
    for c in functions:
        m = _FUNCTION.match(c.text)
        assert m is not None
        function_docs.append(_doc("Function", _kebab(m.group(1)), database, c.text,
                                  f"{m.group(1)} ({c.file} #{c.index})."))
    return {DEPLOY_DIR / "schema.yaml": HEADER + schema_doc,
            DEPLOY_DIR / "functions.yaml": HEADER + "---\n".join(function_docs)}


def main(argv: list[str]) -> int:
    stale = [path for path, text in render().items() if not path.exists() or path.read_text() != text]
    if "--check" in argv:
        for path in stale:
            print(f"out of date: {path} (run: uv run python -m tests.kql.render_adxmon)")
        return 1 if stale else 0
    for path, text in render().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
