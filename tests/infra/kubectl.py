"""A small synchronous kube client: the kubectl built alongside the apiserver, driven with JSON."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.infra.proc import InfraError

Manifest = Mapping[str, Any]


@dataclass(frozen=True)
class Kubectl:
    binary: Path
    kubeconfig: Path

    def run(self, *args: str, stdin: str | None = None, timeout: float = 120.0) -> str:
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        try:
            result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise InfraError(f"`kubectl {' '.join(args)}` timed out after {timeout:.0f}s") from exc
        if result.returncode != 0:
            raise InfraError(f"`kubectl {' '.join(args)}` failed: {result.stderr.strip() or result.stdout.strip()}")
        return result.stdout

    def apply(self, manifests: Iterable[Manifest]) -> None:
        """Server-side apply of `manifests` in one request; idempotent.

        Like create_files, no client-side validation: it first downloads the apiserver's whole
        OpenAPI document, which with the KubeRay CRDs installed takes 30 s or more on a busy machine.
        The apiserver still validates every object.
        """
        items = list(manifests)
        if items:
            body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
            self.run(
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=tracker-testenv",
                "--validate=false",
                "-f",
                "-",
                stdin=body,
            )

    def create_files(self, files: Sequence[Path]) -> list[str]:
        """Create the objects in `files`; return them as `kind.group/name`.

        Plain create, not apply: these are fresh objects, and server-side apply's managed-fields
        bookkeeping makes creating the large KubeRay CRDs about 50% slower.
        """
        return self.run("create", "--validate=false", "--output=name", *(f"--filename={f}" for f in files)).split()

    def wait(self, *targets: str, condition: str, timeout: float, namespace: str | None = None) -> None:
        scope = [f"--namespace={namespace}"] if namespace else []
        self.run(
            "wait",
            *targets,
            *scope,
            f"--for=condition={condition}",
            f"--timeout={timeout:.0f}s",
            timeout=timeout + 30,
        )

    def create_namespace(self, prefix: str = "test") -> str:
        """A new namespace named `<prefix>-<random>`."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
        return name

    def delete_namespace(self, name: str) -> None:
        """Delete without waiting; the namespace controller (if running) finishes the job."""
        self.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")
