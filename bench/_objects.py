"""Generated records widened to the objects a cluster really returns: what ``kubectl get ... -w --output-watch-events
-o json`` prints, with ``managedFields``, annotations, full container specs (environment, ports, mounts), volumes,
tolerations, node selector, IPs and container IDs.

The lifecycles come from ``sim.lifecycles``; ``full_record`` only adds fields around them that carry no
lifecycle meaning (nothing the tracker reads is changed: no label, condition, phase, time, count or resource request
is added or altered), so a capture of full objects must give exactly the histories of the plain one
(``bench/replay.py`` checks that). Objects are built anew, never modified: the generator shares parts between them.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import orjson

Obj = dict[str, Any]

_TOLERATIONS = [
    {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"},
    {"effect": "NoSchedule", "key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot"},
]


def _h(text: str) -> int:
    return zlib.crc32(text.encode())


def _hex(text: str, n: int) -> str:
    out = ""
    i = 0
    while len(out) < n:
        out += f"{zlib.crc32(f'{i}:{text}'.encode()):08x}"
        i += 1
    return out[:n]


def _ip(text: str, net: int) -> str:
    h = _h(text)
    return f"10.{net}.{(h >> 8) & 0xFF}.{h & 0xFF}"


def fields_v1(value: Any) -> Any:
    """The ``fieldsV1`` set of a value, as server-side apply records it: maps as ``f:<key>``, lists of named maps as
    ``k:{"name":...}``, leaves as ``{}``."""
    if isinstance(value, dict):
        return {f"f:{k}": fields_v1(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        return {f'k:{{"name":"{v["name"]}"}}': {".": {}, **fields_v1(v)} for v in value}
    return {}


def _managed(manager: str, api: str, when: str, fields: Mapping[str, Any], subresource: str | None = None) -> Obj:
    entry: Obj = {"apiVersion": api, "fieldsType": "FieldsV1", "fieldsV1": fields_v1(fields), "manager": manager,
                  "operation": "Update"}
    if subresource:
        entry["subresource"] = subresource
    entry["time"] = when
    return entry


def _container(ctr: Obj, *, owner: str, ns: str, token_volume: str, extra_env: int) -> Obj:
    """A container as a real training Pod's: its environment, ports, mounts (the resources are kept as they are)."""
    env: list[Obj] = [
        {"name": "MASTER_ADDR", "value": f"{owner}-0.{owner}.{ns}.svc.cluster.local"},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"},
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
        {"name": "TORCH_DISTRIBUTED_DEBUG", "value": "OFF"},
        {"name": "TAU_CHECKPOINT_URI", "value": f"abfss://checkpoints@taugridckpt.dfs.core.windows.net/{ns}/{owner}"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"key": "api-key", "name": "wandb"}}},
    ]
    env.extend({"name": f"TAU_CFG_{i:03d}", "value": _hex(f"{owner}:{i}", 40)} for i in range(extra_env))
    return {**ctr, "env": env, "ports": [{"containerPort": 29500, "name": "dist", "protocol": "TCP"},
                                        {"containerPort": 9090, "name": "metrics", "protocol": "TCP"}],
            "volumeMounts": [{"mountPath": "/dev/shm", "name": "dshm"},
                             {"mountPath": "/mnt/checkpoints", "name": "checkpoints"},
                             {"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": token_volume,
                              "readOnly": True}],
            "workingDir": "/workspace"}


def _volumes(token_volume: str, ns: str) -> list[Obj]:
    return [
        {"emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}, "name": "dshm"},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"checkpoints-{ns}"}},
        {"name": token_volume, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
            {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                        "path": "namespace"}]}}]}},
    ]


def _pod_spec(spec: Obj, *, owner: str, ns: str, token_volume: str, extra_env: int) -> Obj:
    out = {**spec, "containers": [_container(c, owner=owner, ns=ns, token_volume=token_volume, extra_env=extra_env)
                                  for c in spec.get("containers", ())]}
    out["volumes"] = _volumes(token_volume, ns)
    out["nodeSelector"] = {"agentpool": "h100", "kubernetes.azure.com/accelerator": "nvidia"}
    out["tolerations"] = [*spec.get("tolerations", ()), *_TOLERATIONS]
    out["imagePullSecrets"] = [{"name": "acr-pull"}]
    return out


