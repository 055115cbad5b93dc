"""A trial's whole process tree ends on every path of the local runner: torchrun (real, 2 CPU
ranks) starts each worker in a session of its own, so a signal to the trial's process group
misses them, and a torchrun killed leaves them running. SIGKILL of torchrun mid-trial, the
runner's stop, a timeout and a dead controller's leftovers (resume) are tried; no worker may
be alive after the runner's clean-up."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from dse.runners import Launch
from dse.runners.local import LocalRunner
from dse.workloads.procgroup import OWNER_ENV

#: A rank: notes its pid and session, then sleeps (a trial mid-step).
WORKER = """
import os, sys, time
from pathlib import Path
d = Path(sys.argv[1])
(d / f"worker.{os.environ['RANK']}").write_text(f"{os.getpid()} {os.getsid(0)}")
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def _launch(tmp_path: Path, timeout_s: float = 600.0) -> Launch:
    tdir = tmp_path / "trial-00000"
    tdir.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node=2", str(script), str(tdir)]  # fmt: skip
    return Launch(
        trial_id=1, number=0, argv=argv, trial_dir=tdir, metrics_path=tdir / "metrics.jsonl",
        log_path=tdir / "log.txt", world_size=2, device="cpu", timeout_s=timeout_s,
        env={OWNER_ENV: "owner-1"},
    )  # fmt: skip


def _workers(launch: Launch, timeout: float = 120.0) -> list[tuple[int, int]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = sorted(launch.trial_dir.glob("worker.*"))
        if len(files) == 2 and all(f.read_text() for f in files):
            return [tuple(map(int, f.read_text().split())) for f in files]  # type: ignore[misc]
        time.sleep(0.2)
    raise AssertionError(f"the workers did not start: {launch.log_path.read_text()[-2000:]}")


def _drain(runner: LocalRunner, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while runner.running():
        assert time.monotonic() < deadline, "the trial did not end"
        runner.poll()
        time.sleep(0.1)


@pytest.mark.parametrize("path", ["torchrun_killed", "stop", "timeout", "leftover"])
def test_no_worker_outlives_the_trial(tmp_path: Path, path: str) -> None:
    launch = _launch(tmp_path, timeout_s=600.0 if path != "timeout" else 1.0)
    runner = LocalRunner(device="cpu", world_size=2)
    runner.submit(launch)
    pids = []
    try:
        workers = _workers(launch)
        pids = [pid for pid, _ in workers]
        torchrun = runner._procs[1].popen.pid
        # torchrun starts each worker in a session of its own, away from the trial's group
        assert all(sid != os.getsid(torchrun) for _, sid in workers)
        if path == "torchrun_killed":
            os.kill(torchrun, signal.SIGKILL)
            _drain(runner)
        elif path == "stop":
            assert runner.stop() == [1]
        elif path == "timeout":
            _drain(runner)
        else:  # the controller died; a resumed one ends what it left
            os.kill(torchrun, signal.SIGKILL)
            runner._procs[1].popen.wait()
            data = json.loads((launch.trial_dir / "pgid").read_text())
            assert data["owner"] == "owner-1" and data["tag"]
            fresh = LocalRunner(device="cpu", world_size=2)
            assert fresh.kill_leftover(launch.trial_dir, "owner-1")
            runner._procs.pop(1).log.close()  # type: ignore[attr-defined]
        left = [p for p in pids if _alive(p)]
        assert left == [], f"{path}: workers {left} outlived the trial"
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if runner.running():
            runner.stop()


def test_a_leftover_of_another_owner_is_not_touched(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    runner = LocalRunner(device="cpu", world_size=2)
    runner.submit(launch)
    try:
        pids = [pid for pid, _ in _workers(launch)]
        assert not LocalRunner(device="cpu", world_size=2).kill_leftover(
            launch.trial_dir, "someone-else"
        )
        assert all(_alive(p) for p in pids)
    finally:
        runner.stop()


#: A rank as the built-in trainer behaves: rank 0 writes a step, then, stopped by SIGTERM,
#: an ``interrupted`` line (dse.workloads.megatron.trainer.run_spec).
TRAINER_LIKE = """
import os, signal, sys, time
from pathlib import Path
from dse.core.records import MetricsWriter, StepMetrics
d = Path(sys.argv[1])
rank = int(os.environ["RANK"])
w = MetricsWriter(d / "metrics.jsonl")
def stop(signum, frame):
    if rank == 0:
        w.failure("interrupted", "stopped by SIGTERM before the trial ended (a runner's stop, "
                  "a scheduler's preemption or time limit, or Ctrl-C)")
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)
if rank == 0:
    w.step(StepMetrics(0, 1.0, 1.0, 1.0, 1.0, 5.0))
(d / f"worker.{rank}").write_text(f"{os.getpid()} {os.getsid(0)}")
time.sleep(600)
"""


def test_a_killed_torchrun_is_recorded_as_killed(tmp_path: Path) -> None:
    """SIGKILL of torchrun (not dse's doing): the runner ends its ranks with SIGTERM, and
    rank 0 writes that it was stopped by SIGTERM; the record says what happened."""
    launch = _launch(tmp_path)
    (tmp_path / "worker.py").write_text(TRAINER_LIKE)
    runner = LocalRunner(device="cpu", world_size=2)
    runner.submit(launch)
    pids: list[int] = []
    try:
        pids = [pid for pid, _ in _workers(launch)]
        os.kill(runner._procs[1].popen.pid, signal.SIGKILL)
        done = []
        deadline = time.monotonic() + 120
        while not done:
            assert time.monotonic() < deadline, "the trial did not end"
            done = runner.poll()
            time.sleep(0.1)
        out = done[0].outcome
        assert out.failure_class in ("cancelled", "error"), out.reason
        assert (out.reason or "").startswith(
            "the trial's process (torchrun) was killed by SIGKILL"
        ), out.reason
        assert "a runner's stop" not in (out.reason or "")
        if out.failure_class == "cancelled":  # rank 0 wrote its line in time: its step kept
            assert len(out.steps) == 1 and "not by dse" in (out.reason or "")
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if runner.running():
            runner.stop()
