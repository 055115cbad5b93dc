"""Warm trial workers of the local runner, on CPU (gloo, one rank), with real Megatron-Core
trials: one worker runs trials one after another with the same metrics (and the same losses)
as a process per trial; a failed trial or a memory-baseline breach recycles it and the next
trial runs normally in a fresh one; a timeout and a stop kill the worker's whole process
group and leave no worker behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dse.core.records import Outcome, read_metrics
from dse.runners import Finished, Launch, LocalRunner
from dse.runners.warm import WarmSettings
from tests.workloads.test_megatron_trainer import make_spec, needs_megatron

pytestmark = [pytest.mark.slow, needs_megatron]

OWNER = "testhost:1:warmtest"


def _runner(root: Path, **kw: Any) -> LocalRunner:
    settings = WarmSettings(python=sys.executable, workdir=root, **kw)
    return LocalRunner(device="cpu", world_size=1, warm=settings)


def _launch(root: Path, tid: int, params: dict[str, Any], **kw: Any) -> Launch:
    d = root / f"trial-{tid:05d}"
    d.mkdir(parents=True)
    spec = make_spec(d, "metrics", params, semantics={"steps": 3})
    (d / "trial.json").write_text(spec.model_dump_json())
    return Launch(trial_id=tid, number=tid, argv=[sys.executable], trial_dir=d,
                  metrics_path=Path(spec.metrics_path), log_path=d / "log.txt", world_size=1,
                  device="cpu", env={"DSE_TRIAL_OWNER": OWNER}, spec=spec,
                  **{"timeout_s": 300.0, "hang_timeout_s": 200.0, **kw})  # fmt: skip


def _run(r: LocalRunner, launch: Launch, timeout: float = 240.0) -> Finished:
    r.submit(launch)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in r.poll():
            assert f.trial_id == launch.trial_id
            return f
        time.sleep(0.05)
    raise AssertionError(f"trial {launch.trial_id} did not finish")


def _events(root: Path) -> list[dict[str, Any]]:
    lines = (root / "workers" / "events.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _per_process(root: Path, params: dict[str, Any]) -> Outcome:
    """The same trial as a process of its own (the trainer's entry point)."""
    d = root / "alone"
    d.mkdir()
    spec = make_spec(d, "metrics", params, semantics={"steps": 3})
    (d / "trial.json").write_text(spec.model_dump_json())
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    subprocess.run([sys.executable, "-m", "dse.workloads.megatron.trainer", "--spec",
                    str(d / "trial.json")], cwd=d, env=env, capture_output=True, timeout=300,
                   check=True)  # fmt: skip
    out = read_metrics(spec.metrics_path)
    assert out is not None
    return out


def test_one_worker_many_trials_recycled_after_a_failure(tmp_path: Path) -> None:
    r = _runner(tmp_path)
    r.prepare(OWNER)
    try:
        a = _run(r, _launch(tmp_path, 1, {}))
        b = _run(r, _launch(tmp_path, 2, {"micro_batch_size": 2}))
        # Megatron refuses this one when it builds the model: a failed trial
        c = _run(r, _launch(tmp_path, 3, {"micro_batch_size": 2, "recompute": "no_such_mode"}))
        d = _run(r, _launch(tmp_path, 4, {"micro_batch_size": 4}))
    finally:
        r.close()
    assert a.outcome.ok and b.outcome.ok and d.outcome.ok, (a, b, d)
    assert not c.outcome.ok
    assert [f.worker["warm"] for f in (a, b, c, d)] == [True] * 4  # type: ignore[index]
    pids = [f.worker["pid"] for f in (a, b, c, d)]  # type: ignore[index]
    assert pids[0] == pids[1] == pids[2] != pids[3]  # recycled after the failure only
    assert [f.worker["trial_in_worker"] for f in (a, b, c, d)] == [1, 2, 3, 1]  # type: ignore[index]
    recycles = [e for e in _events(tmp_path) if e["event"] == "recycle"]
    assert [(e["pid"], e["why"]) for e in recycles] == [(pids[2], "the trial failed")]

    # the second trial of a warm worker is the trial a process of its own runs: the same
    # summary fields, the same per-step losses
    alone = _per_process(tmp_path, {"micro_batch_size": 2})
    # (a TFLOP/s interval is left out when the step-time interval reaches 0: it would be
    # unbounded; on a loaded CPU that depends on the run, not on where it ran)
    maybe = {"tflops_per_gpu_ci"}
    assert set(b.outcome.metrics) - maybe == set(alone.metrics) - maybe
    assert [s.loss for s in b.outcome.steps] == [s.loss for s in alone.steps]
    assert len(d.outcome.steps) == 3 and d.outcome.metrics["micro_batch_size"] == 4
    # the trial's own log has its output; its folder holds the worker's process group
    assert "trial spec" in (tmp_path / "trial-00002" / "log.txt").read_text()
    pg = json.loads((tmp_path / "trial-00004" / "pgid").read_text())
    assert pg == {"pgid": pids[3], "owner": OWNER}
    assert not any(_alive(p) for p in pids)  # close() ended the last worker


def test_memory_baseline_breach_recycles(tmp_path: Path) -> None:
    # a slack of 0 MiB: any growth of the resident set after a trial is a breach
    r = _runner(tmp_path, memory_slack_mib=0.0)
    try:
        a = _run(r, _launch(tmp_path, 1, {}))
        b = _run(r, _launch(tmp_path, 2, {}))
    finally:
        r.close()
    assert a.outcome.ok and b.outcome.ok
    assert a.worker["pid"] != b.worker["pid"]  # type: ignore[index]
    (rec,) = [e for e in _events(tmp_path) if e["event"] == "recycle"][:1]
    assert rec["why"].startswith("memory ") and "baseline" in rec["why"]
    assert [s.loss for s in a.outcome.steps] == [s.loss for s in b.outcome.steps]


def test_max_trials_recycles(tmp_path: Path) -> None:
    r = _runner(tmp_path, max_trials=1)
    try:
        a = _run(r, _launch(tmp_path, 1, {}))
        b = _run(r, _launch(tmp_path, 2, {"micro_batch_size": 2}))
    finally:
        r.close()
    assert a.outcome.ok and b.outcome.ok
    assert a.worker["pid"] != b.worker["pid"]  # type: ignore[index]
    whys = [e["why"] for e in _events(tmp_path) if e["event"] == "recycle"]
    assert whys[0] == "1 trials run (warm_max_trials)"


def test_timeout_and_stop_kill_the_worker_group(tmp_path: Path) -> None:
    r = _runner(tmp_path, spare=True)
    r.prepare(OWNER)
    # killed while the worker is still starting: classified, and the worker with it
    t = _run(r, _launch(tmp_path, 1, {}, timeout_s=1.0))
    assert t.outcome.failure_class == "timeout"
    first = t.worker["pid"] if t.worker and t.worker["pid"] else None
    spawned = [e["pid"] for e in _events(tmp_path) if e["event"] == "spawn"]
    # a long trial, stopped while it runs: its id comes back, no worker is left
    long = _launch(tmp_path, 2, {}, timeout_s=300.0)
    spec = json.loads((long.trial_dir / "trial.json").read_text())
    spec["semantics"]["steps"] = 10_000
    (long.trial_dir / "trial.json").write_text(json.dumps(spec))
    r.submit(long)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not long.metrics_path.exists():
        assert r.poll() == []
        time.sleep(0.1)
    assert long.metrics_path.exists()  # it is training
    pids = r.warm.pids()  # type: ignore[union-attr]
    assert len(pids) >= 1
    assert r.stop() == [2]
    assert r.running() == [] and r.warm.pids() == []  # type: ignore[union-attr]
    spawned += [e["pid"] for e in _events(tmp_path) if e["event"] == "spawn"]
    assert not any(_alive(p) for p in {*spawned, *pids, *([first] if first else [])})
    r.close()
