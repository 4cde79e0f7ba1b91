"""Bring components up and down, and record what runs where in `<state>/env.json`.

env.json holds one entry per running component:

    {"kafka":   {"bootstrap": "127.0.0.1:PORT", "processes": [...]},
     "kube":    {"server": "https://127.0.0.1:PORT", "kubeconfig": "/abs/kubeconfig", "processes": [...]},
     "cluster": {"cluster_queue": "...", "local_queue": "...", "priority_classes": [...], "processes": [...]}}

Each process entry is a `proc.Process` (name, pid, start time, log path). `up` is idempotent:
a component whose processes are alive and whose endpoint answers is left alone; a broken one is
stopped and started again from a clean data dir.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.infra import build, cluster, kafka, kube, system
from tests.infra.config import (
    KUBERAY_VERSION,
    KUEUE_BASE_CRDS_VERSION,
    KUEUE_VERSION,
    Component,
    state_root,
    with_dependencies,
    with_dependents,
)
from tests.infra.proc import Process, file_lock, format_duration, log


class Environment:
    def __init__(self, state: Path | None = None) -> None:
        self.state = state or state_root()
        self.env_file = self.state / "env.json"
        #: up() starts Kafka in a worker thread; env.json updates are read-modify-write.
        self._env_file_lock = threading.Lock()

    # --- queries -------------------------------------------------------------------------------

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            data: dict[str, dict[str, Any]] = json.loads(self.env_file.read_text())
        except FileNotFoundError:
            return {}
        return data

    def running(self, component: Component) -> dict[str, Any] | None:
        """The env.json entry of `component` if all its processes are alive and it answers."""
        entry = self.read().get(component.value)
        if entry is None or not all(p.alive() for p in _processes(entry)):
            return None
        if component is Component.KAFKA:
            healthy = kafka.is_ready(entry["bootstrap"])
        elif component is Component.KUBE:
            # Kueue CRDs of another Kueue than the configured one (a cluster of the other version ran on it): they
            # cannot be replaced back (their stored versions), so the control plane starts again.
            crds = entry.get("kueue_crds", KUEUE_BASE_CRDS_VERSION)
            healthy = crds in (KUEUE_BASE_CRDS_VERSION, KUEUE_VERSION) and kube.is_ready(Path(entry["kubeconfig"]))
        else:
            # process liveness is enough (its apiserver is checked as KUBE), if it runs the configured versions
            healthy = (entry.get("kueue_version"), entry.get("kuberay_version")) == (KUEUE_VERSION, KUBERAY_VERSION)
        return entry if healthy else None

    def status(self) -> dict[str, str]:
        data = self.read()
        lines: dict[str, str] = {}
        for component in Component:
            entry = data.get(component.value)
            if entry is None:
                lines[component.value] = "down"
                continue
            dead = [p.name for p in _processes(entry) if not p.alive()]
            endpoint = entry.get("bootstrap") or entry.get("kubeconfig") or entry.get("cluster_queue", "")
            lines[component.value] = f"DEGRADED (dead: {', '.join(dead)})" if dead else f"up  {endpoint}"
        return lines

    # --- actions -------------------------------------------------------------------------------

    def up(self, components: set[Component]) -> list[Component]:
        """Start what is requested (plus dependencies) and not already running; return what was started.

        First ensures every artifact of `build.required_artifacts(components)`, including those of components that
        already run and those only tests read (a CRD, the Compose schema), so that set-up does every download and
        build and no test fetches anything, and the system packages tests run (`system.PACKAGES`: chromium). All or
        nothing: if a component fails to start, whatever this call started is stopped again.
        """
        with file_lock(self.state / "lock"):
            wanted = with_dependencies(components)
            to_start: list[Component] = []
            for component in wanted:
                if self.running(component) is not None:
                    log(f"{component}: already running")
                    continue
                if component.value in self.read():
                    log(f"{component}: not healthy, restarting it (and what depends on it)")
                    for stale in reversed(with_dependents({component})):
                        self._stop(stale)
                to_start.append(component)
            started: list[Component] = []
            # Kafka shares nothing with the Kubernetes side, so the two chains build and start concurrently; the
            # shared artifacts (seconds to fetch) and the system packages (chromium: a minute or two) beside them.
            kafka_chain: list[Component] = [c for c in wanted if c is Component.KAFKA]
            kube_chain: list[Component] = [c for c in wanted if c is not Component.KAFKA]
            chains = [chain for chain in (kafka_chain, kube_chain) if chain]
            with ThreadPoolExecutor(max_workers=4) as pool:
                futures = [pool.submit(_ensure, build.SHARED), pool.submit(system.ensure_all, log_dir=self.state)]
                futures += [pool.submit(self._start_in_order, chain, to_start, started) for chain in chains]
            errors = [error for error in (f.exception() for f in futures) if error is not None]
            if errors:
                for component in reversed([c for c in Component if c in started]):
                    self._stop(component)
                raise errors[0]
        return started

    def _start_in_order(self, chain: list[Component], to_start: list[Component], started: list[Component]) -> None:
        for component in chain:
            begin = time.monotonic()
            _ensure(build.artifacts_for(component))
            if component not in to_start:
                continue
            self._write(component, self._start(component))
            started.append(component)
            log(f"{component}: up in {format_duration(time.monotonic() - begin)}")

    def down(self, components: set[Component] | None = None) -> None:
        """Stop `components` (default: all) and everything that depends on them, in reverse start order."""
        with file_lock(self.state / "lock"):
            for component in reversed(with_dependents(components or set(Component))):
                if component.value in self.read():
                    self._stop(component)
                    log(f"{component}: stopped")

    def _start(self, component: Component) -> dict[str, Any]:
        directory = self.state / component.value
        if component is Component.KAFKA:
            broker = kafka.start(directory)
            return {"bootstrap": broker.bootstrap, "processes": [broker.process.to_json()]}
        if component is Component.KUBE:
            control_plane = kube.start(directory)
            return {
                "server": control_plane.server,
                "kubeconfig": str(control_plane.kubeconfig),
                "kueue_crds": KUEUE_BASE_CRDS_VERSION,
                "processes": [p.to_json() for p in control_plane.processes],
            }
        kube_entry = self.read()[Component.KUBE.value]
        simulated = cluster.start(
            directory,
            kubeconfig=Path(kube_entry["kubeconfig"]),
            pki_dir=self.state / Component.KUBE.value / "pki",
        )
        with self._env_file_lock:  # the control plane now serves the cluster's Kueue CRDs
            data = self.read()
            data[Component.KUBE.value]["kueue_crds"] = KUEUE_VERSION
            self._save(data)
        return {
            "cluster_queue": cluster.CLUSTER_QUEUE,
            "local_queue": cluster.LOCAL_QUEUE,
            "priority_classes": sorted(cluster.PRIORITY_CLASSES),
            "nodes": list(cluster.NODES),
            "kueue_version": KUEUE_VERSION,
            "kuberay_version": KUBERAY_VERSION,
            "ray_dashboard_proxy": simulated.ray_dashboard_proxy,
            "processes": [p.to_json() for p in simulated.processes],
        }

    def _stop(self, component: Component) -> None:
        entry = self.read().get(component.value, {})
        for process in reversed(_processes(entry)):
            process.stop()
        with self._env_file_lock:
            data = self.read()
            data.pop(component.value, None)
            self._save(data)

    def _write(self, component: Component, entry: dict[str, Any]) -> None:
        with self._env_file_lock:
            data = self.read()
            data[component.value] = entry
            self._save(data)

    def _save(self, data: dict[str, dict[str, Any]]) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        temporary = self.env_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        temporary.replace(self.env_file)


def _ensure(artifacts: Sequence[build.Artifact]) -> None:
    for artifact in artifacts:
        artifact.ensure()


def _processes(entry: dict[str, Any]) -> Sequence[Process]:
    return [Process.from_json(p) for p in entry.get("processes", [])]
