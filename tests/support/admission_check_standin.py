"""A **stand-in** for an AdmissionCheck controller (a ProvisioningRequest or MultiKueue controller, say); no such
controller runs here.

Kueue's two-phase admission: a Workload whose ClusterQueue names AdmissionChecks (`spec.admissionChecksStrategy`)
first reserves quota (`QuotaReserved=True`), and is admitted (`Admitted=True`, after which its Job is unsuspended)
only once every check's entry in `status.admissionChecks` is `Ready`. Kueue itself adds the entries (state `Pending`,
empty message) and keeps them in sync with the ClusterQueue; the controller named by each AdmissionCheck's
`spec.controllerName` decides the state of its entries. Upstream (Kueue 0.12 and 0.17:
`pkg/workload/admissionchecks.go`, `pkg/controller/core/workload_controller.go`,
`pkg/controller/admissionchecks/provisioning/`):

- the controller marks its AdmissionCheck `Active=True` (status subresource); a ClusterQueue whose checks are not all
  active is inactive and admits nothing;
- it moves an entry through the Workload's status subresource, as `workload.SetAdmissionCheckState` does: the state,
  the message, and `lastTransitionTime` set to now when (and only when) the state changes;
- `Ready` (all entries): Kueue writes `Admitted=True`; `Retry`: Kueue evicts the Workload (`Evicted=True`, reason
  `AdmissionCheck`), releases its quota, resets every non-Pending entry to `Pending` ("Reset to Pending after
  eviction. Previously: Retry") and requeues it; `Rejected`: Kueue deactivates it (`spec.active=false`, `Evicted=True`
  reason `DeactivatedDueToAdmissionCheck`).
- Kueue 0.15+ (Workload `v1beta2`, and `v1beta1` served by it) also reads an entry's `requeueAfterSeconds` on `Retry`
  (the ProvisioningRequest controller sets it from its backoff) and keeps the Workload in `requeueState.requeueAt`
  until then; Kueue 0.12's entries have no such field.

This stand-in owns one AdmissionCheck (`spec.controllerName` `CONTROLLER`) and does exactly those writes, when the
test says so (`set()`): what Kueue does with them is Kueue's own decision. Like a real controller it writes with
optimistic concurrency (the object's resourceVersion), reading again on a conflict.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from tracker.shell.watch import ApiError, KubeApi

Obj = dict[str, Any]

CONTROLLER = "taugrid.io/test-admission-check"
CHECK = "taugrid-test-check"
STATES = ("Pending", "Ready", "Retry", "Rejected")


def now_rfc3339() -> str:
    """The API's time format, seconds resolution (metav1.Time)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def entry(wl: Obj, check: str) -> Obj | None:
    """The Workload's `status.admissionChecks` entry of `check`, or None if Kueue has not added it."""
    for state in (wl.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") == check:
            found: Obj = state
            return found
    return None


def moved(wl: Obj, check: str, state: str, message: str, at: str, requeue_after_s: int | None = None) -> Obj:
    """`wl` with its `check` entry set as `workload.SetAdmissionCheckState` does: the state, the message, and
    `lastTransitionTime` = `at` only when the state changes; `requeueAfterSeconds` as given (dropped when None)."""
    if state not in STATES:
        raise ValueError(f"{state!r} is no AdmissionCheck state ({', '.join(STATES)})")
    current = entry(wl, check)
    if current is None:
        raise ValueError(f"Workload {wl['metadata'].get('name')} has no admissionChecks entry {check!r} yet: "
                         "Kueue adds it from the ClusterQueue")
    new = {**current, "state": state, "message": message}
    if current.get("state") != state:
        new["lastTransitionTime"] = at
    if requeue_after_s is None:
        new.pop("requeueAfterSeconds", None)
    else:
        new["requeueAfterSeconds"] = requeue_after_s
    status = dict(wl.get("status") or {})
    status["admissionChecks"] = [new if s.get("name") == check else s for s in status.get("admissionChecks") or []]
    return {**wl, "status": status}


class AdmissionCheckStandIn:
    """The controller of the AdmissionCheck `check` (`spec.controllerName` = CONTROLLER), through `api`."""

    def __init__(self, api: KubeApi, check: str = CHECK, *, version: str = "v1beta1") -> None:
        self.api = api
        self.check = check
        self.version = version  # of the kueue.x-k8s.io API it writes AdmissionChecks with (both Kueues serve v1beta1)

    @property
    def path(self) -> str:
        return f"/apis/kueue.x-k8s.io/{self.version}/admissionchecks/{self.check}"

    def manifest(self) -> Obj:
        return {"apiVersion": f"kueue.x-k8s.io/{self.version}", "kind": "AdmissionCheck",
                "metadata": {"name": self.check}, "spec": {"controllerName": CONTROLLER}}

    async def install(self, within_s: float = 60) -> None:
        """Create the AdmissionCheck (or take over the one a previous run left) and mark it `Active=True`."""
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"could not create AdmissionCheck {self.check} within {within_s:.0f}s (a "
                                     "previous run's still being deleted?)")
            ac = await self._get()
            if ac is not None and ac["metadata"].get("deletionTimestamp"):  # a previous run's, on its way out
                await asyncio.sleep(0.5)
                continue
            if ac is None:
                try:
                    ac = await self.api.request("POST", self.path.rsplit("/", 1)[0], body=self.manifest())
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                    continue
            if ac["spec"].get("controllerName") != CONTROLLER:
                raise AssertionError(f"AdmissionCheck {self.check} belongs to {ac['spec'].get('controllerName')!r}")
            break
        for _ in range(20):
            assert ac is not None
            conditions = [c for c in (ac.get("status") or {}).get("conditions") or [] if c.get("type") != "Active"]
            old = [c for c in (ac.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"]
            if old and old[0].get("status") == "True":
                return
            conditions.append({"type": "Active", "status": "True", "reason": "Active",
                               "message": "The test stand-in controller is ready",
                               "lastTransitionTime": now_rfc3339(),
                               "observedGeneration": ac["metadata"].get("generation", 1)})
            try:
                await self.api.request("PUT", f"{self.path}/status", body={**ac, "status": {"conditions": conditions}})
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
            ac = await self._get()
        raise AssertionError(f"could not mark AdmissionCheck {self.check} Active: conflicts")

    async def uninstall(self) -> None:
        try:
            await self.api.request("DELETE", self.path)
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def set(self, workload_path: str, state: str, message: str, *, requeue_after_s: int | None = None) -> Obj:
        """Move the check's entry of the Workload at `workload_path` to `state` with `message` (its status subresource,
        optimistic concurrency); the Workload as written."""
        for _ in range(40):
            wl = await self.api.get(workload_path)
            body = moved(wl, self.check, state, message, now_rfc3339(), requeue_after_s)
            try:
                return await self.api.request("PUT", f"{workload_path}/status", body=body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
            await asyncio.sleep(0.1)
        raise AssertionError(f"could not set {self.check}={state} on {workload_path}: conflicts")

    async def _get(self) -> Obj | None:
        try:
            return await self.api.get(self.path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
