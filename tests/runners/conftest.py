"""A real one-node Slurm (scripts/slurm_up.sh) and a real local Ray instance for the runner
tests, and a helper that drives a runner until its trials finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dse.workloads.runners import BaseRunner, Finished, Launch
from tests.conftest import REPO

TRIAL_PROGRAM = Path(__file__).with_name("trial_program.py")
SLURM_DIR = os.environ.get("DSE_SLURM_DIR", "/tmp/dse-slurm")


@pytest.fixture(scope="session")
def slurm() -> Iterator[str]:
    """Starts (or finds) the one-node Slurm; yields the node's name."""
    if os.geteuid() != 0 and not Path(SLURM_DIR, "slurm.conf").exists():
        pytest.skip("starting the test Slurm needs root (scripts/slurm_up.sh)")
    env = {**os.environ, "DSE_SLURM_DIR": SLURM_DIR}
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm_up.sh")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, f"slurm_up.sh failed: {r.stdout}\n{r.stderr}"
    os.environ["SLURM_CONF"] = f"{SLURM_DIR}/slurm.conf"
    node = subprocess.run(
        ["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    yield node


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray instance declaring 4 GPUs it does not have (Ray still hands them out)."""
    import ray

    # address="local": a new instance, never a cluster another test (or user) started here
    ray.init(address="local", num_cpus=8, num_gpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def make_launch(
    tmp: Path, tid: int, seconds: float, *extra: str, world_size: int = 1, device: str = "cpu",
    timeout_s: float = 300.0, hang_timeout_s: float = 300.0,
) -> Launch:  # fmt: skip
    tdir = tmp / f"trial-{tid:05d}"
    tdir.mkdir(parents=True, exist_ok=True)
    metrics = tdir / "metrics.jsonl"
    return Launch(
        trial_id=tid,
        number=tid,
        argv=[sys.executable, str(TRIAL_PROGRAM), str(metrics), str(seconds), *extra],
        trial_dir=tdir,
        metrics_path=metrics,
        log_path=tdir / "log.txt",
        world_size=world_size,
        device=device,
        timeout_s=timeout_s,
        hang_timeout_s=hang_timeout_s,
    )


def seen(launch: Launch) -> list[dict]:
    """What the trial program noted about where it ran (one entry per process)."""
    return [json.loads(p.read_text()) for p in sorted(launch.trial_dir.glob("seen.*.json"))]


def wait_seen(launch: Launch, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = seen(launch)
        if got:
            return got[0]
        time.sleep(0.2)
    raise AssertionError(f"trial {launch.number} did not start: {launch.log_path}")


def drain(runner: BaseRunner, n: int, timeout: float = 180.0) -> dict[int, Finished]:
    """Polls ``runner`` until ``n`` trials finished."""
    done: dict[int, Finished] = {}
    deadline = time.monotonic() + timeout
    while len(done) < n:
        assert time.monotonic() < deadline, f"only {len(done)}/{n} trials finished in time"
        for f in runner.poll():
            done[f.trial_id] = f
        time.sleep(0.2)
    return done


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
