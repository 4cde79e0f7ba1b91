"""Smoke test: the kube-apiserver serves Jobs and Kueue Workloads, watches, and status subresources."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from kubernetes_asyncio.client import (
    ApiClient,
    BatchV1Api,
    CustomObjectsApi,
    V1Container,
    V1Job,
    V1JobSpec,
    V1ObjectMeta,
    V1PodSpec,
    V1PodTemplateSpec,
)

from tests.infra.watching import Event, has_condition, wait_for_event

pytestmark = pytest.mark.kube

KUEUE = ("kueue.x-k8s.io", "v1beta1")
#: A foreign spec.managedBy keeps the Job controller (if the simulated cluster shares this apiserver)
#: away from this Job, so only this test writes its status.
MANAGED_BY = "tracker.test/smoke"


def _modified_with(condition_type: str, status: str, reason: str) -> Callable[[Event], bool]:
    def matches(event: Event) -> bool:
        return event["type"] == "MODIFIED" and has_condition(event["raw_object"], condition_type, status, reason)

    return matches


async def test_job_and_workload_status_patches_are_watched(kube_api: ApiClient, kube_namespace: str) -> None:
    batch = BatchV1Api(kube_api)
    custom = CustomObjectsApi(kube_api)
    job = await batch.create_namespaced_job(
        kube_namespace,
        V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=V1ObjectMeta(name="smoke"),
            spec=V1JobSpec(
                suspend=True,
                managed_by=MANAGED_BY,
                template=V1PodTemplateSpec(
                    spec=V1PodSpec(
                        restart_policy="Never",
                        containers=[V1Container(name="main", image="busybox", command=["true"])],
                    )
                ),
            ),
        ),
    )
    workload = await custom.create_namespaced_custom_object(
        *KUEUE,
        kube_namespace,
        "workloads",
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "Workload",
            "metadata": {"name": "smoke"},
            "spec": {
                "queueName": "smoke-queue",
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [
                                    {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
                                ],
                            }
                        },
                    }
                ],
            },
        },
    )
    assert job.spec.managed_by == MANAGED_BY
    assert workload["spec"]["podSets"][0]["count"] == 1

    # Watches start at the create's resourceVersion: they replay every later write, in order.
    job_watch = asyncio.create_task(
        wait_for_event(
            batch.list_namespaced_job,
            kube_namespace,
            field_selector="metadata.name=smoke",
            resource_version=job.metadata.resource_version,
            predicate=_modified_with("Suspended", "True", "SmokeTest"),
            timeout=30,
        )
    )
    workload_watch = asyncio.create_task(
        wait_for_event(
            custom.list_namespaced_custom_object,
            *KUEUE,
            kube_namespace,
            "workloads",
            field_selector="metadata.name=smoke",
            resource_version=workload["metadata"]["resourceVersion"],
            predicate=_modified_with("QuotaReserved", "False", "SmokeTest"),
            timeout=30,
        )
    )

    now = "2025-01-01T00:00:00Z"
    patched_job = await batch.patch_namespaced_job_status(
        "smoke",
        kube_namespace,
        {
            "status": {
                "conditions": [
                    {
                        "type": "Suspended",
                        "status": "True",
                        "reason": "SmokeTest",
                        "message": "suspended by the smoke test",
                        "lastProbeTime": now,
                        "lastTransitionTime": now,
                    }
                ]
            }
        },
    )
    # Custom objects take no strategic merge patch, and a dict body would be sent as JSON Patch.
    patched_workload = await custom.patch_namespaced_custom_object_status(
        *KUEUE,
        kube_namespace,
        "workloads",
        "smoke",
        [
            {
                "op": "add",
                "path": "/status",
                "value": {
                    "conditions": [
                        {
                            "type": "QuotaReserved",
                            "status": "False",
                            "reason": "SmokeTest",
                            "message": "waiting for quota (smoke test)",
                            "lastTransitionTime": now,
                        }
                    ]
                },
            }
        ],
    )
    assert patched_job.status.conditions[0].reason == "SmokeTest"
    assert has_condition(patched_workload, "QuotaReserved", status="False", reason="SmokeTest")

    job_event, workload_event = await asyncio.gather(job_watch, workload_watch)
    assert job_event["raw_object"]["metadata"]["resourceVersion"] == patched_job.metadata.resource_version
    assert job_event["object"].status.conditions[0].message == "suspended by the smoke test"
    assert (
        workload_event["raw_object"]["metadata"]["resourceVersion"] == (patched_workload["metadata"]["resourceVersion"])
    )
    # A status write never changes the spec: the generation stays at 1.
    assert workload_event["raw_object"]["metadata"]["generation"] == 1
