"""The controller anywhere: inside a Slurm job of its own (submitting its trials as jobs of
their own from there, the enclosing job's variables kept out of them), two such controllers on
one PostgreSQL study, and on the head of a Ray cluster as a Ray job (``ray job submit``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port
from tests.runners.conftest import job_state, replay_space, tiny_space, trials_of, wait_jobs

CONTROLLER_SCRIPT = REPO / "examples" / "slurm" / "controller.sbatch"


def _submit_controller(
    tmp_path: Path, space: Path, storage: str, *extra: str, runner: str | None = None
) -> str:
    """sbatch examples/slurm/controller.sbatch as its header says, from the space's folder."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # dse
        "DSE_SPACE": space.name,
        "DSE_STORAGE": storage,
    }
    if runner:
        env["DSE_RUNNER"] = runner
    r = subprocess.run(
        ["sbatch", "--parsable", *extra, str(CONTROLLER_SCRIPT)],
        cwd=space.parent, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return r.stdout.strip().split(";")[0]


def _replay_space(tmp_path: Path, study: str, n_trials: int, delay_s: float = 1.0) -> Path:
    """The replay study for a controller job (its workdir relative: the job's folder)."""
    return replay_space(tmp_path, study, n_trials=n_trials, delay_s=delay_s, workdir="runs",
                        options={"poll_interval_s": 0.5})  # fmt: skip


@pytest.mark.slurm
def test_trial_jobs_submitted_from_inside_a_job_do_not_inherit_its_variables(
    slurm: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    job = subprocess.run(
        ["sbatch", "--parsable", "--mem=1234", "--cpus-per-task=1", f"--chdir={REPO}",
         f"--output={tmp_path / 'driver.log'}", "--wrap",
         f"{sys.executable} -m tests.runners.slurm_job_driver {tmp_path}"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert wait_jobs([job], timeout=240) == ["COMPLETED"], (tmp_path / "driver.log").read_text()
    res = json.loads((tmp_path / "driver.json").read_text())
    assert res["ok"], res["reason"]
    assert res["placement"] == slurm
    outer = res["controller_job"]
    assert outer["SLURM_JOB_ID"] == job and outer["SLURM_MEM_PER_NODE"] == "1234"
    # the control shows the leak is real: sbatch passes the enclosing job's limits on
    assert res["control_job"].get("SLURM_MEM_PER_NODE") == "1234"
    # the trial's job has its own job id and CPUs, and none of the controller job's memory
    trial = res["trial"]
    assert trial["SLURM_JOB_ID"] != job
    assert "SLURM_MEM_PER_NODE" not in trial, trial
    assert trial["SLURM_CPUS_PER_TASK"] == "2"


@pytest.mark.slurm
@pytest.mark.slow
def test_controller_in_a_slurm_job_runs_the_tiny_cpu_study(slurm: str, tmp_path: Path) -> None:
    # no re-measures: a runner test (re-measures are the study tests' concern)
    p = tiny_space(tmp_path, name="slurm", workdir="runs",
                   options={"cpus_per_task": 2, "poll_interval_s": 1.0})  # fmt: skip
    job = _submit_controller(tmp_path, p, "sqlite:///dse.db")  # relative: the job's folder
    states = wait_jobs([job], timeout=900)
    log = (tmp_path / f"dse-controller-{job}.log").read_text()
    assert states == ["COMPLETED"], log
    assert f"dse controller: job {job} on {slurm} in {tmp_path}" in log
    trials = trials_of(f"sqlite:///{tmp_path / 'dse.db'}", "tiny-gpt-cpu")
    assert [t.state for t in trials] == ["complete", "complete"], [t.reason for t in trials]
    assert all(t.host == slurm and t.value and t.value > 0 for t in trials)
    # each trial ran in a job of its own, submitted from inside the controller's job
    runs = tmp_path / "runs" / "tiny-gpt-cpu"
    jobs = {(runs / f"trial-{t.number:05d}" / "slurm_job_id").read_text() for t in trials}
    assert len(jobs) == 2 and job not in jobs


@pytest.mark.slurm
def test_controller_job_with_the_local_runner_runs_trials_in_its_allocation(
    slurm: str, tmp_path: Path
) -> None:
    p = _replay_space(tmp_path, "slurm-local", n_trials=3)
    job = _submit_controller(tmp_path, p, "sqlite:///dse.db", "--cpus-per-task=2", runner="local")
    states = wait_jobs([job], timeout=300)
    log = (tmp_path / f"dse-controller-{job}.log").read_text()
    assert states == ["COMPLETED"], log
    trials = trials_of(f"sqlite:///{tmp_path / 'dse.db'}", "slurm-local")
    assert len(trials) == 3 and all(t.state in ("complete", "infeasible") for t in trials)
    assert all(t.host == slurm for t in trials)
    runs = tmp_path / "runs" / "slurm-local"
    assert not list(runs.glob("trial-*/slurm_job_id"))  # no job of their own: processes


@pytest.mark.slurm
@pytest.mark.postgres
def test_two_controller_jobs_share_one_postgres_study(
    slurm: str, tmp_path: Path, pg_url: str
) -> None:
    p = _replay_space(tmp_path, "slurm-two-jobs", n_trials=8)
    jobs = [_submit_controller(tmp_path, p, pg_url) for _ in range(2)]
    states = wait_jobs(jobs, timeout=400)
    logs = [(tmp_path / f"dse-controller-{j}.log").read_text() for j in jobs]
    assert states == ["COMPLETED", "COMPLETED"], logs
    trials = trials_of(pg_url, "slurm-two-jobs")
    assert sorted(t.number for t in trials) == list(range(8))  # the budget, no more
    assert len({t.params_key for t in trials}) == 8
    assert all(t.state in ("complete", "infeasible") for t in trials)
    owners = {t.runner.split(":")[1] for t in trials if t.runner}
    assert len(owners) == 2  # both controllers ran trials
    runs = tmp_path / "runs" / "slurm-two-jobs"
    trial_jobs = [(runs / f"trial-{t.number:05d}" / "slurm_job_id").read_text() for t in trials]
    assert len(set(trial_jobs)) == 8  # one job per trial
    assert not list(runs.glob("trial-*/metrics.*.jsonl.old"))  # no trial ran a second time
    assert all("done:" in log for log in logs)


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head of its own (4 CPUs, its job server on a free port), stopped by its own
    process (``ray start --block``), never by ``ray stop``."""
    port, dash = free_port(), free_port()
    # the head's agents on free ports too: Ray's fixed defaults (the job agent's 52365, ...)
    # may still be held by another Ray instance of the test run, and then the job agent
    # never registers ("No available agent to submit job")
    agents = [f"--dashboard-agent-listen-port={free_port()}",
              f"--dashboard-agent-grpc-port={free_port()}", f"--metrics-export-port={free_port()}",
              f"--runtime-env-agent-port={free_port()}"]  # fmt: skip
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
    log = open(tmp_path / "head.log", "wb")  # noqa: SIM115 - closed in the finally below
    head = subprocess.Popen(
        [*ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=4",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         "--disable-usage-stats", *agents],
        env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([*ray_cli, "job", "list", "--address", address], env=env,
                             capture_output=True).returncode != 0:  # fmt: skip
            assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray head's job server did not come up"
            time.sleep(1.0)
        yield address, env
    finally:
        head.send_signal(signal.SIGTERM)  # --block: it stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        log.close()
        # the head noted its address for local drivers; a dead one must not be joined
        note = Path(tempfile.gettempdir(), "ray", "ray_current_cluster")
        if note.exists() and note.read_text().strip().endswith(f":{port}"):
            note.unlink()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_controller_as_a_ray_job_on_the_head(
    ray_head: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    address, env = ray_head
    p = tiny_space(tmp_path, name="ray")  # no re-measures: a runner test
    url = f"sqlite:///{tmp_path / 'dse.db'}"
    # docs/clusters.md's command: the job runs the controller on the head, RAY_ADDRESS set to it
    argv = [sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", address,
            "--", sys.executable, "-m", "dse.cli", "start", "--space", str(p), "--storage", url,
            "--runner", "ray"]  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        # the job server answers before the head's job agent has registered (slow on a loaded
        # machine): Ray's own advice is to try again; nothing was submitted
        if "No available agent to submit job" not in r.stdout + r.stderr:
            break
        assert time.monotonic() < deadline, (
            "the Ray head's job agent did not come up: " + r.stdout[-1500:] + r.stderr[-1500:]
        )
        time.sleep(2.0)
    assert r.returncode == 0 and "succeeded" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr
    assert "study 'tiny-gpt-cpu': created" in r.stdout + r.stderr  # the job's own output
    trials = trials_of(url, "tiny-gpt-cpu")
    assert [t.state for t in trials] == ["complete", "complete"], [t.reason for t in trials]
    assert all(t.value and t.value > 0 and t.host for t in trials)
    # the trials went through the Ray runner of the head's cluster: a Ray task on a node of
    # it started each one and noted where
    for t in trials:
        assert (
            tmp_path / "runs" / "tiny-gpt-cpu" / f"trial-{t.number:05d}" / "placement.txt"
        ).exists()


@pytest.mark.slurm
def test_scancel_of_the_controller_job_cancels_its_trial_jobs_and_requeues(
    slurm: str, tmp_path: Path
) -> None:
    # trials that outlive the controller
    p = _replay_space(tmp_path, "slurm-ctl-cancel", n_trials=4, delay_s=30.0)
    job = _submit_controller(tmp_path, p, "sqlite:///dse.db")
    runs = tmp_path / "runs" / "slurm-ctl-cancel"
    deadline = time.monotonic() + 120
    while len(list(runs.glob("trial-*/placement.txt"))) < 2:  # two trial jobs running
        assert time.monotonic() < deadline and job_state(job) in ("PENDING", "RUNNING")
        time.sleep(0.5)
    trial_jobs = [f.read_text().strip() for f in runs.glob("trial-*/slurm_job_id")]
    subprocess.run(["scancel", job], check=True)
    assert wait_jobs([job], timeout=120) == ["CANCELLED"]
    log = (tmp_path / f"dse-controller-{job}.log").read_text()
    assert "2 running trial(s) killed and re-queued" in log, log
    assert {job_state(j) for j in trial_jobs} == {"CANCELLED"}
    trials = trials_of(f"sqlite:///{tmp_path / 'dse.db'}", "slurm-ctl-cancel")
    assert sorted(t.state for t in trials) == ["queued", "queued"]  # resumable as they were
