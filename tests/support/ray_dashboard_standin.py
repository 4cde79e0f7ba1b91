"""A **stand-in** for the Ray dashboard's job API, which the KubeRay operator polls; no Ray runs here.

In a cluster the dashboard runs in the Ray head container, and the RayJob's submitter pod (K8sJobMode) submits the
entrypoint to it (`ray job submit --no-wait`, then `ray job logs --follow`). kwok runs no container, so nothing
answers `http://<cluster>-head-svc.<ns>.svc.cluster.local:8265`. The simulated cluster starts the KubeRay operator
with `HTTP_PROXY` naming a loopback address (`env.json`: `cluster.ray_dashboard_proxy`); this stand-in listens
there, as an HTTP proxy that answers the dashboard requests itself, so that everything KubeRay writes into a
RayJob's status is KubeRay's own decision from the answers of a dashboard:

- `GET /api/jobs/<id>`: 404 (KubeRay reads "not found") until the submitter pod of that job id (the pod whose
  container has `RAY_JOB_SUBMISSION_ID=<id>`, which KubeRay sets) runs, i.e. until the submitter would have submitted
  it; then the job is PENDING for a second from the container's start, RUNNING for the scripted time, and then
  SUCCEEDED or FAILED (or RUNNING for ever), with `start_time`/`end_time` in milliseconds and Ray's messages;
- `POST /api/jobs/<id>/stop`: STOPPED; `DELETE /api/jobs/<id>`: forgotten; `GET /api/jobs/`: the list.

What each Ray job does is scripted per RayJob (`script()`): its n-th job id (the n-th deployment, a new one after
every retry or re-admission) runs the n-th `RayRun`. Times are the wall clock of this machine, which is also the
API server's. The submitter pods themselves are completed by kwok (their `pod-complete` delay annotations, set by
the test to the scripted run time), as the real submitter exits when `ray job logs --follow` ends.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml

from tests.support.quiet_http import QuietHTTPServer

#: Ray's own wording (ray/dashboard/modules/job/job_manager.py), so KubeRay copies realistic messages.
MESSAGES = {
    "PENDING": "Job has not started yet. It may be waiting for resources (CPUs, GPUs, memory, custom resources) to "
               "become available. It may be waiting for the runtime environment to be set up.",
    "RUNNING": "Job is currently running.",
    "SUCCEEDED": "Job finished successfully.",
    "FAILED": "Job entrypoint command failed with exit code 1",
    "STOPPED": "Job was intentionally stopped.",
}
PENDING_S = 1.0


@dataclass(frozen=True)
class RayRun:
    """What one Ray job does once submitted: run `seconds`, then end `status` (RUNNING: never ends)."""

    seconds: float
    status: str = "SUCCEEDED"


@dataclass
class _Job:
    namespace: str
    rayjob: str
    run: RayRun
    submitted_ms: int
    stopped_ms: int | None = None

    def info(self, job_id: str, now_ms: int) -> dict[str, Any]:
        start = self.submitted_ms + int(PENDING_S * 1000)
        end = start + int(self.run.seconds * 1000)
        info: dict[str, Any] = {"job_id": job_id, "submission_id": job_id, "entrypoint": "python train.py",
                                "metadata": {}, "runtime_env": {}}
        if self.stopped_ms is not None and (self.run.status == "RUNNING" or self.stopped_ms < end):
            status, info["start_time"], info["end_time"] = "STOPPED", start, self.stopped_ms
        elif now_ms < start:
            status = "PENDING"
        elif now_ms < end or self.run.status == "RUNNING":
            status, info["start_time"] = "RUNNING", start
        else:
            status, info["start_time"], info["end_time"] = self.run.status, start, end
        info["status"], info["message"] = status, MESSAGES[status]
        if status == "FAILED":
            info["error_type"] = "JOB_ENTRYPOINT_COMMAND_ERROR"
        return info


@dataclass
class RayDashboardStandIn:
    """The stand-in: `serve()` it on the proxy address the KubeRay operator was started with."""

    kubeconfig: Path
    scripts: dict[tuple[str, str], list[RayRun]] = field(default_factory=dict)
    jobs: dict[str, _Job] = field(default_factory=dict)
    #: (namespace, RayJob) -> the job ids seen, in order: the n-th runs the n-th RayRun of its script
    deployments: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def script(self, namespace: str, rayjob: str, *runs: RayRun) -> None:
        with self.lock:
            self.scripts[(namespace, rayjob)] = list(runs)

    # --- the API -------------------------------------------------------------------------------------

    def answer(self, method: str, host: str, path: str) -> tuple[int, Any]:
        namespace = _namespace(host)
        self.requests.append(f"{method} {host}{path}")
        if namespace is None or not path.startswith("/api/jobs/"):
            return 404, {"error": f"no such endpoint on the Ray dashboard stand-in: {method} {host}{path}"}
        rest = path.removeprefix("/api/jobs/").strip("/")
        if method == "GET" and not rest:
            now = _now_ms()
            with self.lock:
                return 200, [job.info(jid, now) for jid, job in self.jobs.items() if job.namespace == namespace]
        job_id, _, action = rest.partition("/")
        job = self._job(namespace, job_id)
        if job is None:
            return 404, {"error": f"Job {job_id} does not exist"}
        now = _now_ms()
        if method == "GET" and not action:
            return 200, job.info(job_id, now)
        if method == "POST" and action == "stop":
            terminal = job.info(job_id, now)["status"] in ("SUCCEEDED", "FAILED", "STOPPED")
            if not terminal:
                job.stopped_ms = now
            return 200, {"stopped": not terminal}
        if method == "DELETE" and not action:
            with self.lock:
                self.jobs.pop(job_id, None)
            return 200, {"deleted": True}
        return 404, {"error": f"unsupported on the Ray dashboard stand-in: {method} {path}"}

    def _job(self, namespace: str, job_id: str) -> _Job | None:
        with self.lock:
            known = self.jobs.get(job_id)
        if known is not None:
            return known
        rayjob = job_id.rpartition("-")[0]  # KubeRay's job ids are <RayJob name>-<5 random characters>
        started = self._submitter_started(namespace, rayjob, job_id)
        if started is None:
            return None  # not submitted yet: the submitter pod does not run (yet)
        with self.lock:
            seen = self.deployments.setdefault((namespace, rayjob), [])
            if job_id not in seen:
                seen.append(job_id)
            runs = self.scripts.get((namespace, rayjob)) or [RayRun(3)]
            run = runs[min(seen.index(job_id), len(runs) - 1)]
            return self.jobs.setdefault(job_id, _Job(namespace, rayjob, run, started))

    def _submitter_started(self, namespace: str, rayjob: str, job_id: str) -> int | None:
        """When the container of the submitter pod for `job_id` started (ms), if it runs or ran."""
        selector = urllib.parse.quote(f"batch.kubernetes.io/job-name={rayjob}")
        pods = _kube_get(self.kubeconfig, f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        for pod in pods.get("items", []):
            containers = pod["spec"].get("containers") or []
            env = {e.get("name"): e.get("value") for c in containers for e in c.get("env") or []}
            if env.get("RAY_JOB_SUBMISSION_ID") != job_id:
                continue
            for status in pod.get("status", {}).get("containerStatuses") or []:
                state = status.get("state") or {}
                started = (state.get("running") or state.get("terminated") or {}).get("startedAt")
                if started:
                    return int(datetime.fromisoformat(started).timestamp() * 1000)
        return None

    # --- serving ---------------------------------------------------------------------------------------

    @contextmanager
    def serve(self, address: str) -> Iterator[RayDashboardStandIn]:
        host, port = address.rsplit(":", 1)
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                url = urllib.parse.urlsplit(self.path)  # a proxy request: the absolute URL
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                try:
                    code, body = standin.answer(self.command, url.netloc or self.headers.get("Host", ""), url.path)
                except Exception as exc:  # the operator sees a 500, as from a broken dashboard; the test sees why
                    code, body = 500, {"error": f"stand-in failure: {exc!r}"}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PUT = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = QuietHTTPServer((host, int(port)), Handler)
        thread = threading.Thread(target=server.serve_forever, name="ray-dashboard-standin", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def _namespace(host: str) -> str | None:
    """`ns` of `<cluster>-head-svc.<ns>.svc.cluster.local:8265`, the address KubeRay's FetchHeadServiceURL builds."""
    name = host.split(":", 1)[0].split(".")
    return name[1] if len(name) >= 3 and name[2] == "svc" else None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _kube_get(kubeconfig: Path, path: str) -> dict[str, Any]:
    config = yaml.safe_load(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    with urllib.request.urlopen(f"{cluster['server']}{path}", timeout=5, context=context) as response:
        found: dict[str, Any] = json.loads(response.read())
        return found
