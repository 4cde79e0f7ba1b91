"""Settings that cannot work are refused at start, naming the field (never a traceback from a client later)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracker.settings import SettingsError, load_settings


@pytest.mark.parametrize("servers", ["host:notaport", "host", "localhost:9092,:9", "k-0:0", "k-0:65536"])
def test_bootstrap_servers_that_are_not_host_port_are_refused(servers: str) -> None:
    with pytest.raises(SettingsError, match=r"bootstrap_servers: .* is not host:port"):
        load_settings(None, {"kafka": {"bootstrap_servers": servers}})


@pytest.mark.parametrize("servers", ["kafka-0:9092", "k-0:9092, k-1:9092", "[::1]:9092", "10.0.0.1:9093"])
def test_bootstrap_servers_as_host_port_lists_are_accepted(servers: str) -> None:
    assert load_settings(None, {"kafka": {"bootstrap_servers": servers}}).kafka.bootstrap_servers == servers


def test_tracker_reduce_takes_no_more_records_a_poll_than_dead_letters_it_keeps() -> None:
    # every record of a batch (one transaction) may be a dead letter, and none may be counted without being kept
    assert load_settings(None, {}).reduce.batch_records == 10_000
    assert load_settings(None, {"reduce": {"max_batch_records": 20_000}}).reduce.batch_records == 10_000
    assert load_settings(None, {"reduce": {"max_batch_records": 500, "max_dead_letters": 100}}).reduce.batch_records \
        == 100
    assert load_settings(None, {"reduce": {"max_batch_records": 500}}).reduce.batch_records == 500


async def test_the_reducers_changes_consumer_waits_as_reduce_says_and_the_others_as_before() -> None:
    """reduce.fetch_min_bytes and reduce.fetch_max_wait_ms are Kafka's fetch.min.bytes and fetch.max.wait.ms of the
    changes consumer alone (by default 256 KiB, and the wait kafka.fetch_max_wait_ms); the other consumers' broker
    answers at the first byte."""
    from tracker.shell import kafka

    defaults = load_settings(None, {"kafka": {"bootstrap_servers": "kafka-0:9092"}})  # no connection made
    assert (defaults.reduce.fetch_min_bytes, defaults.reduce.fetch_max_wait_ms) == (262_144, None)
    plain = kafka.make_consumer(defaults.kafka, group_id=None)
    assert (plain._fetch_min_bytes, plain._fetch_max_wait_ms) == (1, defaults.kafka.fetch_max_wait_ms)
    gathering = kafka.make_consumer(defaults.kafka, group_id="g", fetch_min_bytes=262_144, fetch_max_wait_ms=250)
    assert (gathering._fetch_min_bytes, gathering._fetch_max_wait_ms) == (262_144, 250)
    with pytest.raises(SettingsError, match=r"reduce\.fetch_min_bytes"):
        load_settings(None, {"reduce": {"fetch_min_bytes": 0}})
    with pytest.raises(SettingsError, match=r"reduce\.fetch_max_wait_ms"):
        load_settings(None, {"reduce": {"fetch_max_wait_ms": 60_000}})


def test_invalid_settings_are_one_line_on_stderr_whatever_the_terminal_width() -> None:
    """Every problem on one line (a log collector keeps it whole), named by field, with exit code 2."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")}
    env.update(TRACKER_REDUCE__MAX_HELD="abc", TRACKER_OPS__LOG_LEVEL="LOUD", COLUMNS="40")
    proc = subprocess.run([sys.executable, "-m", "tracker.cli", "reduce", "--bootstrap-servers", "localhost:9092"],
                          env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "reduce.max_held" in lines[0] and "ops.log_level" in lines[0] and "TRACKER_<SECTION>__<NAME>" in lines[0]


# ------------------------------------------------------------------------------------------ the adx section


@pytest.fixture
def no_tracker_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.upper().startswith("TRACKER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_adx_settings_are_a_section_of_the_tree(no_tracker_env: pytest.MonkeyPatch) -> None:
    env = no_tracker_env
    env.setenv("TRACKER_ADX__CLUSTER_URI", "https://taugrid.westeurope.kusto.windows.net")
    env.setenv("TRACKER_ADX__DATABASE", "Telemetry")
    env.setenv("TRACKER_ADX__AUTH", "app-secret")
    env.setenv("TRACKER_ADX__CLIENT_ID", "app")
    env.setenv("TRACKER_ADX__TENANT_ID", "tenant")
    env.setenv("TRACKER_ADX__CLIENT_SECRET", "FAKESECRET-new-name")
    env.setenv("TRACKER_ADX__SPOOL_MAX_BYTES", "1024")
    settings = load_settings()
    adx = settings.adx
    assert (adx.cluster_uri, adx.database, adx.auth, adx.spool_max_bytes) == (
        "https://taugrid.westeurope.kusto.windows.net", "Telemetry", "app-secret", 1024)
    assert adx.client_secret is not None and adx.client_secret.get_secret_value() == "FAKESECRET-new-name"
    assert settings.deprecated_env == ()
    assert "FAKESECRET" not in repr(settings) and "FAKESECRET" not in str(settings.model_dump())
    assert load_settings(None, {"adx": {"database": "Flag"}}).adx.database == "Flag"  # flags above the environment


def test_adx_settings_from_a_settings_file(no_tracker_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "tracker.yaml"
    config.write_text("adx:\n  cluster_uri: http://127.0.0.1:8080\n  auth: none\n  batch_max_rows: 10\n")
    adx = load_settings(config).adx
    assert (adx.cluster_uri, adx.auth, adx.batch_max_rows, adx.database) == ("http://127.0.0.1:8080", "none", 10,
                                                                             "Metrics")


def test_the_old_adx_names_still_work_with_one_warning_each(no_tracker_env: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    from tracker.runtime.ops import log_deprecated_env

    env = no_tracker_env
    env.setenv("TRACKER_ADX_CLUSTER_URI", "https://old.kusto.windows.net")
    env.setenv("TRACKER_ADX_AUTH", "app-secret")
    env.setenv("TRACKER_ADX_CLIENT_ID", "app")
    env.setenv("TRACKER_ADX_TENANT_ID", "tenant")
    env.setenv("TRACKER_ADX_CLIENT_SECRET", "FAKESECRET-old-name")
    config = tmp_path / "tracker.yaml"  # the old names are environment variables: above the settings file
    config.write_text("adx:\n  cluster_uri: https://file.kusto.windows.net\n  database: FromFile\n")
    settings = load_settings(config)
    adx = settings.adx
    assert (adx.cluster_uri, adx.auth, adx.client_id, adx.tenant_id, adx.database) == (
        "https://old.kusto.windows.net", "app-secret", "app", "tenant", "FromFile")
    assert adx.client_secret is not None and adx.client_secret.get_secret_value() == "FAKESECRET-old-name"
    with capture_logs() as logs:
        log_deprecated_env(settings)
    assert sorted((e["event"], e["log_level"], e["variable"], e["use_instead"]) for e in logs) == [
        ("settings_deprecated_env", "warning", f"TRACKER_ADX_{name}", f"TRACKER_ADX__{name}")
        for name in ("AUTH", "CLIENT_ID", "CLIENT_SECRET", "CLUSTER_URI", "TENANT_ID")]
    assert "FAKESECRET" not in str(logs)


def test_a_new_adx_name_wins_over_its_old_one(no_tracker_env: pytest.MonkeyPatch) -> None:
    env = no_tracker_env
    env.setenv("TRACKER_ADX_DATABASE", "Old")
    env.setenv("TRACKER_ADX__DATABASE", "New")
    env.setenv("TRACKER_ADX_SOURCE_CLUSTER", "aks-old")
    settings = load_settings()
    assert (settings.adx.database, settings.adx.source_cluster) == ("New", "aks-old")
    assert settings.deprecated_env == (("TRACKER_ADX_SOURCE_CLUSTER", "TRACKER_ADX__SOURCE_CLUSTER"),)


@pytest.mark.parametrize("prefix", ["TRACKER_ADX__", "TRACKER_ADX_"])
def test_a_bad_adx_value_is_one_line_naming_the_field_never_the_secret(no_tracker_env: pytest.MonkeyPatch,
                                                                       prefix: str) -> None:
    env = no_tracker_env
    env.setenv(f"{prefix}AUTH", "app-secret")
    env.setenv(f"{prefix}CLIENT_ID", "app")
    env.setenv(f"{prefix}CLIENT_SECRET", "FAKESECRET-0123456789")
    env.setenv(f"{prefix}BATCH_MAX_BYTES", "12")
    with pytest.raises(SettingsError) as err:
        load_settings()
    message = str(err.value)
    assert message.count("\n") == 0 and "adx.batch_max_bytes: Input should be greater than or equal to 1024" in message
    assert "FAKESECRET" not in message and "0123456789" not in message
    env.delenv(f"{prefix}BATCH_MAX_BYTES")
    env.setenv(f"{prefix}CLIENT_SECRET", "")  # no secret: app-secret cannot work
    with pytest.raises(SettingsError, match=r"^invalid settings: adx: Value error, auth app-secret needs client_id, "
                                            r"tenant_id and client_secret \(environment"):
        load_settings()
    env.setenv(f"{prefix}CLIENT_SECRET", "FAKESECRET-0123456789")
    env.setenv(f"{prefix}AUTH", "kerberos")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "adx.auth: Input should be 'workload-identity'" in str(err.value) and "FAKESECRET" not in str(err.value)


def test_kusto_apply_warns_about_an_old_name_on_stderr_only() -> None:
    """The warning is a log line on stderr (the process's logs), naming both variables; stdout stays the apply's."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TRACKER_")}
    env.update(TRACKER_ADX_DATABASE="OldName", TRACKER_ADX__AUTH="none", TRACKER_OPS__LOG_FORMAT="json")
    proc = subprocess.run([sys.executable, "-m", "tracker.cli", "kusto", "apply", "--dry-run"], env=env,
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("// ") and "for database OldName (dry run: nothing sent)" in proc.stdout
    [line] = proc.stderr.splitlines()
    event = json.loads(line)
    assert (event["event"], event["level"], event["variable"], event["use_instead"]) == (
        "settings_deprecated_env", "warning", "TRACKER_ADX_DATABASE", "TRACKER_ADX__DATABASE")
    assert "OldName" not in line


def _alias_bomb(levels: int = 9, refs: int = 9) -> str:
    """The "billion laughs": each anchor a list of ``refs`` aliases of the one before (``refs ** levels`` leaves)."""
    lines = ["reduce:", '  a0: &a0 ["lol"]']
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * refs)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text", [_alias_bomb(), "sink: &s {index_path: /tmp/x.sqlite}\nindex: *s\n"])
def test_a_settings_file_with_aliases_is_refused_in_one_line_at_once(tmp_path: Path, text: str) -> None:
    """Settings files have no need of YAML anchors and aliases; a nest of them ("billion laughs") would take the
    loader minutes and gigabytes: refused before any is expanded, naming the file."""
    import os
    import subprocess
    import sys

    path = tmp_path / "settings.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=r"^settings file .*settings\.yaml uses YAML anchors or aliases"):
        load_settings(path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKER_")}
    env.update(TRACKER_CONFIG_FILE=str(path), COLUMNS="40")
    proc = subprocess.run([sys.executable, "-m", "tracker.cli", "reduce", "--bootstrap-servers", "localhost:9092"],
                          env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "anchors or aliases" in lines[0], proc.stderr


def test_an_anchor_like_text_in_a_quoted_value_is_not_an_alias(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text('sink:\n  index_path: "/tmp/&a *b.sqlite"\n')
    assert str(load_settings(path).sink.index_path) == "/tmp/&a *b.sqlite"
