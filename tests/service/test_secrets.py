"""Secrets never leave the tracker: fake secrets in every input (records of every kind, broken JSON lines, intake
events) and in every secret setting (environment and settings file), then every output is searched for them:
stdout and stderr of each command, JSON logs at DEBUG, dead-letter files, the index, the ADX spool, and the Kafka
dead-letters topic."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.kafka.test_kafka_pipeline import configure, create_topics, read_topic
from tests.support.adx_standin import KustoStandIn
from tests.support.histories import stored
from tracker.cli.args import DEMO_CAPTURES
from tracker.core.model import HistoryUpdate
from tracker.settings import AdxSettings
from tracker.shell.adx import AdxSink
from tracker.shell.capture import Record, capture_files, read_capture
from tracker.shell.index import ExperimentIndex

REPO = Path(__file__).resolve().parents[2]
KINDS = ("Job", "RayJob", "Workload", "Pod", "RayCluster", "Event")
RECORDS_PER_FILE = 150  # of each demo capture: every kind of record, in a few seconds


class Secrets:
    """Fake secrets, each unique and token-shaped (letters and digits), so a leak names its source."""

    def __init__(self) -> None:
        self.made: dict[str, str] = {}

    def __call__(self, where: str, length: int = 25) -> str:
        """The secret of ``where`` (made on first use); ``length`` below 25 makes a shorter one."""
        value = self.made.get(where)
        if value is None:
            value = self.made[where] = f"FAKESECRET{len(self.made):02d}x{uuid.uuid4().hex[:12]}"[:length]
        return value


def _containers(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The container lists of a Pod, a Job's template, a RayJob's and a RayCluster's pod templates."""
    def walk(value: Any) -> Iterator[dict[str, Any]]:
        if isinstance(value, dict):
            for k, v in value.items():
                if k in ("containers", "initContainers") and isinstance(v, list):
                    yield from (c for c in v if isinstance(c, dict))
                else:
                    yield from walk(v)
        elif isinstance(value, list):
            for v in value:
                yield from walk(v)
    yield from walk(obj.get("spec"))


def with_secrets(record: dict[str, Any], secret: Secrets) -> dict[str, Any]:
    """A watch event with secrets where clusters keep them: annotations (a token, a token-shaped value, the
    last-applied configuration), container environment values and arguments, a RayJob's runtime environment."""
    rec = copy.deepcopy(record)
    obj = rec["object"]
    kind = obj["kind"]
    meta = obj.setdefault("metadata", {})
    meta.setdefault("annotations", {}).update({
        "example.com/api-token": secret(f"{kind} annotation api-token"),
        "example.com/opaque": secret(f"{kind} annotation token-shaped"),
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
            {"spec": {"containers": [{"name": "c", "env": [{"name": "X", "value": secret(f"{kind} last-applied")}]}]}}),
    })
    for c in _containers(obj):
        c.setdefault("env", []).extend([{"name": "DB_PASSWORD", "value": secret(f"{kind} env DB_PASSWORD")},
                                        {"name": "PLAIN_SETTING", "value": secret(f"{kind} env value")}])
        c.setdefault("args", []).extend([f"--password={secret(f'{kind} arg --password=')}",
                                         "--hf-token", secret(f"{kind} arg --hf-token")])
    if kind == "RayJob":
        obj.setdefault("spec", {})["runtimeEnvYAML"] = f"env_vars:\n  HF_TOKEN: {secret('RayJob runtimeEnvYAML')}\n"
    return rec


def malformed(record: dict[str, Any]) -> dict[str, Any]:
    """The same record broken so that the reducer cannot use it (a dead letter carrying all its secrets)."""
    rec = copy.deepcopy(record)
    if rec["object"]["kind"] == "Event":  # an Event's uid and time are not needed: not a watch event instead
        rec["type"] = "UPSERTED"
    rec["object"]["metadata"]["creationTimestamp"] = "yesterday"
    rec["object"]["metadata"]["uid"] = ""
    rec["object"]["metadata"]["name"] = rec["object"]["metadata"].get("name", "x") + "-broken"
    return rec


