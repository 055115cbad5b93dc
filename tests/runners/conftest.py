"""A real one-node Slurm (scripts/slurm_up.sh) and a real local Ray instance for the runner
tests, and the helpers they share: trials launched and drained, Slurm jobs and nodes waited
for, space files written, a study's trials read back."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.core.records import TrialRecord
from dse.runners import BaseRunner, Finished, Launch
from dse.runners.slurm_runner import SlurmOptions, SlurmRunner
from dse.storage import open_storage
from tests.conftest import EXAMPLES, REPLAY_TABLE, REPO, require_part

TRIAL_PROGRAM = Path(__file__).with_name("trial_program.py")
SLURM_DIR = os.environ.get("DSE_SLURM_DIR", "/tmp/dse-slurm")


@pytest.fixture(scope="session")
def slurm() -> Iterator[str]:
    """Starts (or finds) the one-node Slurm; yields the node's name. Without root and without
    a running test Slurm the tests are skipped naming Slurm (failed under ``CI``)."""
    conf = Path(SLURM_DIR, "slurm.conf")
    try:
        found = conf.exists()
    except OSError as e:  # a folder on the way this user may not enter
        found = False
        why = f"cannot read {conf} ({e.strerror})"
    else:
        why = f"no test Slurm at {SLURM_DIR}"
    if os.geteuid() != 0 and not found:
        require_part("Slurm", f"{why} and starting one needs root (scripts/slurm_up.sh)")
    env = {**os.environ, "DSE_SLURM_DIR": SLURM_DIR}
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm_up.sh")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if r.returncode != 0:
        require_part(
            "Slurm", f"scripts/slurm_up.sh failed: {(r.stdout + r.stderr).strip()[-2000:]}"
        )
    os.environ["SLURM_CONF"] = str(conf)
    node = subprocess.run(
        ["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    yield node


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray instance declaring 4 GPUs it does not have (Ray still hands them out).
    Without the ``ray`` package the tests are skipped naming Ray (failed under ``CI``)."""
    if importlib.util.find_spec("ray") is None:
        require_part("Ray", "the ray package is not installed (pip install -e '.[ray]')")
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


def wait_until(check: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    """Polls ``check`` until it holds; fails with ``what()`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what()
        time.sleep(0.2)


# --- Slurm --------------------------------------------------------------------------------

#: The states of a Slurm job that has ended.
JOB_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def slurm_runner(device: str = "cpu", world: int = 1, **opts: object) -> SlurmRunner:
    """A Slurm runner of the tests' jobs (prefix ``dse-test``, 4 at once, polled every 0.5 s)."""
    return SlurmRunner(
        SlurmOptions.model_validate({"poll_interval_s": 0.5, **opts}),
        device=device,
        world_size=world,
        gpus_per_node=world,
        max_parallel=4,
        job_prefix="dse-test",
    )


def job_id(launch: Launch) -> str:
    """The Slurm job of a trial the Slurm runner submitted."""
    return (launch.trial_dir / "slurm_job_id").read_text().strip()


def job_state(job: str) -> str:
    """A Slurm job's state (``PENDING``, ``RUNNING``, ``COMPLETED``, ...; "" when Slurm no
    longer knows it)."""
    return subprocess.run(
        ["squeue", "-h", "--states=all", "-j", job, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def wait_jobs(jobs: list[str], timeout: float) -> list[str]:
    """The end states of Slurm ``jobs`` once all ended (cancelled and failed after
    ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        states = [job_state(j) for j in jobs]
        if all(s in JOB_ENDED for s in states):
            return states
        if time.monotonic() > deadline:
            subprocess.run(["scancel", *jobs], check=False)
            raise AssertionError(f"job(s) {jobs} did not end in time: {states}")
        time.sleep(1.0)


def node_state(node: str) -> str:
    return subprocess.run(
        ["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def wait_idle(node: str, timeout: float = 60) -> None:
    """Waits until the Slurm node takes jobs again (after a drain or down)."""
    wait_until(
        lambda: node_state(node) in ("idle", "mixed", "allocated"),
        timeout,
        lambda: f"node {node} did not come back: {node_state(node)}",
    )


# --- studies ------------------------------------------------------------------------------


def queue_listing() -> str:
    """Slurm's queue, one ``id state name reason`` line per job (for failure messages)."""
    return subprocess.run(
        ["squeue", "-h", "-o", "%i %T %j %r"], capture_output=True, text=True
    ).stdout.strip()


def wait_node_free(node: str, timeout: float = 120) -> None:
    """Waits until no job holds any CPU of the Slurm node: earlier tests' jobs, cancelled
    or ending, may still be completing when the next test wants the whole node."""

    def free() -> bool:
        jobs = subprocess.run(
            ["squeue", "-h", "-w", node, "-o", "%i %T"], capture_output=True, text=True
        ).stdout.strip()
        return not jobs and node_state(node) == "idle"

    wait_until(
        free,
        timeout,
        lambda: f"node {node} still busy: {node_state(node)}; {queue_listing()}",
    )


def write_space(path: Path, space: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(space))
    return path


def replay_space(
    folder: Path, study: str, *, n_trials: int = 4, delay_s: float = 1.0, timeout_s: int = 120,
    **runner: object,
) -> Path:  # fmt: skip
    """``folder/<study>.yaml``: the replay study of the measured table, without prescreen,
    on the Slurm runner (2 at once, its workdir ``folder/runs``; ``runner`` adds or
    replaces runner fields)."""
    space = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    space["study"] = study
    space["workload"] = {"name": "replay", "table": str(REPLAY_TABLE), "delay_s": delay_s}
    space["budget"] = {"n_trials": n_trials, "trial_timeout_s": timeout_s,
                       "hang_timeout_s": timeout_s}  # fmt: skip
    space["prescreen"] = {"enabled": False}
    space["runner"] = {
        "name": "slurm", "max_parallel": 2, "workdir": str(folder / "runs"), **runner,
    }  # fmt: skip
    return write_space(folder / f"{study}.yaml", space)


def tiny_space(folder: Path, *, remeasure: int | None = 0, **runner: object) -> Path:
    """``folder/tiny.yaml``: the tiny CPU GPT study (examples/tiny_gpt_cpu.yaml) with a budget
    of two trials and ``remeasure`` re-measures (None: the example's), on ``runner`` (2 at
    once, its workdir ``folder/runs``, unless ``runner`` says otherwise)."""
    space = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    space["budget"]["n_trials"] = 2
    if remeasure is not None:
        space["budget"]["remeasure"] = remeasure
    space["runner"] = {"max_parallel": 2, "workdir": str(folder / "runs"), **runner}
    return write_space(folder / "tiny.yaml", space)


def trials_of(url: str, study: str) -> list[TrialRecord]:
    """The trials of ``study`` in the database at ``url``, by number."""
    with open_storage(url) as st:
        return st.list_trials(st.get_study(study).id)
