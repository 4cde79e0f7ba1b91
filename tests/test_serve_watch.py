"""`tracker serve --watch`: the watcher, the reducer and the index sink in one process on the embedded bus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.infra.kubectl import Kubectl
from tracker.shell.index import ExperimentIndex

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
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        kubectl.run("apply", "-f", "-", stdin=JOB.format(ns=kube_namespace, run=run_id))
        deadline = time.monotonic() + 90
        record = None
        while time.monotonic() < deadline and record is None:
            time.sleep(1)
            if index.exists():
                with ExperimentIndex(index) as ix:
                    record = next((r for r in ix.runs() if r.run_id == run_id), None)
        if record is None:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
            pytest.fail(f"the run never reached the index; serve said:\n{out.decode()[-3000:]}")
        assert (record.kind, record.namespace, record.status, record.phase) == ("Job", kube_namespace, "pending",
                                                                              "Admission")
        assert record.queue == "team-lq"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()[-2000:]
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "watch_listed" for e in events)