def _template(template: Obj, *, owner: str, ns: str, extra_env: int) -> Obj:
    spec = _pod_spec(template.get("spec") or {}, owner=owner, ns=ns, token_volume="kube-api-access",
                     extra_env=extra_env)
    spec.pop("tolerations", None)  # a template's own, not the admission controller's defaults
    spec["tolerations"] = list(_TOLERATIONS)
    return {**template, "spec": spec}


def _pod(obj: Obj, extra_env: int) -> Obj:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
    owner = (meta.get("ownerReferences") or [{"name": name}])[0]["name"]
    token_volume = f"kube-api-access-{_hex(uid, 5)}"
    new_meta = {**meta, "generateName": f"{owner}-",
                "annotations": {"cni.projectcalico.org/containerID": _hex(uid, 64),
                                "cni.projectcalico.org/podIP": _ip(uid, 244) + "/32",
                                "cni.projectcalico.org/podIPs": _ip(uid, 244) + "/32",
                                "prometheus.io/port": "9090", "prometheus.io/scrape": "true"},
                "finalizers": ["batch.kubernetes.io/job-tracking"]}
    new_spec = _pod_spec(spec, owner=owner, ns=ns, token_volume=token_volume, extra_env=extra_env)
    new_status = dict(status)
    node = spec.get("nodeName")
    if node and status.get("phase") not in (None, "Pending"):
        host = _ip(node, 224)
        new_status.update({"hostIP": host, "hostIPs": [{"ip": host}], "podIP": _ip(uid, 244),
                           "podIPs": [{"ip": _ip(uid, 244)}]})
    if status.get("containerStatuses"):
        image = (spec.get("containers") or [{}])[0].get("image", "")
        new_status["containerStatuses"] = [
            {**cs, "image": image, "imageID": f"{image.partition(':')[0]}@sha256:{_hex(image, 64)}",
             "lastState": cs.get("lastState", {}),
             **({"containerID": f"containerd://{_hex(uid + cs.get('name', ''), 64)}"}
                if "waiting" not in (cs.get("state") or {}) else {})}
            for cs in status["containerStatuses"]]
    when = meta.get("creationTimestamp", "")
    managed = [_managed("kube-controller-manager", "v1", when, {
        "metadata": {k: new_meta[k] for k in ("generateName", "labels", "ownerReferences", "finalizers")
                     if k in new_meta},
        "spec": {k: v for k, v in new_spec.items() if k != "nodeName"}})]
    if len(new_status) > 2:
        managed.append(_managed("kubelet", "v1", when, {"status": new_status}, "status"))
    new_meta["managedFields"] = managed
    return {**obj, "metadata": new_meta, "spec": new_spec, "status": new_status}


def _job(obj: Obj, extra_env: int) -> Obj:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    name, ns = meta["name"], meta["namespace"]
    new_meta = {**meta, "annotations": {"batch.kubernetes.io/job-tracking": "",
                                        "taugrid.io/submitted-by": "tau-cli/2026.8.2",
                                        "taugrid.io/source-commit": _hex(name, 40)},
                "generation": meta.get("generation", 1)}
    new_spec = {**spec, "completionMode": spec.get("completionMode", "NonIndexed"), "manualSelector": False,
                "podReplacementPolicy": "TerminatingOrFailed"}
    if "template" in spec:
        new_spec["template"] = _template(spec["template"], owner=name, ns=ns, extra_env=extra_env)
    if "rayClusterSpec" in spec:
        rc = spec["rayClusterSpec"]
        head = rc.get("headGroupSpec") or {}
        new_rc = {**rc}
        if "template" in head:
            new_rc["headGroupSpec"] = {**head, "template": _template(head["template"], owner=name, ns=ns,
                                                                     extra_env=extra_env)}
        new_spec["rayClusterSpec"] = new_rc
    status = dict(obj.get("status") or {})
    if obj["kind"] == "Job" and status:
        status.setdefault("uncountedTerminatedPods", {})
    new_meta["managedFields"] = [
        _managed("tau-cli", obj["apiVersion"], meta.get("creationTimestamp", ""), {"metadata": {
            "annotations": new_meta["annotations"], "labels": meta.get("labels", {})}, "spec": new_spec}),
        *([_managed("kube-controller-manager", obj["apiVersion"], meta.get("creationTimestamp", ""),
                    {"status": status}, "status")] if status else [])]
    return {**obj, "metadata": new_meta, "spec": new_spec, "status": status}


