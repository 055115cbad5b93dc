"""Golden files of rendered Slurm batch scripts (multi-node and GPU launches cannot run here):
one node on CPU, 2 nodes x 8 GPUs in a pyxis container, 8 nodes x 8 GPUs. Regenerate with
DSE_UPDATE_GOLDEN=1 after a deliberate change, and read the diff."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from dse.core.bounds import MAX_DURATION_S
from dse.runners import Launch
from dse.runners._cluster import rendezvous_argv, trial_shape
from dse.runners.slurm_runner import (
    SlurmOptions,
    failure_class_of_state,
    render_batch_script,
)
from dse.workloads import trial_command

GOLDEN = Path(__file__).with_name("golden")
WORKDIR = Path("/shared/dse_runs/llama3-8b")


def _launch(world: int, device: str, number: int = 7) -> Launch:
    tdir = WORKDIR / f"trial-{number:05d}"
    argv = trial_command(
        "megatron", str(tdir / "trial.json"), world_size=world, python="/opt/venv/bin/python"
    )
    return Launch(
        trial_id=number + 100,
        number=number,
        argv=argv,
        trial_dir=tdir,
        metrics_path=tdir / "metrics.jsonl",
        log_path=tdir / "log.txt",
        world_size=world,
        device=device,
        timeout_s=1800,
    )


CASES = {
    "single_node_cpu": (
        _launch(2, "cpu"),
        SlurmOptions(),
        None,
    ),
    "two_nodes_8gpu_container": (
        _launch(16, "cuda"),
        SlurmOptions(
            partition="batch",
            account="llm-perf",
            time_limit="00:45:00",
            container_image="nvcr.io/nvidia/nemo:25.09",
            container_mounts=["/lustre/datasets:/data"],
            env={"NCCL_DEBUG": "WARN", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
            sbatch_args=["--reservation=perf"],
        ),
        8,
    ),
    "eight_nodes_8gpu": (
        _launch(64, "cuda"),
        SlurmOptions(partition="batch", account="llm-perf", srun_args=["--mpi=none"]),
        8,
    ),
}


def _render(name: str) -> str:
    launch, opts, gpn = CASES[name]
    shape = trial_shape(launch.world_size, launch.device, gpn)
    return render_batch_script(
        launch, opts, shape, job_name=f"dse-llama3-8b-{launch.number}", workdir=WORKDIR
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_script_matches_golden(name: str) -> None:
    text = _render(name)
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("DSE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    # and it is a valid bash script as written
    r = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_multi_node_scripts_take_the_rendezvous_from_the_allocation() -> None:
    two = _render("two_nodes_8gpu_container")
    assert "#SBATCH --nodes=2" in two and "#SBATCH --gpus-per-node=8" in two
    assert "#SBATCH --exclusive" in two
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in two
    assert '--rdzv-endpoint="$MASTER_ADDR":"$MASTER_PORT"' in two
    assert "--nnodes=2 --nproc-per-node=8" in two and "--standalone" not in two
    assert "--container-image=nvcr.io/nvidia/nemo:25.09" in two
    assert f"--container-mounts={WORKDIR}:{WORKDIR},/lustre/datasets:/data" in two
    eight = _render("eight_nodes_8gpu")
    assert "#SBATCH --nodes=8" in eight and "--nnodes=8 --nproc-per-node=8" in eight
    assert "container" not in eight
    one = _render("single_node_cpu")
    assert "--standalone --nproc-per-node=2" in one and "--gpus-per-node" not in one
    assert "--exclusive" not in one  # CPU trials share the node unless asked


def test_rendezvous_argv_leaves_other_commands_alone() -> None:
    argv = ["python", "-m", "dse.workloads.replay", "--spec", "t.json"]
    shape = trial_shape(16, "cuda", 8)
    assert rendezvous_argv(argv, shape, master_addr="a", master_port="1", run_id="r") == argv


def test_world_not_filling_whole_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of gpus_per_node 8"):
        trial_shape(12, "cuda", 8)


@pytest.mark.parametrize(
    ("state", "cls"),
    [
        ("TIMEOUT", "timeout"),
        ("NODE_FAIL", "node_fail"),
        ("PREEMPTED", "preempted"),
        ("CANCELLED by 0", "cancelled"),
        ("CANCELLED+", "cancelled"),
        ("OUT_OF_MEMORY", "oom"),
        ("BOOT_FAIL", "node_fail"),
        ("FAILED", None),
        ("COMPLETED", None),
    ],
)
def test_job_states_map_to_failure_classes(state: str, cls: str | None) -> None:
    assert failure_class_of_state(state) == cls


def test_the_longest_trial_timeout_is_a_time_limit_slurm_reads() -> None:
    """A trial's --time is its timeout + 2 minutes in hours:minutes:seconds; the space
    bounds the timeout (dse.core.bounds.MAX_DURATION_S), so the longest is 720 hours."""
    launch, opts, gpn = CASES["single_node_cpu"]
    longest = dataclasses.replace(launch, timeout_s=MAX_DURATION_S)
    shape = trial_shape(launch.world_size, launch.device, gpn)
    script = render_batch_script(longest, opts, shape, job_name="dse-x-7", workdir=WORKDIR)
    assert '#SBATCH --time="720:02:00"' in script.splitlines()