def write_captures(root: Path, secret: Secrets) -> Path:
    captures = root / "captures"
    captures.mkdir()
    seen: set[str] = set()
    for path in capture_files([DEMO_CAPTURES]):
        lines = []
        for rec in itertools.islice(read_capture(path), RECORDS_PER_FILE):
            assert isinstance(rec, Record)
            value = rec.value
            if "schema" in value:  # intake events stay valid; broken copies carry secrets
                lines.append(json.dumps(value))
                ikind = value["kind"]
                if ikind not in seen:
                    seen.add(ikind)
                    lines.append(json.dumps({**value, "event_id": value["event_id"] + "-x",
                                             "api_key": secret(f"intake {ikind} extra api_key")}))
                    password = secret(f"intake {ikind} message")
                    lines.append(json.dumps({**value, "event_id": value["event_id"] + "-y", "status": "exploded",
                                             "step": -1, "message": f"login with password={password}"}))
                continue
            good = with_secrets(value, secret)
            lines.append(json.dumps(good))
            kind = value["object"]["kind"]
            if kind not in seen:
                seen.add(kind)
                lines.append(json.dumps(malformed(good)))
        (captures / f"{path.stem}.jsonl").write_text("\n".join(lines) + "\n")
    assert seen >= set(KINDS)
    other = [
        json.dumps({"schema": "taugrid.io/intake/v9", "event_id": "e9", "run_id": "r9", "kind": "Progress",
                    "password": secret("intake v9 password")}),
        json.dumps({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Secret",
                                                 "metadata": {"name": "db", "namespace": "team-a", "uid": "s-1",
                                                              "resourceVersion": "7"},
                                                 "data": {"db.conf": secret("Secret data")},
                                                 "stringData": {"url": secret("Secret stringData")}}}),
        # lines that are not JSON: cut short, broken, or not JSON at all
        '{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"cut-1","namespace":"team-a",'
        f'"uid":"cut-uid-1","annotations":{{"example.com/token":"{secret("bad JSON annotation token")}"',
        '{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"cut-2"},"spec":{"containers":[{"env":[{"name":'
        f'"PW","value":"{secret("bad JSON env value")}"}}]}}]}}}} trailing garbage}}',
        f'password={secret("bad line password=")} token: {secret("bad line token:")} not json at all',
        '{"type":"ADDED","object":{"kind":"Job","metadata":{"name":"cut-3","annotations":{"example.com/session":"'
        + secret("bad JSON cut inside a token", length=18),
    ]
    (captures / "other.jsonl").write_text("\n".join(other) + "\n")
    return captures


def tracker(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "tracker.cli", *args], env=env, cwd=REPO, capture_output=True,
                          timeout=timeout, check=False)


def leaks(secret: Secrets, outputs: dict[str, bytes]) -> list[str]:
    return [f"{where} leaked into {name}" for name, blob in outputs.items()
            for where, value in secret.made.items() if value.encode() in blob]


def files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in list(os.environ):
        if name.startswith(("TRACKER_", "AZURE_")):
            monkeypatch.delenv(name)
    return dict(os.environ)


