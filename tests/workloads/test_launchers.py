"""Recipe launchers: knob values as the recipe's own overrides, golden dry-run output, knobs a
recipe cannot take refused at validate, environment knobs, Megatron-LM flags read back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
from dse.core.exceptions import SpaceError
from dse.loop.study import trial_launch
from dse.space.knobs import trial_env
from dse.space.searchspace import load_space, parse_space
from dse.workloads import trial_command
from dse.workloads.launchers import NotTaken, check_launcher, launcher_for, run_node_steps
from dse.workloads.launchers.megatron_lm import parse_megatron_args
from dse.workloads.megatron.trainer import cuda_environment
from tests.conftest import EXAMPLES

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def _space(name: str, mutate=None) -> object:  # type: ignore[no-untyped-def]
    data = yaml.safe_load((EXAMPLES / name).read_text())
    if mutate:
        mutate(data)
    return parse_space(data, name)


@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "llama3_8b", "llama3_8b_megatron_lm"])
def test_dry_run_golden(name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # the first trial the agent launches is the recipe's own configuration (the baseline)
    rc = main(["start", "--space", str(EXAMPLES / f"{name}.yaml"), "--dry-run", "1",
               "--storage", f"sqlite:///{tmp_path}/never.db"])  # fmt: skip
    assert rc == 0
    assert capsys.readouterr().out == (GOLDEN / f"dryrun_{name}.txt").read_text()
    assert not (tmp_path / "never.db").exists()  # nothing stored, nothing run


def test_bridge_overrides_in_hydra_syntax() -> None:
    space = _space("qwen3_30b_a3b.yaml")
    params = space.full_params(
        {**space.baseline(), "recompute": "selective", "moe_token_dispatcher_type": "alltoall",
         "micro_batch_size": 2, "env.CUDA_DEVICE_MAX_CONNECTIONS": 1}
    )  # fmt: skip
    r = launcher_for(space).render(params)
    argv = r.argv
    assert "model.recompute_granularity=selective" in argv
    assert "model.recompute_modules=[core_attn]" in argv
    assert "train.micro_batch_size=2" in argv
    assert "model.moe_token_dispatcher_type=alltoall" in argv
    assert "mixed_precision=bf16_with_fp8_current_scaling_mixed" in argv
    assert "checkpoint.save_interval=null" in argv
    assert argv[argv.index("--recipe") + 1] == "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
    assert r.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert r.env["NVTE_FWD_LAYERNORM_SM_MARGIN"] == "16"
    assert r.node_steps == [["nvidia-smi", "boost-slider", "--vboost", "1"]]
    assert r.container_image == "nvcr.io/nvidia/nemo:26.04" and r.nodes == 2


def test_nemo_overrides_paths_and_python_literals() -> None:
    space = _space("llama3_8b.yaml")
    params = space.full_params({**space.baseline(), "tensor_model_parallel_size": 2,
                                "sequence_parallel": True, "recompute": "selective"})  # fmt: skip
    argv = launcher_for(space).render(params).argv
    assert argv[:3] == ["nemo", "llm", "pretrain"]
    assert "trainer.strategy.tensor_model_parallel_size=2" in argv
    assert "trainer.strategy.sequence_parallel=True" in argv
    assert "trainer.strategy.ddp.overlap_grad_reduce=True" in argv
    assert "model.config.recompute_modules=['core_attn']" in argv
    assert "data.micro_batch_size=1" in argv and "trainer.devices=8" in argv


@pytest.mark.parametrize(
    ("example", "knob", "value", "why"),
    [
        ("qwen3_30b_a3b.yaml", "attention_backend", "sdpa", "dse's built-in trainer"),
        # a field Megatron-LM core_v0.16 lacks (its HybridEP backend has a flag now)
        (
            "llama3_8b_megatron_lm.yaml",
            "moe_flex_dispatcher_num_sms",
            16,
            "no Megatron-LM argument",
        ),
        ("llama3_8b.yaml", "main_grads_dtype", "fp32", "torch.dtype"),
    ],
)
def test_a_knob_the_recipe_cannot_take_is_refused_at_validate(
    example: str, knob: str, value: str | int, why: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    data = yaml.safe_load((EXAMPLES / example).read_text())
    data["knobs"][knob] = {"values": [value]}
    if knob == "moe_flex_dispatcher_num_sms":
        data["fixed"] = {**data.get("fixed", {}), "moe_token_dispatcher_type": "flex",
                         "moe_flex_dispatcher_backend": "hybridep"}  # fmt: skip
        data["model"].update(num_moe_experts=8, moe_router_topk=2)
        data["resources"]["features"] = ["transformer_engine", "apex", "hybridep"]
    if knob == "attention_backend":
        data["fixed"].pop("attention_backend")
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(data))
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"knobs.{knob}" in err and f"cannot take {knob}={value!r}" in err and why in err


def test_knob_and_fixed_override_setting_the_same_field_is_an_error() -> None:
    space = _space(
        "qwen3_30b_a3b.yaml",
        lambda d: d["workload"]["launcher"]["overrides"].update({"train.micro_batch_size": 8}),
    )
    with pytest.raises(SpaceError, match=r"\['train.micro_batch_size'\] set both by a knob"):
        check_launcher(space)
    space = _space(
        "llama3_8b_megatron_lm.yaml",
        lambda d: d["workload"]["launcher"]["args"].extend(["--micro-batch-size", "4"]),
    )
    with pytest.raises(SpaceError, match=r"\['--micro-batch-size'\] given more than once"):
        check_launcher(space)


def test_every_knob_value_of_the_examples_renders() -> None:
    for name in ("qwen3_30b_a3b.yaml", "llama3_8b.yaml", "llama3_8b_megatron_lm.yaml",
                 "tiny_gpt_cpu_megatron_lm.yaml"):  # fmt: skip
        assert check_launcher(load_space(EXAMPLES / name)) > 0


def test_megatron_lm_flags_read_back_into_the_same_knob_values() -> None:
    space = load_space(EXAMPLES / "llama3_8b_megatron_lm.yaml")
    launcher = launcher_for(space)
    n = 0
    for params in space.iter_configs():
        full = space.full_params(params)
        argv = launcher.render(full).argv
        args = argv[argv.index("/opt/megatron-lm/pretrain_gpt.py") + 1 :]
        args = [a for a in args if a not in ("--use-mcore-models", "--eval-iters", "0",
                                             "--rotary-base", "500000")]  # fmt: skip
        model, sem, knobs = parse_megatron_args(args)
        assert {k: knobs[k] for k in full} == full
        assert model["num_query_groups"] == 8 and sem["global_batch_size"] == 128
        n += 1
    # every distinct configuration; twins that differ only in a knob Megatron ignores in
    # their layout (the distributed optimizer at DP 1) are one
    assert 0 < n <= space.size()


def test_unknown_megatron_flag_is_refused_like_megatron() -> None:
    with pytest.raises(SystemExit):
        parse_megatron_args(["--num-layers", "2", "--tensor-model-paralel-size", "2"])


def test_env_section_and_env_knobs() -> None:
    space = _space("qwen3_30b_a3b.yaml")
    assert "env.CUDA_DEVICE_MAX_CONNECTIONS" in space.knobs
    assert space.knobs["env.CUDA_DEVICE_MAX_CONNECTIONS"].values() == [1, 32]
    assert trial_env({"env.NCCL_ALGO": "Ring", "env.USE_MNNVL": False}, {"NVTE_X": 1}) == {
        "NVTE_X": "1", "NCCL_ALGO": "Ring", "USE_MNNVL": "0",
    }  # fmt: skip
    with pytest.raises(SpaceError, match="'LD_PRELOAD' may not be set in a trial's environment"):
        _space("qwen3_30b_a3b.yaml", lambda d: d["env"]["fixed"].update(LD_PRELOAD="x"))
    with pytest.raises(SpaceError, match="unknown knob 'env.HOME'"):
        _space("qwen3_30b_a3b.yaml", lambda d: d["env"]["knobs"].update(HOME={"values": ["/"]}))
    with pytest.raises(SpaceError, match="also in env.fixed"):
        _space(
            "qwen3_30b_a3b.yaml",
            lambda d: d["env"]["fixed"].update(CUDA_DEVICE_MAX_CONNECTIONS=1),
        )


def test_built_in_workload_gets_the_env_and_stops_forcing_max_connections() -> None:
    data = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    data["env"] = {"fixed": {"NCCL_DEBUG": "WARN"},
                   "knobs": {"CUDA_DEVICE_MAX_CONNECTIONS": {"values": [1, 32]}}}  # fmt: skip
    space = parse_space(data, "t")
    params = {**space.baseline(), "env.CUDA_DEVICE_MAX_CONNECTIONS": 32}
    env, workload = trial_launch(space, params)
    assert env == {"NCCL_DEBUG": "WARN", "CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    assert "rendered" not in workload and workload["node_steps"] == []
    assert cuda_environment(env) == {}  # the space set it: the trainer leaves it
    assert cuda_environment({}) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_launcher_trial_process_and_rendered_spec() -> None:
    space = load_space(EXAMPLES / "tiny_gpt_cpu_megatron_lm.yaml")
    env, workload = trial_launch(space, space.baseline())
    r = workload["rendered"]
    assert r["launcher"] == "megatron_lm" and r["log_format"] == "megatron"
    assert r["argv"][1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert trial_command("megatron_lm", "t.json", world_size=2, python="py") == [
        "py", "-m", "dse.workloads.launchers.run", "--spec", "t.json",
    ]  # fmt: skip


def test_vboost_node_step_skipped_with_a_note_where_not_permitted() -> None:
    notes = run_node_steps(["vboost"])
    # this machine has no GPU driver (or no permission): a note, never an exception
    assert len(notes) == 1 and notes[0].startswith("node step vboost")


def test_not_taken_names_the_knob() -> None:
    e = NotTaken("attention_backend", "sdpa", "why")
    assert str(e) == "attention_backend='sdpa': why"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["workload"].pop("launcher"), "workload.launcher is required for the bridge"),
        (
            lambda d: d["workload"].update(name="megatron"),
            "workload.launcher applies to ['bridge', 'nemo', 'megatron_lm'], not to 'megatron'",
        ),
        (
            lambda d: d["workload"]["launcher"].update(module="m", script="s.py"),
            "give either script or module, not both",
        ),
        (
            lambda d: d["workload"]["launcher"].update(recipe_name="x"),
            "workload.launcher.recipe_name: Extra inputs are not permitted",
        ),
        (lambda d: d["env"].update(node_steps=["reboot"]), "env.node_steps[0]: Input should be"),
    ],
)
def test_bad_launcher_sections_exit_2(
    mutate, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    data = yaml.safe_load((EXAMPLES / "qwen3_30b_a3b.yaml").read_text())
    mutate(data)
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(data))
    assert main(["validate", str(p)]) == 2
    assert message in capsys.readouterr().err


def test_dry_run_slurm_batch_script_golden(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script the Slurm runner submits, as it is: the recipe's node steps and its command
    under srun on both nodes in the recipe's image; dse's trial process on the first node
    reads the recipe's output. (The run folder and dse's interpreter are this machine's: the
    golden names them <workdir> and python.)"""
    import os
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    rc = main(["start", "--space", str(EXAMPLES / "qwen3_30b_a3b.yaml"), "--dry-run", "1",
               "--runner", "slurm"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    out = out.replace(str(tmp_path.resolve()), "<workdir>").replace(sys.executable, "python")
    path = GOLDEN / "dryrun_qwen3_30b_a3b_slurm.txt"
    if os.environ.get("DSE_UPDATE_GOLDEN"):
        path.write_text(out)
    assert out == path.read_text()
    script = out[out.index("#!/bin/bash") :]
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    assert "--container-image=nvcr.io/nvidia/nemo:26.04" in script
    assert '--rdzv-endpoint="${MASTER_ADDR}":"${MASTER_PORT}"' in script  # the recipe's own
    assert "srun --nodes=2 --ntasks=2" in script and "vboost 1 ||" in script
    assert "-m dse.workloads.launchers.run --spec" in script and "--node-steps-done --" in script
    p = tmp_path / "trial.sbatch"
    p.write_text(script)
    assert subprocess.run(["bash", "-n", str(p)]).returncode == 0  # valid shell
    assert not (tmp_path / "dse_runs").exists()  # nothing written, nothing submitted


def test_a_combination_the_recipe_cannot_take_becomes_an_invalid_trial(tmp_path: Path) -> None:
    from dse.core.records import TrialSpec, read_metrics
    from dse.workloads.launchers.run import main as run_main

    # 32 layers do not split into PP=2 x VPP=3 stages: only this combination fails
    space = _space(
        "llama3_8b_megatron_lm.yaml",
        lambda d: d["knobs"].update(
            virtual_pipeline_model_parallel_size={"values": [None, 3], "baseline": None,
                                                  "when": {"pipeline_model_parallel_size": 2}}
        ),
    )  # fmt: skip
    params = {**space.baseline(), "pipeline_model_parallel_size": 2,
              "virtual_pipeline_model_parallel_size": 3}  # fmt: skip
    env, workload = trial_launch(space, params)
    assert "cannot take" in workload["rendered"]["not_taken"]
    spec = TrialSpec(
        study="s", trial_number=0, params=space.full_params(params),
        model=space.model.model_dump(), semantics=space.semantics.model_dump(), world_size=8,
        device="cuda", metrics_path=str(tmp_path / "m.jsonl"), workload=workload,
    )  # fmt: skip
    p = tmp_path / "trial.json"
    p.write_text(spec.model_dump_json())
    assert run_main(["--spec", str(p)]) == 3
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.failure_class == "invalid"
    assert "do not split into PP=2 x VPP=3" in (o.reason or "")


def test_conditional_knob_checked_where_its_condition_holds(tmp_path: Path) -> None:
    def vpp(values: list) -> object:  # type: ignore[type-arg]
        return lambda d: d["knobs"].update(
            virtual_pipeline_model_parallel_size={
                "values": values, "baseline": None, "when": {"pipeline_model_parallel_size": 2}
            }
        )  # fmt: skip

    # VPP 2 with PP 2 splits 32 layers evenly; with PP 1 it would not apply at all
    assert check_launcher(_space("llama3_8b_megatron_lm.yaml", vpp([None, 2]))) > 0
    with pytest.raises(SpaceError, match="virtual_pipeline_model_parallel_size=3"):
        check_launcher(_space("llama3_8b_megatron_lm.yaml", vpp([None, 3])))


def test_bridge_config_file_with_an_example_script(tmp_path: Path) -> None:
    def with_file(script: str | None) -> object:
        def mutate(d: dict) -> None:  # type: ignore[type-arg]
            lau = d["workload"]["launcher"]
            lau.pop("recipe")
            lau["config_file"] = "conf/nano_overrides.yaml"
            if script:
                lau["script"] = script

        return mutate

    script = "examples/models/nemotron/nemotron_3/nano/pretrain_nemotron_3_nano.py"
    space = _space("qwen3_30b_a3b.yaml", with_file(script))
    argv = launcher_for(space).render(space.full_params(space.baseline())).argv
    i = argv.index(script)  # under dse's entry script: --script SCRIPT -- its arguments
    assert argv[i - 1] == "--script" and argv[i + 1] == "--"
    assert argv[i + 2 : i + 4] == ["--config-file", "conf/nano_overrides.yaml"]
    assert "model.expert_model_parallel_size=16" in argv  # knobs still Hydra overrides
    with pytest.raises(SpaceError, match="config_file needs a script that takes --config-file"):
        check_launcher(_space("qwen3_30b_a3b.yaml", with_file(None)))


# --- issue 25 items 3, 4, 7 ----------------------------------------------------------------

STANDIN = Path(__file__).resolve().parent / "bridge_standin"


def test_a_recipe_the_installed_bridge_lacks_is_refused_at_validate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Item 3: where Bridge is importable, the recipe name is looked up as run_recipe.py looks
    it up (here Bridge's stand-in exports the 4-GPU Omni recipe, not the 8-GPU one)."""
    from dse.workloads.launchers.bridge_installed import recipe_problem

    assert recipe_problem("nemotron_omni_cord_v2_sft_8gpu_h100_bf16_config") is None  # no Bridge
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("PYTHONPATH", str(STANDIN))
    space = _space("nemotron_omni.yaml")
    with pytest.raises(SpaceError) as e:
        check_launcher(space)
    msg = str(e.value)
    assert "workload.launcher.recipe" in msg
    assert "no recipe 'nemotron_omni_cord_v2_sft_8gpu_h100_bf16_config'" in msg
    assert "nemotron_omni_cord_v2_sft_4gpu_h100_bf16_config" in msg  # what it has instead
    assert recipe_problem("llama32_1b_pretrain_config") is None


def test_bridges_own_unknown_recipe_message_is_an_invalid_trial() -> None:
    """Item 3, where Bridge is not importable on the controller: its own message at the first
    trial (recipe_runner.load_recipe) is classified invalid, not error."""
    text = (
        'Traceback (most recent call last):\n  File "run_recipe.py", line 560, in <module>\n'
        "AttributeError: Recipe 'nemotron_omni_cord_v2_sft_8gpu_h100_bf16_config' not found in "
        "megatron.bridge.recipes or megatron.bridge.perf_recipes.\n"
    )
    from dse.workloads.logs import classify_failure

    found = classify_failure(text)
    assert (
        found is not None and found[0] == "invalid" and "not found in megatron.bridge" in found[1]
    )


def test_an_inactive_conditional_knob_passes_nothing() -> None:
    """Item 4: moe_flex_dispatcher_backend applies only with the flex dispatcher; with
    alltoall it is not passed (nor checked); with flex it is."""
    space = _space("qwen3_30b_a3b.yaml")
    base = space.full_params(space.baseline())
    r = launcher_for(space).render({**base, "moe_token_dispatcher_type": "alltoall"})
    assert not [a for a in r.argv if a.startswith("model.moe_flex_dispatcher_backend")]
    assert "moe_flex_dispatcher_backend" in r.inactive
    r = launcher_for(space).render({**base, "moe_token_dispatcher_type": "flex"})
    assert "model.moe_flex_dispatcher_backend=hybridep" in r.argv and not r.inactive


def test_nemo_multi_node_starts_one_task_per_gpu_as_nemo_runs_slurm_executor(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 7: NeMo-Run's SlurmExecutor (no torchrun launcher) runs --ntasks-per-node equal
    to the GPUs per node and Lightning takes the ranks from Slurm; node steps once per node."""
    data = yaml.safe_load((EXAMPLES / "llama3_8b.yaml").read_text())
    data["resources"]["world_size"] = 16  # 2 nodes x 8
    data["env"] = {**(data.get("env") or {}), "node_steps": ["vboost"]}
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    assert main(["start", "--space", str(p), "--dry-run", "1", "--runner", "slurm"]) == 0
    script = capsys.readouterr().out
    script = script[script.index("#!/bin/bash") :]
    assert "#SBATCH --ntasks-per-node=8" in script
    runs = [ln for ln in script.splitlines() if ln.lstrip().startswith("srun ")]
    assert any("--ntasks=16 --ntasks-per-node=8" in ln for ln in runs)  # the recipe
    assert any("--ntasks=2 --ntasks-per-node=1" in ln and "vboost" in ln for ln in runs)
    assert "trainer.num_nodes=2" in script and "trainer.devices=8" in script
    assert "torch.distributed.run" not in script  # NeMo starts no torchrun under Slurm
    r = launcher_for(parse_space(data, "x")).render({})
    assert r.tasks_per_node == 8
