"""The AdmissionCheck stand-in's write (`moved`) without a cluster: what `workload.SetAdmissionCheckState` does to an
entry. The stand-in's writes to a real Kueue are exercised by the admission-check controller scenarios
(`tests/watch/test_controller_scenarios.py`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.admission_check_standin import CHECK, entry, moved

T0, T1 = "2026-12-03T08:00:00Z", "2026-12-03T08:00:07Z"


def workload(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "job-a-1f2e3"}, "status": {"conditions": [], "admissionChecks": list(entries)}}


def test_a_new_state_is_stamped_and_a_new_message_alone_is_not() -> None:
    wl = workload({"name": CHECK, "state": "Pending", "message": "", "lastTransitionTime": T0},
                  {"name": "other", "state": "Ready", "message": "ok", "lastTransitionTime": T0})
    waiting = moved(wl, CHECK, "Pending", "waiting for capacity", T1)
    assert entry(waiting, CHECK) == {"name": CHECK, "state": "Pending", "message": "waiting for capacity",
                                     "lastTransitionTime": T0}
    ready = moved(waiting, CHECK, "Ready", "provisioned", T1)
    assert entry(ready, CHECK) == {"name": CHECK, "state": "Ready", "message": "provisioned", "lastTransitionTime": T1}
    assert entry(ready, "other") == entry(wl, "other")  # the other controller's entry is left alone
    assert entry(wl, CHECK) == {"name": CHECK, "state": "Pending", "message": "", "lastTransitionTime": T0}  # a copy


def test_retry_carries_its_requeue_delay_and_other_states_drop_it() -> None:
    wl = workload({"name": CHECK, "state": "Pending", "message": "", "lastTransitionTime": T0, "retryCount": 1})
    retry = moved(wl, CHECK, "Retry", "failed; retrying", T1, requeue_after_s=5)
    assert entry(retry, CHECK) == {"name": CHECK, "state": "Retry", "message": "failed; retrying",
                                   "lastTransitionTime": T1, "requeueAfterSeconds": 5, "retryCount": 1}
    pending = entry(moved(retry, CHECK, "Pending", "again", T1), CHECK)
    assert pending is not None and "requeueAfterSeconds" not in pending and pending["retryCount"] == 1


def test_only_a_known_state_of_an_entry_kueue_added_is_written() -> None:
    wl = workload({"name": CHECK, "state": "Pending", "message": "", "lastTransitionTime": T0})
    with pytest.raises(ValueError, match="no AdmissionCheck state"):
        moved(wl, CHECK, "Approved", "", T1)
    with pytest.raises(ValueError, match="Kueue adds it"):
        moved(workload(), CHECK, "Ready", "", T1)
