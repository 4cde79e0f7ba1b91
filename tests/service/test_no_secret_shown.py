"""No credential shown (issue 27): fake credentials in every free-text and URL field of every record kind the tracker
reads (Jobs, Pods with their termination messages, Events, Workloads, RayJobs, RayClusters, intake events), each of
the shapes README "What is redacted" lists, each with a unique marker; the bundled captures carrying them are
replayed and every output is searched for the markers: the index (and its -wal), the dead-letter file, stdout and
stderr of `replay`, `runs` (json, yaml, wide), `show` (text and json) of every run, `compare`, `audit` (table, json,
csv), the web view's pages, the ADX sink's requests, the JSON logs of `serve`, and (a Kafka test) every topic a
served capture fills: the objects as published (changes), transitions, run-state, dead letters and alerts.

What ran is seeded too: a Job's container images, commands and args, a RayJob's entrypoint and group images, a
Rendering event's image, entrypoint and hyperparameters (a value under a secret-looking key, and text values).

The markers are letters and digits only: a marker found anywhere means the credential around it was shown."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.adx_standin import KustoStandIn
from tests.support.histories import stored
from tracker.cli import main
from tracker.cli.args import DEMO_CAPTURES
from tracker.core.model import HistoryUpdate
from tracker.settings import AdxSettings
from tracker.shell.adx import AdxSink
from tracker.shell.capture import Record, capture_files, read_capture
from tracker.shell.index import ExperimentIndex
from tracker.ui.server import App, allowed_hosts

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 8, 20, 13, 0, tzinfo=UTC)
KINDS = ("Job", "RayJob", "Workload", "Pod", "RayCluster", "Event")
TEXT_KEYS = ("message", "reason", "note", "underlyingCause")

# Each shape of credential, ``{}`` where the secret goes (README "What is redacted").
SHAPES = {
    "SAS": "https://acct.blob.core.windows.net/out/run?sv=2022-11-02&ss=b&sp=rwl&se=2030-01-01T00:00:00Z&sig={}",
    "password=": "password={}",
    "userinfo": "https://trainer:{}@storage.example.com/bucket",
    "Bearer": "Authorization: Bearer {}",
    "JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJydW4ifQ.{}",
    "token=": "https://hub.example.com/model?token={}",
    "access_token=": "access_token={}",
    "AccountKey=": "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={}==;EndpointSuffix=core.windows.net",
    "ghp_": "ghp_{}",
    "xoxb-": "xoxb-{}",
}


class Seeds:
    """Unique markers (letters and digits), one per place and shape, so that a leak names where it came from."""

    def __init__(self) -> None:
        self.made: dict[str, str] = {}

    def marker(self, where: str) -> str:
        value = self.made.get(where)
        if value is None:
            value = self.made[where] = f"SECRET{len(self.made):04d}x{uuid.uuid4().hex[:12]}"
        return value

    def text(self, where: str) -> str:
        """A text holding every shape of credential, each with its own marker."""
        return " ".join(shape.format(self.marker(f"{where} [{name}]")) for name, shape in SHAPES.items())

    def one(self, where: str, shape: str) -> str:
        return SHAPES[shape].format(self.marker(f"{where} [{shape}]"))


def _seed_texts(value: Any, seeds: Seeds, where: str) -> None:
    """Every free-text field inside ``value`` gets every shape appended (messages, reasons, notes, causes)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k in TEXT_KEYS and isinstance(v, str):
                value[k] = f"{v} {seeds.text(f'{where}.{k}')}"
            elif k not in ("metadata", "involvedObject", "regarding"):
                _seed_texts(v, seeds, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _seed_texts(v, seeds, f"{where}[{i}]")


def seeded_object(record: dict[str, Any], seeds: Seeds, n: int) -> dict[str, Any]:
    """A watch event whose object carries credentials in every free-text and URL field the tracker reads, and in
    the ones it does not read (a RayJob's entrypoint, a container's image)."""
    rec = copy.deepcopy(record)
    obj = rec["object"]
    kind = obj["kind"]
    where = f"{kind}#{n}"
    meta = obj.setdefault("metadata", {})
    meta.setdefault("annotations", {}).update({
        "taugrid.io/storage-output": seeds.one(f"{where} annotation storage-output", "SAS"),
        "taugrid.io/config-ref": seeds.one(f"{where} annotation config-ref", "userinfo"),
        "taugrid.io/input-refs": ",".join([seeds.one(f"{where} annotation input-refs", "SAS"),
                                           seeds.one(f"{where} annotation input-refs", "token=")]),
        "taugrid.io/notes": seeds.text(f"{where} annotation notes"),
    })
    meta.setdefault("labels", {})["example.com/gh"] = seeds.one(f"{where} label", "ghp_")
    status = obj.setdefault("status", {})
    if kind == "Event":
        obj["message"] = f"{obj.get('message') or ''} {seeds.text(f'{where}.message')}"
        obj["note"] = seeds.text(f"{where}.note")
        obj["reason"] = f"{obj.get('reason') or ''} {seeds.text(f'{where}.reason')}"
    else:
        for c in status.get("conditions") or []:
            c.setdefault("message", "")
            c.setdefault("reason", "")
    if kind == "Pod":
        status.setdefault("message", "")
        status.setdefault("reason", "")
        for c in (obj.get("spec") or {}).get("containers") or []:
            c["image"] = f"https://puller:{seeds.marker(f'{where} image userinfo')}@registry.example.com/img:v1"
        for cs in status.get("containerStatuses") or []:
            for state in (cs.get("state") or {}).values():
                if isinstance(state, dict):
                    state.setdefault("message", "")
                    state.setdefault("reason", "")
    if kind == "Job":  # what ran (README "What ran"): the image, the command and args of every container
        for c in ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            c["image"] = seeds.one(f"{where} image", "userinfo")
            c["command"] = ["torchrun", "--hf-token", seeds.marker(f"{where} command --hf-token"),
                            f"--password={seeds.marker(f'{where} command --password=')}"]
            c["args"] = [seeds.one(f"{where} args", "SAS"), seeds.one(f"{where} args", "Bearer"),
                         "--api-key", seeds.marker(f"{where} args --api-key")]
    if kind == "RayJob":
        obj.setdefault("spec", {})["entrypoint"] = f"python train.py --hf-token {seeds.marker(f'{where} entrypoint')}"
        rc = obj["spec"].get("rayClusterSpec") or {}
        for g in [rc.get("headGroupSpec") or {}, *(rc.get("workerGroupSpecs") or [])]:
            for c in ((g.get("template") or {}).get("spec") or {}).get("containers") or []:
                c["image"] = seeds.one(f"{where} group image", "SAS")
        status.setdefault("message", "")
        status.setdefault("reason", "")
    if kind == "Workload":
        for check in status.get("admissionChecks") or []:
            check.setdefault("message", "")
        for e in (status.get("schedulingStats") or {}).get("evictions") or []:
            e.setdefault("underlyingCause", "")
    _seed_texts(obj if kind == "Event" else status, seeds, where)
    return rec


def seeded_intake(event: dict[str, Any], seeds: Seeds, n: int) -> dict[str, Any]:
    """An intake event with credentials in its messages, reasons and every URL it carries."""
    ev = dict(event)
    where = f"intake {ev['kind']}#{n}"
    kind = ev["kind"]
    if kind in ("Resolution", "Rendering"):
        ev["message"] = seeds.text(f"{where}.message")
        ev["reason"] = seeds.text(f"{where}.reason")
    if kind == "Resolution":
        ev["input_refs"] = [seeds.one(f"{where}.input_refs", shape) for shape in ("SAS", "userinfo", "token=")]
        ev["config_ref"] = seeds.one(f"{where}.config_ref", "userinfo")
    if kind == "Rendering":
        ev["output_uri"] = seeds.one(f"{where}.output_uri", "SAS")
        ev["image"] = seeds.one(f"{where}.image", "userinfo")
        ev["entrypoint"] = f"python x.py --token {seeds.marker(f'{where}.entrypoint --token')} " + seeds.text(
            f"{where}.entrypoint")
        ev["hyperparameters"] = {"optim.lr": 0.0003, "hf_token": seeds.marker(f"{where}.hyperparameters hf_token"),
                                 "wandb_api_key": seeds.marker(f"{where}.hyperparameters wandb_api_key"),
                                 "data_url": seeds.one(f"{where}.hyperparameters data_url", "SAS"),
                                 "notes": seeds.text(f"{where}.hyperparameters notes")}
    if kind in ("CheckpointSave", "CheckpointRestore"):
        ev["uri"] = seeds.one(f"{where}.uri", "SAS")
    if kind in ("Progress", "Resume"):
        ev["checkpoint_uri"] = seeds.one(f"{where}.checkpoint_uri", "SAS")
    return ev


def write_captures(root: Path, seeds: Seeds) -> Path:
    """The bundled captures, every record seeded (and one malformed Pod: a dead letter whose text is seeded)."""
    captures = root / "captures"
    captures.mkdir()
    kinds: set[str] = set()
    for n_file, path in enumerate(capture_files([DEMO_CAPTURES])):
        lines = []
        for n, rec in enumerate(read_capture(path)):
            assert isinstance(rec, Record)
            if "schema" in rec.value:
                lines.append(json.dumps(seeded_intake(rec.value, seeds, n)))
                kinds.add(f"intake {rec.value['kind']}")
                continue
            seeded = seeded_object(rec.value, seeds, n_file * 100_000 + n)
            kinds.add(seeded["object"]["kind"])
            lines.append(json.dumps(seeded))
            if seeded["object"]["kind"] == "Pod" and "malformed" not in kinds:
                kinds.add("malformed")
                broken = copy.deepcopy(seeded)
                broken["object"]["metadata"]["creationTimestamp"] = "yesterday"
                lines.append(json.dumps(broken))
        (captures / f"{path.stem}.jsonl").write_text("\n".join(lines) + "\n")
    assert kinds >= {*KINDS, "intake Resolution", "intake Rendering", "intake Progress", "intake CheckpointSave",
                     "intake CheckpointRestore", "intake Resume"}, kinds
    return captures


MARKER = re.compile(rb"SECRET\d+x[0-9a-f]{12}")


def leaks(seeds: Seeds, outputs: dict[str, bytes]) -> list[str]:
    """Where each marker was found: ``<where it was seeded> -> <output>``."""
    where = {v.encode(): w for w, v in seeds.made.items()}
    return [f"{where[m]} -> {name}" for name, blob in outputs.items() for m in sorted(set(MARKER.findall(blob)))
            if m in where]


def files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tracker(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "tracker.cli", *args], env=env, cwd=REPO, capture_output=True,
                          timeout=timeout, check=False)