def _workload(obj: Obj, extra_env: int) -> Obj:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    owner = (meta.get("ownerReferences") or [{"name": meta["name"]}])[0]["name"]
    new_spec = {**spec, "podSets": [{**ps, "template": _template(ps["template"], owner=owner, ns=meta["namespace"],
                                                                 extra_env=extra_env)} if "template" in ps else ps
                                    for ps in spec.get("podSets", ())]}
    new_meta = {**meta, "finalizers": ["kueue.x-k8s.io/resource-in-use"], "generation": meta.get("generation", 1)}
    status = obj.get("status") or {}
    new_meta["managedFields"] = [
        _managed("kueue", obj["apiVersion"], meta.get("creationTimestamp", ""),
                 {"metadata": {k: new_meta[k] for k in ("finalizers", "labels", "ownerReferences") if k in new_meta},
                  "spec": new_spec}),
        *([_managed("kueue-admission", obj["apiVersion"], meta.get("creationTimestamp", ""), {"status": status},
                    "status")] if status else [])]
    return {**obj, "metadata": new_meta, "spec": new_spec}


def _event(obj: Obj) -> Obj:
    meta = obj["metadata"]
    component = (obj.get("source") or {}).get("component", "")
    new = {**obj, "reportingComponent": component, "reportingInstance": f"{component}-7d9f8b6c5-x2x4q",
           "eventTime": None, "source": {**(obj.get("source") or {}), "host": "aks-system-29511474-vmss000001"}}
    new["metadata"] = {**meta, "managedFields": [_managed(component or "kubelet", "v1",
                                                          meta.get("creationTimestamp", ""),
                                                          {k: v for k, v in new.items()
                                                           if k not in ("apiVersion", "kind", "metadata")})]}
    return new


def _full_object(obj: Obj, extra_env: int, managed: bool) -> Obj:
    kind = obj.get("kind")
    if kind == "Pod":
        out = _pod(obj, extra_env)
    elif kind in ("Job", "RayJob"):
        out = _job(obj, extra_env)
    elif kind == "Workload":
        out = _workload(obj, extra_env)
    elif kind == "Event":
        out = _event(obj)
    else:
        return obj
    if not managed:
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k != "managedFields"}
    return out


def full_record(record: Obj, object_bytes: int = 0, *, detail: str = "full") -> Obj:
    """``record`` (a watch event or an intake event) with its object as the apiserver returns it (``detail``:
    ``full``; ``medium`` is the same without ``managedFields``); Pods, Jobs and Workloads below ``object_bytes``
    (encoded) are padded to about that size with further environment variables (Events and intake events keep
    their natural size)."""
    obj = record.get("object")
    if not isinstance(obj, dict):
        return record
    managed = detail == "full"
    full = _full_object(obj, 0, managed)
    if object_bytes and obj.get("kind") in ("Pod", "Job", "RayJob", "Workload"):
        extra = 0
        for _ in range(4):
            size = len(orjson.dumps(full))
            if size >= object_bytes * 0.97:
                break
            # one more variable is ~130 bytes per container it is added to (itself and its managedFields entry)
            extra += max(1, (object_bytes - size) // (130 * max(1, len(_containers(full)))))
            full = _full_object(obj, extra, managed)
    return {**record, "object": full}


def _containers(obj: Obj) -> list[Obj]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return list(spec.get("containers", ()))
    if "template" in spec:
        return list(spec["template"]["spec"].get("containers", ()))
    if "podSets" in spec:
        return [c for ps in spec["podSets"] for c in ps.get("template", {}).get("spec", {}).get("containers", ())]
    if "rayClusterSpec" in spec:
        head = spec["rayClusterSpec"].get("headGroupSpec") or {}
        return list(head.get("template", {}).get("spec", {}).get("containers", ()))
    return []
