"""Smoke test: the simulated cluster runs Kueue-managed Jobs on kwok GPU nodes, and preempts by priority."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio.client import (
    ApiClient,
    BatchV1Api,
    CoreV1Api,
    CustomObjectsApi,
    V1Container,
    V1Job,
    V1JobSpec,
    V1ObjectMeta,
    V1PodSpec,
    V1PodTemplateSpec,
    V1ResourceRequirements,
)

from tests.infra.cluster import GPU
from tests.infra.fixtures import KubeCluster
from tests.infra.watching import Event, has_condition, wait_for_event

pytestmark = pytest.mark.cluster

KUEUE = ("kueue.x-k8s.io", "v1beta1")
#: kwok "general" pod stages read these; a long delay keeps a pod Running until it is preempted.
KEEP_RUNNING = {
    "pod-complete.stage.kwok.x-k8s.io/delay": "10m",
    "pod-complete.stage.kwok.x-k8s.io/jitter-delay": "10m",
}


def _queued_job(
    name: str,
    *,
    queue: str,
    pods: int,
    gpus_per_pod: int,
    priority: str = "",
    pod_annotations: dict[str, str] | None = None,
) -> V1Job:
    """A Job Kueue will manage. Created suspended: without Kueue's webhook nothing suspends it for us."""
    labels = {"kueue.x-k8s.io/queue-name": queue}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    gpus = {GPU: str(gpus_per_pod)}
    container = V1Container(
        name="train",
        image="busybox",
        resources=V1ResourceRequirements(requests={"cpu": "1", **gpus}, limits=gpus),
    )
    return V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=V1ObjectMeta(name=name, labels=labels),
        spec=V1JobSpec(
            suspend=True,
            parallelism=pods,
            completions=pods,
            template=V1PodTemplateSpec(
                metadata=V1ObjectMeta(annotations=pod_annotations),
                spec=V1PodSpec(restart_policy="Never", containers=[container]),
            ),
        ),
    )


async def _workload_event(
    custom: CustomObjectsApi, namespace: str, job: V1Job, condition_type: str, *, reason: str = ""
) -> dict[str, Any]:
    """Wait until the Workload Kueue created for `job` has `condition_type`=True; return the Workload."""

    def matches(event: Event) -> bool:
        owners = event["raw_object"]["metadata"].get("ownerReferences") or []
        return any(o["uid"] == job.metadata.uid for o in owners) and has_condition(
            event["raw_object"], condition_type, reason=reason
        )

    event = await wait_for_event(
        custom.list_namespaced_custom_object, *KUEUE, namespace, "workloads", predicate=matches, timeout=90
    )
    workload: dict[str, Any] = event["raw_object"]
    return workload


async def test_queued_job_runs_to_completion_on_kwok_nodes(
    kube_api: ApiClient, kube_cluster: KubeCluster, queue_namespace: str
) -> None:
    batch, core, custom = BatchV1Api(kube_api), CoreV1Api(kube_api), CustomObjectsApi(kube_api)
    job = await batch.create_namespaced_job(
        queue_namespace, _queued_job("train", queue=kube_cluster.local_queue, pods=2, gpus_per_pod=1)
    )
    assert job.spec.suspend is True

    workload = await _workload_event(custom, queue_namespace, job, "Admitted")
    assert workload["status"]["admission"]["clusterQueue"] == kube_cluster.cluster_queue
    assert workload["spec"]["podSets"][0]["count"] == 2

    completed = await wait_for_event(
        batch.list_namespaced_job,
        queue_namespace,
        field_selector="metadata.name=train",
        predicate=lambda e: has_condition(e["raw_object"], "Complete"),
        timeout=90,
    )
    assert completed["object"].spec.suspend is False  # Kueue resumed it
    assert completed["object"].status.succeeded == 2

    pods = (await core.list_namespaced_pod(queue_namespace, label_selector="batch.kubernetes.io/job-name=train")).items
    assert len(pods) == 2
    assert {pod.status.phase for pod in pods} == {"Succeeded"}
    for pod in pods:
        node = await core.read_node(pod.spec.node_name)
        assert node.metadata.annotations.get("kwok.x-k8s.io/node") == "fake"
        assert int(node.status.allocatable[GPU]) >= 1


async def test_high_priority_job_preempts_low_priority_job(
    kube_api: ApiClient, kube_cluster: KubeCluster, queue_namespace: str
) -> None:
    batch, custom = BatchV1Api(kube_api), CustomObjectsApi(kube_api)
    cluster_queue = await custom.get_cluster_custom_object(*KUEUE, "clusterqueues", kube_cluster.cluster_queue)
    quotas = cluster_queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    gpu_quota = int(next(q["nominalQuota"] for q in quotas if q["name"] == GPU))
    pods = 2
    assert gpu_quota % pods == 0

    low = await batch.create_namespaced_job(
        queue_namespace,
        _queued_job(
            "low",
            queue=kube_cluster.local_queue,
            pods=pods,
            gpus_per_pod=gpu_quota // pods,
            priority="low",
            pod_annotations=KEEP_RUNNING,
        ),
    )
    low_admitted = await _workload_event(custom, queue_namespace, low, "Admitted")
    assert low_admitted["spec"]["priority"] == 100
    await wait_for_event(
        batch.list_namespaced_job,
        queue_namespace,
        field_selector="metadata.name=low",
        predicate=lambda e: (e["object"].status.ready or 0) == pods,
        timeout=60,
    )

    high = await batch.create_namespaced_job(
        queue_namespace,
        _queued_job("high", queue=kube_cluster.local_queue, pods=1, gpus_per_pod=gpu_quota // pods, priority="high"),
    )
    low_evicted, high_admitted = await asyncio.gather(
        _workload_event(custom, queue_namespace, low, "Evicted", reason="Preempted"),
        _workload_event(custom, queue_namespace, high, "Admitted"),
    )
    assert high_admitted["spec"]["priority"] == 1000
    assert low_evicted["metadata"]["name"] == low_admitted["metadata"]["name"]
    low_now = await batch.read_namespaced_job("low", queue_namespace)
    assert low_now.spec.suspend is True  # Kueue stopped the preempted Job
