"""``-o jsonpath=`` and ``-o custom-columns=`` read as kubectl's do (issue 28, point 3): the template language's
paths, filters, ranges and literals over plain JSON, the printing rules (missing keys print nothing, several values
are space-separated, mappings as compact JSON), and the command line's use of them on the demo's index."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracker.cli import main
from tracker.read.jsonpath import JsonPathError, parse_columns, parse_template

DOC = {"kind": "List", "items": [
    {"run_id": "a", "status": "failed", "attempts": 2, "ok": False, "labels": {"team": "x", "k-8": "v"},
     "ends": [{"reason": "Evicted"}, {"reason": "Failed"}]},
    {"run_id": "b", "status": "succeeded", "attempts": 1, "ok": True, "labels": {}, "ends": [{"reason": "Done"}],
     "gone": None},
]}


@pytest.mark.parametrize("template, printed", [
    ("{.items[*].run_id}", "a b"),
    ("{.items[0].run_id}", "a"),
    ("{.items[-1].run_id}", "b"),
    ("{.items[0:1].run_id}", "a"),
    ("{.items[5].run_id}", ""),  # missing: nothing, as kubectl with --allow-missing-template-keys
    ("{.items[0].nope}", ""),
    ("{.items[1].gone}", ""),
    ("{.items[0].ok} {.items[1].ok}", "false true"),
    ("{.items[0].labels}", '{"team":"x","k-8":"v"}'),
    ("{.items[0].labels.k-8}", "v"),
    ("{.items[0].labels['team']}", "x"),
    ("{.items[0].labels.*}", "x v"),
    ("{..reason}", "Evicted Failed Done"),
    ('{.items[?(@.status=="failed")].run_id}', "a"),
    ("{.items[?(@.status!='failed')].run_id}", "b"),
    ("{.items[?(@.attempts>1)].run_id}", "a"),
    ("{.items[?(@.gone)].run_id}", ""),
    ("{.items[?(@.labels.team)].run_id}", "a"),
    ('{range .items[*]}{.run_id}{"\\t"}{.status}{"\\n"}{end}', "a\tfailed\nb\tsucceeded\n"),
    ('{range .items[*]}{.run_id}:{range .ends[*]}{.reason},{end};{end}', "a:Evicted,Failed,;b:Done,;"),
    ("{range .items[*]}{$.kind}/{@.run_id} {end}", "List/a List/b "),
    ("runs: {.items[*].run_id}!", "runs: a b!"),
    ('{"{braces}"}', "{braces}"),
])
def test_templates_print_as_kubectl_does(template: str, printed: str) -> None:
    assert parse_template(template).render(DOC) == printed


@pytest.mark.parametrize("template, says", [
    ("{range .items[*]}{.run_id}", "{range} without {end}"),
    ("{.run_id}{end}", "{end} without {range}"),
    ("{.items[*]", "unclosed '{'"),
    ("{.items[?(@.a=~x)]}", "cannot read [?(@.a=~x)]"),
    ("{items}", "cannot read {items}"),
    ("{.items[x]}", "cannot read [x]"),
    ("", "the template is empty"),
    ("{.a}" * 2000, "characters long"),
])
def test_a_template_that_does_not_parse_is_one_clear_error(template: str, says: str) -> None:
    with pytest.raises(JsonPathError, match=None) as exc:
        parse_template(template)
    assert says in str(exc.value)


def test_custom_columns_align_and_say_none_for_missing() -> None:
    cols = parse_columns("RUN:.run_id,TEAM:.labels.team,ENDS:.ends[*].reason")
    assert cols.render(DOC["items"]) == ("RUN   TEAM     ENDS\n"
                                         "a     x        Evicted, Failed\n"
                                         "b     <none>   Done\n")
    with pytest.raises(JsonPathError, match="cannot read the column 'RUN'"):
        parse_columns("RUN")


def test_runs_and_show_take_jsonpath_and_custom_columns(index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--index", str(index), "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    failed = sorted(r["run_id"] for r in every if r["status"] == "failed")
    assert main(["runs", "--index", str(index), "-o", 'jsonpath={.items[?(@.status=="failed")].run_id}']) == 0
    assert sorted(capsys.readouterr().out.split()) == failed
    assert main(["runs", "--index", str(index), "--no-headers", "-o", "custom-columns=RUN:.run_id,S:.status"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows == [[r["run_id"], r["status"]] for r in every]
    assert main(["show", "vit-l-9hx4d", "--index", str(index), "-o", "jsonpath={.attempts[*].end_reason}"]) == 0
    assert capsys.readouterr().out == "PodsReadyTimeout CompletionsReached"


def test_a_bad_template_is_a_usage_error_before_the_index_is_read(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tracker.cli", "runs", "--index", str(tmp_path / "none.sqlite"),
                           "-o", "jsonpath={range .items[*]}"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "tracker runs: error: argument -o/--output: {range} without {end} in the template '{range .items[*]}' "
        "(see `tracker runs --help`)"]
