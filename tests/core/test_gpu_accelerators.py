"""Which extended resources count as GPUs: the default set (NVIDIA, AMD, Intel, Habana, every NVIDIA MIG slice), and
the setting ``reduce.accelerator_resources`` that replaces it, passed to the pure reducer through its limits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.core.test_gpu import EXPECTED, _by, _s, _writes
from tracker.core.gpu import ACCELERATOR_RESOURCES, Accelerators, pod_gpus
from tracker.core.limits import ReducerLimits
from tracker.core.reducer import Reducer
from tracker.settings import SettingsError, load_settings

RUN = "whisper-ft-5gd7s"  # oom-retry: three 8-GPU pods, the OOMKilled one's GPU-time lost (PodFailure)


def _fold(resource: str, limits: ReducerLimits | None = None) -> tuple[int, float, dict[str, float]]:
    """The oom-retry scenario with its pods requesting ``resource`` instead of nvidia.com/gpu."""
    red = Reducer(limits)
    for w in _writes("oom-retry"):
        record: Any = w.record
        if w.stream == "pods":
            record = json.loads(json.dumps(record).replace('"nvidia.com/gpu"', json.dumps(resource)))
        red.apply(record, "oom-retry")
    h = red.history(RUN)
    assert h is not None
    return h.run.gpus, _s(h.run.gpu_hours), _by(h.run.lost_gpu_hours_by)


def _expected() -> tuple[int, float, dict[str, float]]:
    gpus, held, lost_by, _ = EXPECTED["oom-retry"][RUN]
    return gpus, held, lost_by


def test_the_default_set_counts_amd_gpus_and_mig_slices_as_gpus() -> None:
    assert _expected() == (16, 8 * (578 + 2647 + 2060), {"PodFailure": 8 * 578})
    assert _fold("nvidia.com/gpu") == _expected()
    assert _fold("amd.com/gpu") == _expected()
    assert _fold("nvidia.com/mig-3g.40gb") == _expected()  # a MIG slice counts as one GPU
    assert _fold("habana.ai/gaudi") == _expected()
    assert _fold("example.com/fpga") == (0, 0.0, {})  # not an accelerator by default


def test_a_custom_list_replaces_the_default_one() -> None:
    fpga = ReducerLimits(accelerator_resources=("example.com/fpga",))
    assert _fold("example.com/fpga", fpga) == _expected()
    assert _fold("nvidia.com/gpu", fpga) == (0, 0.0, {})  # the list replaces the default: NVIDIA GPUs not counted
    prefix = ReducerLimits(accelerator_resources=("example.com/tpu-*",))
    assert _fold("example.com/tpu-v5", prefix) == _expected()
    assert _fold("example.com/tpu", prefix) == (0, 0.0, {})


def test_accelerators_match_names_exactly_and_starred_names_as_prefixes() -> None:
    acc = Accelerators()
    assert ACCELERATOR_RESOURCES == ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe",
                                     "habana.ai/gaudi", "nvidia.com/mig-*")
    assert [r in acc for r in ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe",
                               "habana.ai/gaudi", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-7g.80gb")] == [True] * 7
    assert [r in acc for r in ("nvidia.com/gpu.shared", "nvidia.com/mig", "amd.com/cpu", "cpu", 7)] == [False] * 5
    spec = {"containers": [{"resources": {"requests": {"amd.com/gpu": "2", "nvidia.com/mig-2g.20gb": "3",
                                                       "example.com/fpga": "4"}}}]}
    assert pod_gpus(spec) == 5
    assert pod_gpus(spec, Accelerators(("example.com/fpga",))) == 4
    assert pod_gpus(spec, Accelerators(("example.com/*", "amd.com/gpu"))) == 6


def test_the_setting_reaches_the_reducer_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().reduce.reducer_limits().accelerator_resources == ACCELERATOR_RESOURCES
    monkeypatch.setenv("TRACKER_REDUCE__ACCELERATOR_RESOURCES", "amd.com/gpu, example.com/fpga,amd.com/gpu")
    assert load_settings().reduce.reducer_limits().accelerator_resources == ("amd.com/gpu", "example.com/fpga")
    monkeypatch.setenv("TRACKER_REDUCE__ACCELERATOR_RESOURCES", '["nvidia.com/mig-*"]')
    assert load_settings().reduce.reducer_limits(5).accelerator_resources == ("nvidia.com/mig-*",)
    for bad in ("cpu", "*", "nvidia.com/", "", "[oops"):
        monkeypatch.setenv("TRACKER_REDUCE__ACCELERATOR_RESOURCES", bad)
        with pytest.raises(SettingsError, match=r"^invalid settings: reduce\.accelerator_resources: "):
            load_settings()
