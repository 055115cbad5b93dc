"""Jobs the real one-node Slurm can never start (scripts/slurm_up.sh): sbatch's refusal, a
pending reason that never clears, a job pending past the queue timeout. Each is cancelled and
recorded as a classified failure with Slurm's own words, never an exception or a hang; a job
the cluster can never start is ``unschedulable`` (the agent learns: infeasible here)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from dse.core.records import INFEASIBLE_CLASSES
from dse.runners.slurm_runner import pending_class, submission_env
from tests.runners.conftest import (
    drain,
    job_id,
    job_state,
    make_launch,
    queue_listing,
    replay_space,
    slurm_runner,
    trials_of,
    wait_idle,
    wait_node_free,
    wait_until,
)

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize(
    ("device", "opts", "words"),
    [
        ("cpu", {"sbatch_args": ["--mem=999999999"]}, "node configuration is not available"),
        ("cuda", {}, "Invalid generic resource (gres) specification"),  # GPUs on a CPU node
        ("cpu", {"sbatch_args": ["--constraint=nvlink-h200"]}, "Invalid feature specification"),
    ],
)  # fmt: skip
def test_sbatch_refusal_is_an_unschedulable_trial(
    slurm: str, tmp_path: Path, device: str, opts: dict, words: str
) -> None:
    r = slurm_runner(device, **opts)
    launch = make_launch(tmp_path, 1, 0.1, device=device)
    r.submit(launch)  # no exception: the refusal is the trial's outcome
    assert r.running() == [] and r.free_slots() == 4
    fin = drain(r, 1, timeout=10)[1]
    out = fin.outcome
    assert out.failure_class == "unschedulable" and out.status == "infeasible", out
    assert "sbatch refused the job" in out.reason and words in out.reason
    assert not (launch.trial_dir / "slurm_job_id").exists()  # nothing was queued


@pytest.mark.parametrize(
    ("opts", "codes"),
    [
        # more nodes than the partition has (Slurm says one or the other first)
        ({"sbatch_args": ["--nodes=2"]}, ("PartitionNodeLimit", "PartitionConfig")),
        ({"cpus_per_task": 64}, ("PartitionConfig",)),  # more CPUs than any node of it
    ],
)
def test_job_that_can_never_start_is_cancelled_at_once(
    slurm: str, tmp_path: Path, opts: dict, codes: tuple[str, ...]
) -> None:
    r = slurm_runner(**opts)  # no queue timeout: Slurm's reason alone says it never starts
    launch = make_launch(tmp_path, 1, 0.1)
    r.submit(launch)
    job = job_id(launch)
    out = drain(r, 1, timeout=60)[1].outcome
    assert out.failure_class == "unschedulable", out
    assert any(f"Slurm's reason: {c};" in out.reason for c in codes), out.reason
    assert "can never start" in out.reason
    assert job_state(job) == "CANCELLED"  # scancel'ed, not left in the queue
    assert r.running() == []


def test_job_pending_past_the_queue_timeout_on_a_busy_node_is_timeout(
    slurm: str, tmp_path: Path
) -> None:
    # another user's job holds every CPU of the node: the trial's job waits for Resources
    wait_node_free(slurm)  # the earlier tests' jobs are gone, so the blocker can take it all
    blocker = subprocess.run(
        ["sbatch", "--parsable", "--cpus-per-task=8", "--job-name=dse-test-blocker",
         f"--output={tmp_path / 'blocker.out'}", "--wrap", "sleep 120"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        wait_until(
            lambda: job_state(blocker) == "RUNNING",
            120,
            lambda: f"blocker did not start: {job_state(blocker)}; {queue_listing()}",
        )
        r = slurm_runner(queue_timeout_s=4)
        launch = make_launch(tmp_path, 1, 0.1)
        r.submit(launch)
        job = job_id(launch)
        t0 = time.monotonic()
        out = drain(r, 1, timeout=60)[1].outcome
        assert time.monotonic() - t0 >= 3.5  # it waited its queue timeout first
    finally:
        subprocess.run(["scancel", blocker], check=False)
    # the cluster was busy: a failure, not an infeasible configuration
    assert out.failure_class == "timeout" and out.status == "failed", out
    assert "queue_timeout_s 4" in out.reason
    assert "Slurm's reason: Resources" in out.reason or "Slurm's reason: Priority" in out.reason
    assert job_state(job) == "CANCELLED"


def test_job_whose_nodes_are_unavailable_past_the_queue_timeout_is_unschedulable(
    slurm: str, tmp_path: Path
) -> None:
    subprocess.run(
        ["scontrol", "update", f"nodename={slurm}", "state=drain", "reason=dse-test"], check=True
    )
    try:
        r = slurm_runner(queue_timeout_s=3, sbatch_args=[f"--nodelist={slurm}"])
        r.submit(make_launch(tmp_path, 1, 0.1))
        out = drain(r, 1, timeout=60)[1].outcome
    finally:
        subprocess.run(["scontrol", "update", f"nodename={slurm}", "state=resume"], check=False)
        wait_idle(slurm)
    assert out.failure_class == "unschedulable", out
    assert "Slurm's reason: ReqNodeNotAvail" in out.reason


@pytest.mark.parametrize(
    ("reason", "timed_out", "cls"),
    [
        ("PartitionNodeLimit", False, "unschedulable"),
        ("QOSMaxGRESPerJob", False, "unschedulable"),
        ("AssocMaxNodesPerJobLimit", False, "unschedulable"),
        ("QOSMaxJobsPerUserLimit", False, None),  # clears when the user's jobs end
        ("Resources", False, None),
        ("Resources", True, "timeout"),
        ("Priority", True, "timeout"),
        ("ReqNodeNotAvail, UnavailableNodes:n1", False, None),  # a drained node may return
        ("ReqNodeNotAvail, UnavailableNodes:n1", True, "unschedulable"),
    ],
)
def test_pending_reasons_map_to_classes(reason: str, timed_out: bool, cls: str | None) -> None:
    assert pending_class(reason, timed_out=timed_out) == cls
    assert "unschedulable" in INFEASIBLE_CLASSES and "timeout" not in INFEASIBLE_CLASSES


def test_the_enclosing_jobs_variables_are_kept_from_the_trial_jobs() -> None:
    outer = {"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "7",
             "SLURM_MEM_PER_NODE": "1234", "SLURM_CPUS_PER_TASK": "1", "SRUN_CPUS_PER_TASK": "1",
             "SBATCH_PARTITION": "batch"}  # fmt: skip
    assert submission_env(outer) == {
        "PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf", "SBATCH_PARTITION": "batch"
    }  # fmt: skip
    login = {"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf", "SLURM_TIME_FORMAT": "relative"}
    assert submission_env(login) == login  # outside a job: as it is


def test_a_study_whose_jobs_are_refused_completes_with_infeasible_trials(
    slurm: str, tmp_path: Path
) -> None:
    p = replay_space(
        tmp_path, "slurm-refused", n_trials=3, delay_s=0.1, timeout_s=60,
        options={"poll_interval_s": 0.5, "sbatch_args": ["--mem=999999999"]},
    )  # fmt: skip
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = subprocess.run(
        [sys.executable, "-m", "dse.cli", "start", "--space", str(p), "--storage", url],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    trials = trials_of(url, "slurm-refused")
    assert len(trials) == 3
    assert {(t.state, t.failure_class) for t in trials} == {("infeasible", "unschedulable")}
    assert all("Requested node configuration is not available" in (t.reason or "")
               for t in trials)  # fmt: skip
