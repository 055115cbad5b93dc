"""The Ray runner against a real local Ray instance declaring 4 GPUs it does not have: trials
at once each see only their own CUDA_VISIBLE_DEVICES; stop leaves no trial process; a killed
trial is a classified failure; the tiny CPU study runs through Ray."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from dse.runners.ray_runner import RayOptions, RayRunner
from tests.conftest import REPO
from tests.runners.conftest import (
    alive,
    drain,
    make_launch,
    seen,
    tiny_space,
    trials_of,
    wait_seen,
    wait_until,
)

pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _gpu_runner(world: int) -> RayRunner:
    return RayRunner(RayOptions(), device="cuda", world_size=world, gpus_per_node=world)


@pytest.mark.parametrize(("world", "at_once"), [(1, 4), (2, 2)])
def test_trials_at_once_each_see_their_own_gpus(
    ray_cluster: None, tmp_path: Path, world: int, at_once: int
) -> None:
    r = _gpu_runner(world)
    assert r.free_slots() == at_once
    launches = [
        make_launch(tmp_path, i, 5.0, world_size=world, device="cuda") for i in range(at_once)
    ]
    for la in launches:
        r.submit(la)
    assert r.free_slots() == 0
    done = drain(r, at_once, timeout=120)
    assert all(f.outcome.ok for f in done.values()), [f.outcome for f in done.values()]
    notes = [seen(la)[0] for la in launches]
    devices = [n["cuda_visible_devices"].split(",") for n in notes]
    assert all(len(d) == world for d in devices), devices
    flat = [g for d in devices for g in d]
    assert len(set(flat)) == len(flat) == 4, devices  # disjoint, all four GPUs in use
    # all ran at once: each started before any finished
    ends = [json.loads(la.metrics_path.read_text())["end"] for la in launches]
    assert max(n["start"] for n in notes) < min(ends)
    for la in launches:  # placement recorded: host and GPUs
        assert done[la.trial_id].placement and ":gpu" in done[la.trial_id].placement
    _wait_slots(r, at_once)


def _wait_slots(r: RayRunner, n: int, timeout: float = 20.0) -> None:
    wait_until(
        lambda: r.free_slots() == n, timeout, lambda: f"{r.free_slots()} free slots, not {n}"
    )


def test_max_parallel_caps_the_slots(ray_cluster: None) -> None:
    r = RayRunner(RayOptions(), device="cuda", world_size=1, max_parallel=3)
    assert r.free_slots() == 3


def test_stop_leaves_no_trial_process(ray_cluster: None, tmp_path: Path) -> None:
    r = _gpu_runner(2)
    launches = [make_launch(tmp_path, i, 300, "--child", device="cuda") for i in range(2)]
    for la in launches:
        r.submit(la)
    notes = [wait_seen(la) for la in launches]
    pids = [n["pid"] for n in notes] + [n["child"] for n in notes]
    assert all(alive(p) for p in pids)
    assert sorted(r.stop()) == [0, 1]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)]
    assert r.running() == []
    _wait_slots(r, 2)  # Ray frees a removed placement group's resources soon after


def test_trial_killed_mid_run_is_recorded_failed(ray_cluster: None, tmp_path: Path) -> None:
    r = _gpu_runner(1)
    la = make_launch(tmp_path, 5, 300, device="cuda")
    r.submit(la)
    os.kill(wait_seen(la)["pid"], signal.SIGKILL)
    out = drain(r, 1, timeout=60)[5].outcome
    assert out.status == "failed" and out.failure_class == "error"
    assert "exited with signal SIGKILL without a result" in out.reason
    assert "trial program started" in out.reason  # the log's last lines


def test_trial_over_its_timeout_is_killed(ray_cluster: None, tmp_path: Path) -> None:
    r = _gpu_runner(1)
    la = make_launch(tmp_path, 6, 300, device="cuda", timeout_s=2.0)
    r.submit(la)
    pid = wait_seen(la)["pid"]
    out = drain(r, 1, timeout=60)[6].outcome
    assert out.failure_class == "timeout"
    assert not alive(pid)


@pytest.mark.parametrize(
    ("world", "per_node", "shape"),
    [(8, 8, "1 x CPU=1, GPU=8"), (4, 2, "2 x CPU=1, GPU=2")],  # a node too small; one node
)
def test_placement_group_the_cluster_can_never_hold_is_unschedulable(
    ray_cluster: None, tmp_path: Path, world: int, per_node: int, shape: str
) -> None:
    r = RayRunner(RayOptions(), device="cuda", world_size=world, gpus_per_node=per_node)
    assert r.free_slots() == 1  # let through to be recorded, never held back for ever
    la = make_launch(tmp_path, 7, 1.0, world_size=world, device="cuda")
    r.submit(la)
    out = drain(r, 1, timeout=60)[7].outcome
    assert out.failure_class == "unschedulable" and out.status == "infeasible", out
    assert "Ray's scheduling state: INFEASIBLE" in out.reason and shape in out.reason
    assert not seen(la) and r.running() == []  # nothing started, nothing left
    _wait_slots(r, 1)


def test_placement_group_waiting_past_the_queue_timeout_is_timeout(
    ray_cluster: None, tmp_path: Path
) -> None:
    r = RayRunner(RayOptions(queue_timeout_s=2), device="cuda", world_size=4, gpus_per_node=4)
    first = make_launch(tmp_path, 1, 60, world_size=4, device="cuda")
    r.submit(first)
    wait_seen(first)
    second = make_launch(tmp_path, 2, 1.0, world_size=4, device="cuda")
    r.submit(second)  # e.g. another controller's: it waits for the first one's GPUs
    try:
        out = drain(r, 1, timeout=60)[2].outcome
        assert r.running() == [1]  # the first one runs on
    finally:
        r.stop()
    assert out.failure_class == "timeout" and out.status == "failed", out
    assert "queue_timeout_s 2" in out.reason and "NO_RESOURCES" in out.reason
    assert not seen(second)


@pytest.mark.slow
def test_tiny_study_through_ray(ray_cluster: None, tmp_path: Path) -> None:
    from dse.cli.main import main

    p = tiny_space(tmp_path, remeasure=None, name="ray")  # the example's re-measures
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert main(["start", "--space", str(p), "--storage", url]) == 0
    trials = trials_of(url, "tiny-gpt-cpu")
    # the budget's two trials, and any re-measure of a tie (budget.remeasure) ran on Ray too
    primary = [t for t in trials if t.remeasure_of is None]
    assert [t.state for t in primary] == ["complete", "complete"], [t.reason for t in trials]
    assert all(t.state == "complete" for t in trials), [t.reason for t in trials]
    assert {t.remeasure_of for t in trials} - {None} <= {t.number for t in primary}
    assert all(t.value and t.value > 0 and t.host for t in trials)


@pytest.mark.slow
def test_trial_spread_over_two_ray_nodes(tmp_path: Path) -> None:
    """A 4-GPU trial over two nodes of 2 GPUs (a real two-raylet cluster joined by address):
    one bundle per node, each node's process with its own 2 GPUs and the same rendezvous."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-m", "tests.runners.ray_two_nodes"],
        cwd=REPO, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["ok"], res["reason"]
    assert res["capacity"] == 1
    assert len(set(res["bundle_nodes"])) == 2  # one bundle on each node
    assert len(res["seen"]) == 2
    assert all(len(s["cuda_visible_devices"].split(",")) == 2 for s in res["seen"])
    assert len({s["master_addr"] for s in res["seen"]}) == 1
