"""The Slurm runner against a real one-node Slurm (scripts/slurm_up.sh): jobs cancelled from
outside, over their time limit, on a node taken down, each come back as a classified failure
with the log's last lines; a study runs through sbatch end to end and resumes after its
controller is killed while its jobs are queued."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dse.runners import Launch
from dse.runners.slurm_runner import SlurmRunner
from tests.conftest import LOGS
from tests.runners.conftest import (
    drain,
    job_id,
    make_launch,
    replay_space,
    slurm_runner,
    tiny_space,
    trials_of,
    wait_idle,
    wait_seen,
)

pytestmark = pytest.mark.slurm


def test_job_on_a_node_that_goes_down_is_node_fail(slurm: str, tmp_path: Path) -> None:
    r = slurm_runner()
    launch = make_launch(tmp_path, 1, 120)
    r.submit(launch)
    wait_seen(launch)
    try:
        # drained: Slurm lets the running job go on; taken down: it ends the job (NODE_FAIL)
        subprocess.run(
            ["scontrol", "update", f"nodename={slurm}", "state=drain", "reason=dse-test"],
            check=True,
        )
        time.sleep(1.5)
        assert r.poll() == [] and r.running() == [1]
        subprocess.run(
            ["scontrol", "update", f"nodename={slurm}", "state=down", "reason=dse-test"],
            check=True,
        )
        out = drain(r, 1, timeout=60)[1].outcome
    finally:
        subprocess.run(["scontrol", "update", f"nodename={slurm}", "state=resume"], check=False)
        wait_idle(slurm)
    assert out.failure_class == "node_fail", out
    assert "NODE_FAIL" in out.reason and slurm in out.reason


@pytest.fixture(scope="module")
def overtime(slurm: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[SlurmRunner, Launch]:
    """A job over its time limit, submitted early: Slurm checks time limits about every 30 s
    (the job is ended by Slurm, not by the runner), so the test that waits for it runs last."""
    r = slurm_runner(time_limit="0:02")
    launch = make_launch(tmp_path_factory.mktemp("overtime"), 1, 300)
    r.submit(launch)
    return r, launch


def test_trial_completes_and_records_its_node(
    slurm: str, tmp_path: Path, overtime: tuple[SlurmRunner, Launch]
) -> None:
    r = slurm_runner()
    launch = make_launch(tmp_path, 1, 0.5)
    r.submit(launch)
    fin = drain(r, 1)[1]
    assert fin.outcome.ok, fin.outcome.reason
    assert fin.placement == slurm
    assert "#SBATCH --nodes=1" in (launch.trial_dir / "job.sbatch").read_text()


def test_failed_trial_keeps_the_logs_last_lines(slurm: str, tmp_path: Path) -> None:
    r = slurm_runner()
    r.submit(make_launch(tmp_path, 1, 0.1, "--fail"))
    out = drain(r, 1)[1].outcome
    assert out.failure_class == "error"
    assert "FAILED" in out.reason and "giving up with exit code 3" in out.reason


def test_scancel_from_outside_is_cancelled(slurm: str, tmp_path: Path) -> None:
    r = slurm_runner()
    launch = make_launch(tmp_path, 1, 120)
    r.submit(launch)
    wait_seen(launch)
    subprocess.run(["scancel", job_id(launch)], check=True)
    out = drain(r, 1, timeout=60)[1].outcome
    assert out.failure_class == "cancelled", out
    assert "ended CANCELLED" in out.reason and "Terminat" in out.reason  # the log's tail


def test_stop_cancels_every_job(slurm: str, tmp_path: Path) -> None:
    r = slurm_runner()
    launches = [make_launch(tmp_path, i, 120) for i in (1, 2)]
    for la in launches:
        r.submit(la)
    wait_seen(launches[0])
    assert sorted(r.stop()) == [1, 2]
    states = subprocess.run(
        ["squeue", "-h", "--states=all", "-j", ",".join(job_id(la) for la in launches),
         "-o", "%T"], capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert states and set(states) == {"CANCELLED"}, states


def test_study_resumes_after_its_controller_dies_with_jobs_queued(
    slurm: str, tmp_path: Path
) -> None:
    # each job takes 7 of the node's 8 CPUs: one runs, the next waits in the queue
    opts = {"cpus_per_task": 7, "poll_interval_s": 0.5}
    p = replay_space(tmp_path, "slurm-resume", options=opts)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    cmd = [sys.executable, "-m", "dse.cli", "start", "--space", str(p), "--storage", url]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=log)
    runs = tmp_path / "runs" / "slurm-resume"
    deadline = time.monotonic() + 120
    while len(list(runs.glob("trial-*/slurm_job_id"))) < 2:
        alive = first.poll() is None
        assert time.monotonic() < deadline and alive, (tmp_path / "first.log").read_text()
        time.sleep(0.2)
    old_jobs = [f.read_text().strip() for f in runs.glob("trial-*/slurm_job_id")]
    queued = subprocess.run(
        ["squeue", "-h", "-j", ",".join(old_jobs), "-o", "%T"], capture_output=True, text=True
    ).stdout.split()
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert "PENDING" in queued, queued
    resume = [sys.executable, "-m", "dse.cli", "resume", "--study", "slurm-resume",
              "--storage", url, "--runner", "slurm"]  # fmt: skip
    out = subprocess.run(resume, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "re-queued" in out.stderr
    trials = trials_of(url, "slurm-resume")
    assert sorted(t.number for t in trials) == [0, 1, 2, 3]
    assert all(t.state in ("complete", "infeasible") for t in trials), [
        (t.number, t.state, t.reason) for t in trials
    ]
    assert all(t.host == slurm for t in trials)
    # the dead controller's jobs were cancelled, not left to run beside their re-runs
    left = subprocess.run(
        ["squeue", "-h", "--states=all", "-j", ",".join(old_jobs), "-o", "%i %T"],
        capture_output=True, text=True,
    ).stdout.split("\n")  # fmt: skip
    assert not any(line.endswith(("RUNNING", "PENDING")) for line in left), left


@pytest.mark.postgres
def test_two_controllers_share_one_study_on_the_cluster(
    slurm: str, tmp_path: Path, pg_url: str
) -> None:
    p = replay_space(tmp_path, "slurm-two", n_trials=8, options={"poll_interval_s": 0.5})
    cmd = [sys.executable, "-m", "dse.cli", "start", "--space", str(p), "--storage", pg_url]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    logs = [pr.communicate(timeout=300)[1] for pr in procs]
    assert [pr.returncode for pr in procs] == [0, 0], logs
    trials = trials_of(pg_url, "slurm-two")
    assert sorted(t.number for t in trials) == list(range(8))
    assert len({t.params_key for t in trials}) == 8
    assert all(t.state in ("complete", "infeasible") for t in trials)
    assert len({t.runner.split(":")[1] for t in trials if t.runner}) == 2  # both ran trials
    jobs = {(tmp_path / "runs" / "slurm-two" / f"trial-{t.number:05d}" / "slurm_job_id")
            .read_text() for t in trials}  # fmt: skip
    assert len(jobs) == 8  # one Slurm job per trial


@pytest.mark.slow
def test_tiny_gpt_study_through_sbatch(slurm: str, tmp_path: Path) -> None:
    # no re-measures: a runner test (re-measures are the study tests' concern)
    p = tiny_space(tmp_path, name="slurm", options={"cpus_per_task": 2, "poll_interval_s": 1.0})
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = subprocess.run(
        [sys.executable, "-m", "dse.cli", "start", "--space", str(p), "--storage", url],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    trials = trials_of(url, "tiny-gpt-cpu")
    assert len(trials) == 2
    assert [t.state for t in trials] == ["complete", "complete"], [t.reason for t in trials]
    assert all(t.host == slurm and t.value and t.value > 0 for t in trials)
    script = (tmp_path / "runs" / "tiny-gpt-cpu" / "trial-00000" / "job.sbatch").read_text()
    assert "srun" in script and "--standalone" in script and "--nproc-per-node=2" in script


def test_job_over_its_time_limit_is_timeout(overtime: tuple[SlurmRunner, Launch]) -> None:
    r, _ = overtime
    out = drain(r, 1, timeout=150)[1].outcome
    assert out.failure_class == "timeout", out
    assert "ended TIMEOUT" in out.reason and "; log: " in out.reason


def test_recipe_trial_runs_under_the_batch_scripts_srun(slurm: str, tmp_path: Path) -> None:
    """A recipe launcher's trial through sbatch: the node step runs on the node first (and is
    skipped with a note where it is not permitted), srun starts the recipe's command, and dse's
    trial process reads its output into the metrics contract."""
    from dse.core.records import TrialSpec
    from dse.workloads import trial_command

    log = LOGS / "megatron_mixtral_16xh100.log"
    launch = make_launch(tmp_path, 1, 0)
    spec = TrialSpec(
        study="s", trial_number=1, params={"micro_batch_size": 1},
        model={"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "ffn_hidden_size": 14336, "vocab_size": 32000},
        semantics={"global_batch_size": 128, "seq_length": 4096, "steps": 100,
                   "warmup_steps": 1},
        world_size=1, device="cpu", metrics_path=str(launch.metrics_path),
        workload={"name": "megatron_lm", "rendered": {
            "launcher": "megatron_lm", "argv": ["sh", "-c", f"cat {log}; echo rank ${{DSE_R}}"],
            "env": {"DSE_R": "0"}, "log_format": "auto", "world_size": 1,
            "node_step_names": ["vboost"],
            "node_steps": [["nvidia-smi", "boost-slider", "--vboost", "1"]],
        }},
    )  # fmt: skip
    (launch.trial_dir / "trial.json").write_text(spec.model_dump_json())
    argv = trial_command("megatron_lm", str(launch.trial_dir / "trial.json"), world_size=1)
    launch = dataclasses.replace(launch, argv=argv, spec=spec, env={"DSE_R": "0"})
    r = slurm_runner()
    r.submit(launch)
    fin = drain(r, 1)[1]
    assert fin.outcome.ok, fin.outcome.reason
    m = fin.outcome.metrics
    # dse's own model FLOPs over the logged step time (one GPU here); the log's figure beside it
    assert m["tflops_per_gpu"] == pytest.approx(m["model_flops_per_step"] / (5.4707 * 1e12))
    assert m["tflops_per_gpu_log"] == pytest.approx(238.7) and m["tflops_source"] == "computed"
    assert fin.placement == slurm
    text = launch.log_path.read_text()
    assert "dse: node step vboost not permitted here; skipped" in text
    assert "rank 0" in text  # the environment reached the recipe through srun
    script = (launch.trial_dir / "job.sbatch").read_text()
    assert "--node-steps-done -- \\\n  srun --nodes=1" in script


def test_a_node_without_the_controllers_interpreter_fails_the_trial_naming_it(
    slurm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runner.python`` unset: the batch script runs the controller's own interpreter, which
    a node sees only over a shared file system; where the node lacks it, the trial stops at
    once, naming the path and ``runner.python`` (not a bare "No such file")."""
    from dse.runners import slurm_runner as mod

    gone = str(tmp_path / "venv-not-on-the-node" / "bin" / "python3")
    monkeypatch.setattr(mod.sys, "executable", gone)  # the controller's, elsewhere
    launch = make_launch(tmp_path, 1, 0)
    launch = dataclasses.replace(launch, argv=[gone, *launch.argv[1:]])
    r = slurm_runner()
    r.submit(launch)
    fin = drain(r, 1)[1]
    assert not fin.outcome.ok
    log = launch.log_path.read_text()
    assert f"the trial's interpreter {gone} (the controller's own; runner.python" in log, log
    assert f"is not on {slurm}" in log, log
    assert "runner.python unset" in (launch.trial_dir / "job.sbatch").read_text()
    # runner.python names the nodes' interpreter: the script trusts it, no check is written
    named = dataclasses.replace(launch, argv=["/opt/venv/bin/python", *launch.argv[1:]])
    shape = mod.trial_shape(1, "cpu", None)
    script = mod.render_batch_script(named, r.opts, shape, job_name="j")
    assert "runner.python unset" not in script and "/opt/venv/bin/python" in script