def cli(*args: str) -> tuple[bytes, bytes]:
    """A reader command in this process: (stdout, stderr); it must succeed."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    assert code == 0, (args, err.getvalue()[-2000:])
    return out.getvalue().encode(), err.getvalue().encode()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in list(os.environ):
        if name.startswith(("TRACKER_", "AZURE_")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("COLUMNS", raising=False)
    return dict(os.environ)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Seeds, Path]]:
    seeds = Seeds()
    root = tmp_path_factory.mktemp("seeded")
    yield seeds, write_captures(root, seeds)


def test_no_seeded_credential_reaches_any_output(seeded: tuple[Seeds, Path], tmp_path: Path,
                                                 clean_env: dict[str, str]) -> None:
    seeds, captures = seeded
    out: dict[str, bytes] = {}
    index = tmp_path / "out" / "index.sqlite"
    proc = tracker("replay", str(captures), "--index", str(index), env=clean_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["replay stdout"], out["replay stderr"] = proc.stdout, proc.stderr

    # the JSON logs of a process at DEBUG: `serve` folding the same captures into an index of its own
    served = tmp_path / "served" / "index.sqlite"
    proc = tracker("serve", "--from-capture", str(captures), "--index", str(served), "--exit-when-done",
                   env={**clean_env, "TRACKER_OPS__LOG_LEVEL": "DEBUG", "TRACKER_OPS__LOG_FORMAT": "json"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["serve stdout"], out["serve stderr"] = proc.stdout, proc.stderr
    assert b'"event"' in proc.stderr  # JSON log lines were written

    ix = str(index)
    runs = json.loads(cli("runs", "--index", ix, "-o", "json")[0])
    assert len(runs) >= 10
    ids = [r["run_id"] for r in runs]
    reader_calls: list[tuple[str, ...]] = [
        ("runs", "--index", ix, "-o", "json", "--now", "2026-08-20T13:00:00Z"),
        ("runs", "--index", ix, "-o", "yaml"), ("runs", "--index", ix, "-o", "wide"), ("runs", "--index", ix),
        ("audit", "--index", ix, "--now", "2026-08-20T13:00:00Z"),
        ("audit", "--index", ix, "-o", "json"), ("audit", "--index", ix, "-o", "csv"),
        ("audit", "--index", ix, "--by", "project", "-o", "csv"),
        ("compare", "--index", ix, *ids[:7]), ("compare", "--index", ix, *ids[7:14]),
    ]
    for run_id in ids:
        reader_calls += [("show", run_id, "--index", ix), ("show", run_id, "--index", ix, "-o", "json")]
    for args in reader_calls:
        out[f"{' '.join(args[:1])} {args[1:]} stdout"], out[f"{args} stderr"] = cli(*args)
    shown = b"".join(v for k, v in out.items() if k.startswith("show"))
    assert b"[redacted]" in shown  # the texts were read and shown, redacted

    # the web view's pages: the list, every run's page
    app = App(index=index, hosts=allowed_hosts("127.0.0.1", []), stuck_after="30m", clock=lambda: NOW)
    for target in ["/", "/runs?status=failed", *(f"/runs/{run_id}" for run_id in ids)]:
        page = app.respond("GET", target, "127.0.0.1")
        assert page.status == 200, (target, page.body[:500])
        out[f"web {target}"] = page.body

    # the ADX sink's rows, as the stand-in received them
    standin = KustoStandIn().up()
    try:
        sink = AdxSink(AdxSettings(cluster_uri=standin.url, auth="none", database="db", spool_dir=tmp_path / "spool",
                                   retry_attempts=2, retry_initial_s=0.01, batch_max_delay_s=0.01))
        with ExperimentIndex(index) as idx:
            histories = [h for r in ids if (h := stored(idx).history(r)) is not None]
        assert sink.write([HistoryUpdate.of(h) for h in histories]) > 0 and sink.flush(60)
        sink.close(30)
        requests = list(standin.requests)
    finally:
        standin.down()
    assert sum(len(rows) for rows in standin.tables.values()) > len(ids)
    out |= {f"ADX request {i} {r.path}": r.body for i, r in enumerate(requests)}

    written = files(tmp_path / "out") | files(tmp_path / "served")
    assert any(name.endswith("index.sqlite") for name in written)
    assert any(name.endswith(".dead-letters.jsonl") for name in written)
    out |= written
    found = leaks(seeds, out)
    assert found == [], f"{len(found)} leaks, e.g. " + "\n".join(found[:20])
    # and the credentials were there to find: every marker is in the captures
    inputs = set(MARKER.findall(b"".join(files(captures).values())))
    assert {v.encode() for v in seeds.made.values()} <= inputs
    assert len(seeds.made) > 1000


def test_log_lines_are_redacted(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """A log line of any logger (structlog or the standard library's), its event, fields, nested values and a
    traceback: each credential redacted."""
    seeds = Seeds()
    script = f"""
import logging, structlog
from tracker.runtime.ops import configure_logging
configure_logging("DEBUG", "json")
log = structlog.get_logger("t")
log.info({seeds.text("event")!r}, field={seeds.text("field")!r}, nested={{"a": [{seeds.text("nested")!r}]}},
         pair=({seeds.text("tuple")!r}, 1))
logging.getLogger("aiokafka").warning({seeds.text("stdlib")!r})
try:
    raise ValueError({seeds.text("exception")!r})
except ValueError:
    log.exception("failed")
"""
    proc = subprocess.run([sys.executable, "-c", script], env=clean_env, cwd=REPO, capture_output=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert len(lines) == 3 and "[redacted]" in lines[0]["field"] and "ValueError" in lines[2]["exception"]
    assert leaks(seeds, {"stderr": proc.stderr}) == []


@pytest.mark.kafka
def test_no_seeded_credential_reaches_any_kafka_topic(seeded: tuple[Seeds, Path], kafka_bootstrap: str,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      clean_env: dict[str, str]) -> None:
    """`serve --from-capture` with Kafka: the objects it publishes (the changes topic), and what the reducer
    produces from them (transitions, run-state, dead letters, alerts) and the index sink writes."""
    from tests.kafka.test_kafka_pipeline import configure, create_topics, read_topic

    seeds, captures = seeded
    settings = configure(monkeypatch, kafka_bootstrap)
    asyncio.run(create_topics(settings))
    index = tmp_path / "index.sqlite"
    proc = tracker("serve", "--from-capture", str(captures), "--index", str(index), "--exit-when-done",
                   env={**os.environ, "TRACKER_OPS__LOG_LEVEL": "DEBUG"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    topics = settings.kafka.topics
    outputs: dict[str, bytes] = {"serve stdout": proc.stdout, "serve stderr": proc.stderr}
    counts = {}
    for name, partitions in ((topics.changes, topics.partitions), (topics.transitions, topics.partitions),
                             (topics.run_state, topics.partitions), (topics.dead_letters, topics.side_partitions),
                             (topics.alerts, topics.side_partitions)):
        records = asyncio.run(read_topic(settings, name, partitions))
        counts[name] = len(records)
        outputs |= {f"{name} {r.partition}/{r.offset}": (r.key or b"") + b" " + (r.value or b"") for r in records}
    assert counts[topics.changes] > 1000 and counts[topics.transitions] > 20 and counts[topics.run_state] > 20
    assert counts[topics.dead_letters] >= 1
    outputs |= files(tmp_path)
    found = leaks(seeds, outputs)
    assert found == [], f"{len(found)} leaks, e.g. " + "\n".join(found[:20])