def test_no_secret_of_any_input_or_setting_reaches_any_output(tmp_path: Path, clean_env: dict[str, str]) -> None:
    secret = Secrets()
    captures = write_captures(tmp_path, secret)
    config = tmp_path / "tracker.yaml"
    config.write_text(f"""
kafka:
  security_protocol: SASL_SSL
  sasl_mechanism: PLAIN
  sasl_username: $ConnectionString
  sasl_password: {secret("settings file kafka.sasl_password")}
  ssl_key_password: {secret("settings file kafka.ssl_key_password")}
ops:
  log_level: DEBUG
  log_format: json
""")
    env = {**clean_env, "TRACKER_KAFKA__SASL_PASSWORD": secret("env TRACKER_KAFKA__SASL_PASSWORD"),
           "TRACKER_ADX__CLIENT_SECRET": secret("env TRACKER_ADX__CLIENT_SECRET"), "TRACKER_ADX__AUTH": "app-secret",
           "TRACKER_ADX__CLIENT_ID": "app", "TRACKER_ADX__TENANT_ID": "tenant",
           "TRACKER_ADX__CLUSTER_URI": "http://127.0.0.1:9"}
    bad_adx = {"TRACKER_ADX__TENANT_ID": ""}  # app-secret without a tenant: every process refuses the settings
    out: dict[str, bytes] = {}

    def run(name: str, *args: str, expect: int = 0, extra: dict[str, str] | None = None) -> None:
        proc = tracker(*args, env={**env, **(extra or {})})
        out[f"{name} stdout"], out[f"{name} stderr"] = proc.stdout, proc.stderr
        assert proc.returncode == expect, (name, proc.stdout[-2000:], proc.stderr[-2000:])

    index = tmp_path / "out" / "index.sqlite"
    served = tmp_path / "served" / "index.sqlite"
    bad_yaml = tmp_path / "bad.yaml"  # a YAML error on the secret's line
    bad_yaml.write_text(f'kafka:\n  sasl_password: "{secret("settings file, YAML error line")}\n  x: [\n')
    wrong_type = tmp_path / "wrong.yaml"  # a secret of the wrong type
    wrong_type.write_text(f"kafka:\n  sasl_password: [{secret('settings file, wrong type')}]\n")
    calls: list[tuple[str, tuple[str, ...], int, dict[str, str]]] = [
        ("replay", ("replay", str(captures), "--index", str(index)), 0, {}),
        ("serve (embedded, DEBUG)", ("serve", "--config", str(config), "--from-capture", str(captures),
                                     "--index", str(served), "--exit-when-done"), 0, {}),
        ("serve with a YAML error", ("serve", "--config", str(bad_yaml)), 2, {}),
        ("serve with a wrong type", ("serve", "--config", str(wrong_type)), 2, {}),
        ("serve with a bad environment", ("serve", "--config", str(config)), 2,
         {"TRACKER_KAFKA__SECURITY_PROTOCOL": "BOGUS", "TRACKER_KAFKA__SASL_MECHANISM": "PLAIN"}),
        # ADX settings errors (app-secret without a tenant): kusto apply, sink adx, any process, doctor
        ("kusto apply with bad ADX settings", ("kusto", "apply"), 2, bad_adx),
        ("sink adx with bad ADX settings", ("sink", "adx", "--config", str(config)), 2,
         {"TRACKER_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9", **bad_adx}),
        ("serve with bad ADX settings", ("serve", "--config", str(config)), 2, bad_adx),
        ("doctor", ("doctor", "--config", str(config), "--skip", "kube", "--skip", "kafka", "--json"), 1, bad_adx),
    ]
    with ThreadPoolExecutor(4) as pool:  # each command is a process of its own: run them side by side
        for future in [pool.submit(run, name, *args, expect=expect, extra=extra)
                       for name, args, expect, extra in calls]:
            future.result()
        runs = json.loads(tracker("runs", "--index", str(index), "--json", env=env).stdout)
        assert len(runs) >= 10
        for future in [pool.submit(run, "runs", "runs", "--index", str(index), "--json"),
                       pool.submit(run, "show", "show", runs[0]["run_id"], "--index", str(index))]:
            future.result()
    assert "invalid settings: adx: " in out["kusto apply with bad ADX settings stderr"].decode()

    # dead letters: every kind, every broken line; what identifies each record is kept; owner-only
    for name in ("out", "served"):
        dead = tmp_path / name / "index.dead-letters.jsonl"
        assert stat.S_IMODE(dead.stat().st_mode) == 0o600, f"{dead} is readable by others"
        letters = [json.loads(line) for line in dead.read_text().splitlines()]
        kinds = {d["identity"].get("kind") for d in letters}
        assert kinds >= {*KINDS, "Secret"}, kinds
        broken = [d for d in letters if d["reason"].startswith("invalid JSON")]
        assert len(broken) >= 3 and all(d["source"].startswith(str(captures)) for d in broken)
        assert {"kind": "Pod", "apiVersion": "v1", "name": "cut-1", "namespace": "team-a", "uid": "cut-uid-1"} in [
            d["identity"] for d in letters]
        for d in letters:
            if d["identity"].get("kind") in KINDS and "other.jsonl" not in d["source"]:
                assert d["identity"].get("name") and d["identity"].get("namespace"), d

    # the ADX sink's spool, filled from the replayed histories during an outage
    standin = KustoStandIn().up()
    try:
        standin.outage = 503
        sink = AdxSink(AdxSettings(cluster_uri=standin.url, auth="none", database="db", spool_dir=tmp_path / "spool",
                                   retry_attempts=1, retry_initial_s=0.01, batch_max_delay_s=0.01))
        with ExperimentIndex(index) as ix:
            histories = [h for r in runs if (h := stored(ix).history(r["run_id"])) is not None]
        assert sink.write([HistoryUpdate.of(h) for h in histories]) > 0 and sink.flush(60)
        sink.close(30)
    finally:
        standin.down()
    assert list((tmp_path / "spool").glob("*.jsonl"))

    outputs = {**out, **files(tmp_path / "out"), **files(tmp_path / "served"), **files(tmp_path / "spool")}
    assert leaks(secret, outputs) == []
    # and the secrets were really there to find: in the inputs
    inputs = files(captures) | files(tmp_path) | {"env": json.dumps(env).encode()}
    assert all(any(v.encode() in blob for blob in inputs.values()) for v in secret.made.values())


