"""`tracker serve --watch`: the watcher, the reducer and the index sink in one process on the embedded bus."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.infra.kubectl import Kubectl
from tracker.read.store import IndexReader
from tracker.shell.index_schema import IndexSchemaError

pytestmark = pytest.mark.kube

JOB = """apiVersion: batch/v1
kind: Job
metadata:
  name: serve-watch
  namespace: {ns}
  labels: {{taugrid.io/run-id: {run}, kueue.x-k8s.io/queue-name: team-lq}}
spec:
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers: [{{name: main, image: busybox}}]
"""


def test_serve_watch_keeps_the_index_up_to_date(kubeconfig: Path, kubectl: Kubectl, kube_namespace: str,
                                                tmp_path: Path) -> None:
    index = tmp_path / "index.sqlite"
    run_id = f"serve-watch-{kube_namespace}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracker.cli", "serve", "--watch", "--kubeconfig", str(kubeconfig), "-n", kube_namespace,
         "--index", str(index), "--metrics-port", "0", "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TRACKER_OPS__METRICS_INTERVAL_S": "0.01"})
    lines: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, b"")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        kubectl.run("apply", "-f", "-", stdin=JOB.format(ns=kube_namespace, run=run_id))
        deadline = time.monotonic() + 90
        record = None
        while time.monotonic() < deadline and record is None:
            time.sleep(1)
            if index.exists():  # read as a reader: serve holds the index's writer lock while it runs
                try:
                    with IndexReader(index) as ix:
                        record = next((r for r in ix.records() if r.run_id == run_id), None)
                except (sqlite3.Error, IndexSchemaError):  # created, its schema not written yet
                    continue
        if record is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            reader.join(10)
            pytest.fail(f"the run never reached the index; serve said:\n{b''.join(lines).decode()[-3000:]}")
        assert (record.kind, record.namespace, record.status, record.phase) == ("Job", kube_namespace, "pending",
                                                                              "Admission")
        assert record.queue == "team-lq"
        # the embedded pipeline's metrics, as a scraper reads them (issue 17): it leads, holds the pending run and
        # times it in Admission on its LocalQueue
        port = next(json.loads(line)["port"] for line in list(lines) if b'"ops_endpoint_listening"' in line)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'process="serve-embedded"' in metrics and "tracker_watch_leading 1.0" in metrics
        assert 'tracker_runs{status="pending"}' in metrics and 'tracker_runs{status="pending"} 0.0' not in metrics
        assert f'tracker_oldest_stuck_seconds{{phase="Admission",queue="{kube_namespace}/team-lq"}}' in metrics
        assert 'tracker_changes_consumed_total{partition="embedded"}' in metrics
        assert "tracker_transactions_total" not in metrics  # no Kafka here
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(10)
    out = b"".join(lines)
    assert proc.returncode == 0, out.decode()[-2000:]
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "watch_listed" for e in events)
