"""`dse start --runner slurm --dry-run` prints batch scripts; bad runner options exit 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
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


@pytest.mark.parametrize(
    ("options", "field"),
    [({"partiton": "batch"}, "runner.options.partiton"),
     ({"queue_timeout_s": -5}, "runner.options.queue_timeout_s")],
)  # fmt: skip
def test_bad_slurm_option_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict, field: str
) -> None:
    p = _space(tmp_path, options=options)
    assert main(["start", "--space", str(p), "--dry-run"]) == 2
    assert field in capsys.readouterr().err


def test_recipe_launcher_trials_ask_for_gpus_replay_trials_do_not() -> None:
    from dse.runners.slurm_runner import make_runner
    from dse.space.searchspace import load_space

    nemo = load_space(EXAMPLES / "llama3_8b.yaml")  # NeMo recipe, 8 GPUs per trial
    assert make_runner(nemo).shape.gpus_per_node == 8
    replay = load_space(EXAMPLES / "replay_llama1b.yaml")  # a CPU process per trial
    assert make_runner(replay).shape.gpus_per_node == 0


def test_llama3_8b_dry_run_prints_the_scripts_the_runner_submits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dse start --space examples/llama3_8b.yaml --runner slurm --dry-run`: each script is
    the one the Slurm runner would write for that trial, byte for byte, and valid bash."""
    from dse.loop.study import trial_launch
    from dse.runners.slurm_runner import dry_run_script, make_runner
    from dse.space.searchspace import load_space

    monkeypatch.chdir(tmp_path)
    assert main(["start", "--space", str(EXAMPLES / "llama3_8b.yaml"), "--runner", "slurm",
                 "--dry-run", "2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    scripts = ["#!/bin/bash" + s.split("\n## trial")[0] for s in out.split("#!/bin/bash")[1:]]
    assert len(scripts) == 2
    space = load_space(EXAMPLES / "llama3_8b.yaml")
    data = space.model_dump(mode="json")
    data["runner"]["name"] = "slurm"
    from dse.space.searchspace import parse_space

    space = parse_space(data, "llama3_8b (--runner slurm)")
    for s in scripts:
        assert subprocess.run(["bash", "-n"], input=s, text=True).returncode == 0
        assert "#SBATCH --gpus-per-node=8" in s and "#SBATCH --exclusive" in s
        assert "--container-image=nvcr.io/nvidia/nemo:25.09" in s  # the recipe's image
        assert "nemo llm pretrain --factory llama3_8b" in s
    # the runner writes the same script for the same trial (one renderer)
    params = json.loads(out.split("## trial 0: ")[1].split("\n")[0])
    env, workload = trial_launch(space, params)
    mine = dry_run_script(space, 0, env, workload)
    # (the printed parameters are sorted; the overrides follow the agent's order)
    assert sorted(mine.split()) == sorted(scripts[0].split())
    assert mine.splitlines()[:-1] == scripts[0].splitlines()[:-1]
    runner_shape = make_runner(space).shape
    assert (runner_shape.nodes, runner_shape.gpus_per_node) == (1, 8)
    assert not (tmp_path / "dse_runs").exists()
