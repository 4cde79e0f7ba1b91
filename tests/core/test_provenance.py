"""What ran (issue 28 point 6; tracker.core.provenance): the images and entrypoint of a Job and a RayJob, the
Rendering intake event's image, entrypoint and hyperparameters, their bounds and redaction, and their state: a run's
facts carry them through a snapshot, and a snapshot written before them still loads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim import builders as b
from tests.support.laws import fold
from tracker.core import provenance
from tracker.core.model import RunRecord
from tracker.core.reducer import Reducer

NS = "team-a"


def job(name: str, containers: list[dict[str, Any]], rv: str = "1") -> dict[str, Any]:
    meta = b.object_meta(name=name, namespace=NS, uid=b.uid("job", name), created=b.at("09:00:00"),
                         labels={"taugrid.io/run-id": name, "kueue.x-k8s.io/queue-name": "lq"})
    meta["resourceVersion"] = rv
    return {"type": "ADDED", "object": {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {
        "parallelism": 1, "template": {"spec": {"containers": containers}}}, "status": {}}}


def rayjob(name: str, entrypoint: str, head: list[str], workers: list[list[str]]) -> dict[str, Any]:
    meta = b.object_meta(name=name, namespace=NS, uid=b.uid("rayjob", name), created=b.at("09:00:00"),
                         labels={"taugrid.io/run-id": name})
    meta["resourceVersion"] = "1"

    def template(images: list[str]) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)]}}

    return {"type": "ADDED", "object": {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": {
        "entrypoint": entrypoint, "rayClusterSpec": {
            "headGroupSpec": {"template": template(head)},
            "workerGroupSpecs": [{"replicas": 1, "template": template(w)} for w in workers]}}, "status": {}}}


def rendering(run_id: str, **fields: Any) -> dict[str, Any]:
    return {"schema": "taugrid.io/intake/v2", "event_id": f"render-{run_id}", "run_id": run_id,
            "at": "2026-08-20T08:59:59Z", "kind": "Rendering", "status": "succeeded", **fields}


def run_of(red: Reducer, run_id: str) -> RunRecord:
    h = red.history(run_id)
    assert h is not None, red.flush().dead_letters
    return h.run


def test_a_job_gives_its_containers_images_and_the_first_containers_command_line() -> None:
    red = fold([job("j", [
        {"name": "main", "image": "acr.io/train:1", "command": ["torchrun", "--nnodes=$(NNODES)"],
         "args": ["-m", "train", "--name", "it's mine", ""]},
        {"name": "sidecar", "image": "acr.io/log:2", "command": ["tail", "-f"]},
        {"name": "again", "image": "acr.io/train:1"}])])
    run = run_of(red, "j")
    assert run.images == ["acr.io/train:1", "acr.io/log:2"]  # distinct, in order
    assert run.entrypoint == "torchrun '--nnodes=$(NNODES)' -m train --name 'it'\"'\"'s mine' ''"  # shell-style
    assert run.hyperparameters == {} and run.hyperparameters_omitted == 0


def test_a_rayjob_gives_its_entrypoint_and_its_head_then_worker_images() -> None:
    red = fold([rayjob("r", "python -m taugrid.rl.ppo --config c.yaml", ["ray:2.49-head", "log:1"],
                       [["ray:2.49-gpu"], ["ray:2.49-gpu", "ray:2.49-cpu"]])])
    run = run_of(red, "r")
    assert run.images == ["ray:2.49-head", "log:1", "ray:2.49-gpu", "ray:2.49-cpu"]
    assert run.entrypoint == "python -m taugrid.rl.ppo --config c.yaml"


def test_the_rendering_event_gives_hyperparameters_and_an_image_the_objects_do_not_have() -> None:
    hp = {"optim.lr": 3e-4, "train.bf16": True, "seed": 7, "note": None, "opt": "adamw"}
    red = fold([rendering("j", image="acr.io/train:rendered", entrypoint="tau-run train", hyperparameters=hp),
                job("j", [{"name": "main", "image": "acr.io/train:1", "command": ["train"]}])])
    run = run_of(red, "j")
    assert run.images == ["acr.io/train:1", "acr.io/train:rendered"]  # they differ: both, the object's first
    assert run.entrypoint == "train"  # the object is the truth
    assert list(run.hyperparameters) == sorted(hp) and run.hyperparameters == hp
    same = fold([rendering("k", image="acr.io/train:1", entrypoint="tau-run train"),
                 job("k", [{"name": "main", "image": "acr.io/train:1"}])])
    assert run_of(same, "k").images == ["acr.io/train:1"]
    assert run_of(same, "k").entrypoint == "tau-run train"  # the object has no command: the event's


def test_without_the_root_what_ran_comes_from_the_rendering_event() -> None:
    red = fold([rendering("f", image="acr.io/x:1", entrypoint="python x.py --token abcdef123456",
                          hyperparameters={"lr": 1})])
    run = run_of(red, "f")
    assert (run.images, run.entrypoint, run.hyperparameters) == (
        ["acr.io/x:1"], "python x.py --token [redacted]", {"lr": 1})


def test_hyperparameters_are_bounded_sorted_and_redacted() -> None:
    hp: dict[str, Any] = {f"k{i:03d}": i for i in range(70)}
    hp |= {"a_long": "x" * 1000, "hf_token": "hf_abcdefghijklmnopqrstuvwxyz", "api_key": 12345,
           "a_url": "https://acct.blob.core.windows.net/c/d?sv=2022&sig=SIGSECRET123", "a_flag": False}
    red = fold([rendering("h", hyperparameters=hp)])
    run = run_of(red, "h")
    kept = sorted(hp)[:provenance.MAX_HYPERPARAMETERS]
    assert list(run.hyperparameters) == kept and run.hyperparameters_omitted == len(hp) - 64 == 11
    assert run.hyperparameters["a_long"] == "x" * provenance.VALUE_MAX
    assert run.hyperparameters["api_key"] == run.hyperparameters["hf_token"] == "[redacted]"
    assert run.hyperparameters["a_url"] == "https://acct.blob.core.windows.net/c/d?sv=2022&sig=[redacted]"
    assert run.hyperparameters["a_flag"] is False and run.hyperparameters["k000"] == 0
    assert "SIGSECRET" not in json.dumps(red.snapshot_run("h"))  # nor in the state kept


@pytest.mark.parametrize(("argv", "expected"), [
    (["train", "--token", "tok123456789"], "train --token [redacted]"),
    (["train", "--token=tok123456789"], "train --token=[redacted]"),
    (["train", "--out", "https://a.blob.core.windows.net/c?sp=rw&sig=SIG123"],
     "train --out 'https://a.blob.core.windows.net/c?sp=rw&sig=[redacted]'"),
    (["sh", "-c", "curl -H 'Authorization: Bearer abcdefghij' x"], "sh -c 'curl -H '\"'\"'Authorization: Bearer "
                                                                   "[redacted]'\"'\"' x'"),
])
def test_entrypoints_are_redacted_the_same_whether_read_slimmed_or_not(argv: list[str], expected: str) -> None:
    from tracker.core.redact import redact_argv
    assert provenance.join_argv(argv) == expected
    assert provenance.join_argv(redact_argv(argv)) == expected  # a slimmed object's argv: the same line


def test_an_entrypoint_and_an_image_are_bounded() -> None:
    images, entrypoint = provenance.workload("Job", {"template": {"spec": {"containers": [
        {"image": f"img{i}:{'t' * 600}", "command": ["x" * 5000]} for i in range(12)]}}})
    assert len(images) == provenance.MAX_IMAGES and {len(i) for i in images} == {provenance.IMAGE_MAX}
    assert entrypoint is not None and len(entrypoint) == provenance.ENTRYPOINT_MAX


def test_what_ran_survives_a_snapshot_and_an_older_snapshot_loads() -> None:
    events = [rendering("s", image="acr.io/r:1", hyperparameters={"lr": 0.1, "tag": "a", "flag": True, "n": None}),
              job("s", [{"name": "main", "image": "acr.io/t:1", "command": ["train", "--lr", "0.1"]}])]
    red = fold(events)
    before = red.history("s")
    snap = json.loads(json.dumps(red.snapshot_run("s")))
    again = Reducer()
    again.restore_run(snap)
    assert again.history("s") == before and before is not None and before.run.images == ["acr.io/t:1", "acr.io/r:1"]
    # a snapshot of a tracker before what ran: no workload in its facts, no such fields in its intake events
    del snap["facts"]["workload"]
    for event in snap["facts"]["intake"].values():
        for key in ("image", "hyperparameters", "hyperparameters_omitted"):
            event[3].pop(key, None)
    old = Reducer()
    old.restore_run(snap)
    run = run_of(old, "s")
    assert (run.images, run.entrypoint, run.hyperparameters) == ([], None, {})
    fold([{**events[1], "type": "MODIFIED"}], old)  # the root's next version gives them again
    assert run_of(old, "s").entrypoint == "train --lr 0.1"