@pytest.mark.kafka
def test_the_kafka_dead_letters_topic_carries_redacted_letters(kafka_bootstrap: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               clean_env: dict[str, str]) -> None:
    secret = Secrets()
    captures = write_captures(tmp_path, secret)
    settings = configure(monkeypatch, kafka_bootstrap)
    asyncio.run(create_topics(settings))
    env = {**dict(os.environ), "TRACKER_OPS__LOG_LEVEL": "DEBUG"}
    proc = tracker("serve", "--from-capture", str(captures), "--exit-when-done", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    letters = asyncio.run(read_topic(settings, settings.kafka.topics.dead_letters, 1))
    values = [json.loads(r.value) for r in letters]
    assert {d["identity"].get("kind") for d in values} >= {*KINDS, "Secret"}
    assert sum(d["reason"].startswith("invalid JSON") for d in values) >= 3
    outputs = {f"dead letter {i}": r.value for i, r in enumerate(letters)}
    outputs |= {"serve stdout": proc.stdout, "serve stderr": proc.stderr}
    assert leaks(secret, outputs) == []


# ------------------------------------------------------------------------------------------ settings errors


@pytest.mark.parametrize(("name", "text", "says"), [
    ("quoted.yaml", 'kafka:\n  sasl_password: "{s}\n  x: [\n', "found unexpected end of stream at line 4"),
    ("alias.yaml", "kafka:\n  sasl_password: *{s}\n", "uses YAML anchors or aliases (line 2, column 18)"),
    ("tab.yaml", "kafka:\n  sasl_password: {s}\n\tssl: x\n", "at line 3"),
    ("bad.json", '{{"kafka": {{"sasl_password": "{s}", }}}}', "not valid JSON: Expecting property name"),
    ("list.yaml", "kafka:\n  sasl_password: [{s}]\n",
     "kafka.sasl_password: invalid (string_type); the value is a secret and not shown"),
    ("dict.yaml", "kafka:\n  ssl_key_password: {{a: {s}}}\n", "kafka.ssl_key_password: invalid"),
    ("rule.yaml", "kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: PLAIN\n  sasl_password: {s}\n",
     "kafka: Value error, SASL PLAIN needs sasl_username and sasl_password"),
])
def test_a_settings_error_names_the_field_and_never_a_secret(tmp_path: Path, clean_env: dict[str, str],
                                                             name: str, text: str, says: str) -> None:
    from tracker.settings import SettingsError, load_settings

    secret = f"FAKESECRET{uuid.uuid4().hex[:12]}"
    path = tmp_path / name
    path.write_text(text.format(s=secret))
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert says in str(err.value) and str(path) in str(err.value)
    assert secret not in str(err.value) and secret[10:] not in str(err.value)


def test_an_adx_settings_error_names_the_field_and_never_the_client_secret(
        monkeypatch: pytest.MonkeyPatch, clean_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from tracker.runtime.kusto_cmd import add_kusto_commands
    from tracker.settings import SettingsError, load_settings

    secret = f"FAKESECRET{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("TRACKER_ADX__AUTH", "app-secret")
    monkeypatch.setenv("TRACKER_ADX__CLIENT_ID", "app")
    monkeypatch.setenv("TRACKER_ADX__CLIENT_SECRET", secret)
    monkeypatch.setenv("TRACKER_ADX__BATCH_MAX_ROWS", "-1")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert str(err.value) == ("invalid settings: adx.batch_max_rows: Input should be greater than or equal to 1 "
                              "(environment variables are TRACKER_<SECTION>__<NAME>)")
    monkeypatch.delenv("TRACKER_ADX__BATCH_MAX_ROWS")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert str(err.value) == ("invalid settings: adx: Value error, auth app-secret needs client_id, tenant_id and "
                              "client_secret (environment variables are TRACKER_<SECTION>__<NAME>)")
    parser = argparse.ArgumentParser()
    add_kusto_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["kusto", "apply"])
    assert args.func(args, None) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: kusto apply: invalid settings: adx") and captured.err.count("\n") == 1
    assert secret not in captured.err + captured.out and secret[-8:] not in captured.err + captured.out


def test_serve_from_a_capture_publishes_objects_slimmed_as_the_watcher_does(tmp_path: Path) -> None:
    """`tracker serve --from-capture` into Kafka: each object is cut to what the reducer reads before it is
    published (a capture holds whole objects: annotations, env values, arguments), as the watcher cuts them."""
    import asyncio

    from tracker.runtime.service import capture_source
    from tracker.shell.capture import BadRecord

    secret = Secrets()
    captures = write_captures(tmp_path, secret)

    async def published() -> list[bytes]:
        out = []
        async for record, _key in capture_source([captures], 1_000):
            if not isinstance(record, BadRecord):
                out.append(json.dumps(record.value).encode())
        return out

    values = asyncio.run(published())
    assert len(values) > len(KINDS) * 10
    object_secrets = {w: v for w, v in secret.made.items() if w.split()[0] in KINDS}
    assert len(object_secrets) >= 20
    found = [where for where, value in object_secrets.items() if any(value.encode() in blob for blob in values)]
    assert not found, found
