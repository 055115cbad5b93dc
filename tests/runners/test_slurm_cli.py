"""`dse start --runner slurm --dry-run` prints batch scripts; bad runner options exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from dse.cli import main
from tests.conftest import EXAMPLES


def _space(tmp_path: Path, **runner: object) -> Path:
    space = yaml.safe_load((EXAMPLES / "llama_1b_h200.yaml").read_text())
    space["resources"].update({"world_size": 16, "gpus_per_node": 8})
    space["semantics"]["global_batch_size"] = 128
    space["runner"] = {"name": "slurm", "workdir": str(tmp_path / "runs"), **runner}
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    return p


def test_dry_run_prints_multi_node_scripts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _space(
        tmp_path,
        options={"partition": "batch", "container_image": "nvcr.io/nvidia/nemo:25.09"},
    )
    assert main(["start", "--space", str(p), "--dry-run", "2"]) == 0
    out = capsys.readouterr().out
    scripts = out.split("#!/bin/bash")[1:]
    assert len(scripts) == 2
    for s in scripts:
        assert "#SBATCH --nodes=2" in s and "#SBATCH --gpus-per-node=8" in s
        assert "--container-image=nvcr.io/nvidia/nemo:25.09" in s
        assert "--nnodes=2 --nproc-per-node=8" in s
        body = "#!/bin/bash" + s.split("\n## trial")[0]
        assert subprocess.run(["bash", "-n"], input=body, text=True).returncode == 0
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted


def test_dry_run_without_slurm_prints_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = _space(tmp_path)
    assert main(["start", "--space", str(p), "--runner", "local", "--dry-run", "1"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH" not in out and "torch.distributed.run" in out


def test_unknown_slurm_option_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _space(tmp_path, options={"partiton": "batch"})
    assert main(["start", "--space", str(p), "--dry-run"]) == 2
    assert "runner.options.partiton" in capsys.readouterr().err


def test_recipe_launcher_trials_ask_for_gpus_replay_trials_do_not() -> None:
    from dse.space import load_space
    from dse.workloads.runners.slurm_runner import make_runner

    nemo = load_space(EXAMPLES / "llama3_8b.yaml")  # NeMo recipe, 8 GPUs per trial
    assert make_runner(nemo).shape.gpus_per_node == 8
    replay = load_space(EXAMPLES / "replay_llama1b.yaml")  # a CPU process per trial
    assert make_runner(replay).shape.gpus_per_node == 0
