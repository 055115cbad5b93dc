"""CloudAI scenarios in and out: real CloudAI TOML files (tests/fixtures/cloudai, each headed
by its source in the NVIDIA/cloudai repository) import as valid spaces; what has no dse
equivalent is listed; the best configuration goes back out as a CloudAI test TOML."""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
from dse.core.exceptions import SpaceError
from dse.core.records import Outcome
from dse.interop.cloudai import import_scenario
from dse.space.searchspace import params_key, parse_space, parse_space_text
from dse.storage import open_storage

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cloudai"
TESTS = FIX / "test"

# Nemotron-4 15B (NeMo's Nemotron4Config15B): no example space has it, so the test gives it
NEMOTRON_15B = {
    "model": {
        "num_layers": 32,
        "hidden_size": 6144,
        "num_attention_heads": 48,
        "num_query_groups": 8,
        "ffn_hidden_size": 24576,
        "vocab_size": 256000,
        "activation": "squared_relu",
        "normalization": "LayerNorm",
    },
    "semantics": {"seq_length": 4096, "global_batch_size": 32},
}

# file -> (knobs explored, fields listed as not mapped)
CASES = {
    "dse_nemo_run_llama3_8b.toml": (
        {"tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"},
        {"cmd_args.data.global_batch_size"},
    ),
    "nemo_run_llama3_8b.toml": (
        {"tensor_model_parallel_size", "micro_batch_size"},
        {"Tests[id='nemo_run_llama3_8b.2nodes']"},
    ),
    "megatron_bridge_qwen_30b.toml": (
        {"tensor_model_parallel_size", "micro_batch_size"},
        {"cmd_args.hf_token"},  # compute_dtype, CUDA graphs and recompute are knobs now
    ),
    "test/dse_nemo_run_llama3_8b_fp8.toml": (
        {"tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"},
        {"cmd_args.data.global_batch_size"},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_cloudai_scenarios_import_and_validate(name: str) -> None:
    got = import_scenario(FIX / name, tests_dir=TESTS)
    text = got.to_yaml(name)
    space = parse_space_text(text, name)  # validates
    knobs, unmapped = CASES[name]
    assert set(space.knobs) == knobs
    assert {u.key for u in got.unmapped} == unmapped
    for u in got.unmapped:  # each is listed in the file written
        assert f"#   {u.key} = " in text
    assert "REPLACE_ME" not in text  # a secret is never copied
    assert space.workload.launcher is not None and space.workload.launcher.recipe


def test_dse_scenario_maps_lists_scalars_resources_and_launcher() -> None:
    space = parse_space(import_scenario(FIX / "dse_nemo_run_llama3_8b.toml").space, "t")
    assert space.knobs["tensor_model_parallel_size"].values() == [1, 2, 4]
    assert space.knobs["context_parallel_size"].values() == [1, 2]
    # [1]: a one-value list is fixed; the recipes' TE attention and distributed Adam declared
    assert space.fixed == {
        "micro_batch_size": 1,
        "attention_backend": "te",
        "use_distributed_optimizer": True,
    }
    assert space.semantics.global_batch_size == 128 and space.semantics.steps == 100
    assert space.resources.world_size == 8
    assert space.workload.name == "nemo"
    launcher = space.workload.launcher
    assert launcher is not None
    assert launcher.recipe == "llama3_8b" and launcher.container_image == (
        "nvcr.io/nvidia/nemo:24.12.rc3"
    )
    assert launcher.overrides["trainer.val_check_interval"] == 1000
    assert launcher.overrides["log.ckpt.save_last"] is False
    assert space.model.hidden_size == 4096  # from the llama3_8b example space
    assert space.budget.trial_timeout_s == 1800 and space.agent.name == "grid"
    assert space.size() == 18


def test_bridge_test_maps_short_names_and_resources() -> None:
    space = parse_space(
        import_scenario(FIX / "megatron_bridge_qwen_30b.toml", tests_dir=TESTS).space, "t"
    )
    assert space.workload.name == "bridge"
    assert space.resources.world_size == 8 and space.resources.gpus_per_node == 4
    assert space.resources.gpu == "NVIDIA GB200"
    assert space.fixed["expert_model_parallel_size"] == 8
    assert space.semantics.global_batch_size == 512
    assert space.model.num_moe_experts == 128  # the qwen3_30b_a3b example's model
    assert space.objective.metric == "tflops_per_gpu"


def test_env_vars_become_env_section_or_are_listed(tmp_path: Path) -> None:
    model = tmp_path / "nemotron.yaml"
    model.write_text(yaml.safe_dump(NEMOTRON_15B))
    got = import_scenario(TESTS / "nemo_run_nemotron_15b_bf16_2_node.toml", model_from=model)
    space = parse_space(got.space, "t")
    assert space.env.fixed["NCCL_NVLS_ENABLE"] == "0"
    assert space.env.fixed["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert space.fixed["sequence_parallel"] is True
    assert space.resources.world_size == 16
    # a CloudAI scenario keeps its environment (dse.core.envpolicy refuses only what loads code)
    assert not got.unmapped
    for var, value in (("TORCHX_MAX_RETRIES", "0"), ("TRANSFORMERS_OFFLINE", "1"),
                       ("NEMO_LOG_MEMORY_USAGE", "1")):  # fmt: skip
        assert space.env.fixed[var] == value


def test_env_vars_the_policy_refuses_are_listed_with_the_reason(tmp_path: Path) -> None:
    model = tmp_path / "nemotron.yaml"
    model.write_text(yaml.safe_dump(NEMOTRON_15B))
    src = (TESTS / "nemo_run_nemotron_15b_bf16_2_node.toml").read_text()
    p = tmp_path / "t.toml"
    p.write_text(
        src.replace(
            "[extra_env_vars]\n",
            '[extra_env_vars]\nLD_PRELOAD = "/x.so"\n'
            'NCCL_NET_PLUGIN = "evil"\nENABLE_NUMA_CONTROL = "1"\n',
        )
    )
    got = import_scenario(p, model_from=model)
    space = parse_space(got.space, "t")
    assert space.env.fixed["ENABLE_NUMA_CONTROL"] == "1"
    why = {u.key: u.why for u in got.unmapped}
    assert set(why) == {"extra_env_vars.LD_PRELOAD", "extra_env_vars.NCCL_NET_PLUGIN"}
    assert "dynamic loader" in why["extra_env_vars.LD_PRELOAD"]
    assert "NCCL loads" in why["extra_env_vars.NCCL_NET_PLUGIN"]


def test_list_valued_env_var_becomes_an_env_knob(tmp_path: Path) -> None:
    src = (FIX / "dse_nemo_run_llama3_8b.toml").read_text()
    p = tmp_path / "s.toml"
    p.write_text(src + '\n  [Tests.extra_env_vars]\n  NCCL_NVLS_ENABLE = ["0", "1"]\n')
    space = parse_space(import_scenario(p).space, "t")
    assert space.knobs["env.NCCL_NVLS_ENABLE"].values() == ["0", "1"]


def test_bad_input_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [\n")
    assert main(["cloudai", "import", str(bad)]) == 2
    assert "bad.toml: not valid TOML" in capsys.readouterr().err
    nccl = tmp_path / "nccl.toml"
    nccl.write_text(
        'name = "x"\ntest_template_name = "NcclTest"\n[cmd_args]\nsubtest_name = "a"\n'
    )
    assert main(["cloudai", "import", str(nccl)]) == 2
    assert "test_template_name 'NcclTest'" in capsys.readouterr().err
    with pytest.raises(SpaceError, match="--tests DIR"):
        import_scenario(FIX / "nemo_run_llama3_8b.toml")


def test_cli_import_writes_a_space_that_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "space.yaml"
    rc = main(["cloudai", "import", str(FIX / "megatron_bridge_qwen_30b.toml"), "--tests",
               str(TESTS), "-o", str(out)])  # fmt: skip
    assert rc == 0
    err = capsys.readouterr().err
    assert "compute_dtype" not in err  # the older compute_dtype = "fp8" is dse's FP8 knobs
    space = parse_space_text(out.read_text(), "s")
    assert space.fixed["fp8"] == "hybrid" and space.fixed["fp8_recipe"] == "delayed"
    # mlp recompute on a model with no dense layer: Megatron-Core 0.16.1 accepts it (a
    # no-op on Qwen3's all-MoE layers), so dse validates it too
    assert space.fixed["recompute_modules"] == "mlp"
    assert main(["validate", str(out)]) == 0
    assert "1 pass the rules" in capsys.readouterr().out


def test_export_best_as_cloudai_test(tmp_path: Path) -> None:
    got = import_scenario(FIX / "dse_nemo_run_llama3_8b.toml")
    text = got.to_yaml("s")
    space = parse_space_text(text, "s")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = open_storage(url)
    rec = storage.create_study(space_yaml=text, **space.study_fields())
    best = None
    for i, (tp, pp, cp) in enumerate([(1, 1, 1), (2, 1, 2), (4, 2, 1)]):
        params = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                  "context_parallel_size": cp}  # fmt: skip
        t = storage.claim_trial(
            study_id=rec.id, params=params, params_key=params_key(params), budget=10
        )
        assert t is not None
        storage.start_trial(t.id, runner="r", host="h", log_path="l", metrics_path="m")
        step = [3.0, 2.0, 2.5][i]
        storage.finish_trial(
            t.id, Outcome("ok", {"step_time_s": step, "tflops_per_gpu": 100 / step}), value=step
        )
        if step == 2.0:
            best = params
    storage.close()
    out = tmp_path / "best.toml"
    assert main(["cloudai", "export", "--storage", url, "-o", str(out)]) == 0
    test = tomllib.loads(out.read_text())
    assert test["test_template_name"] == "NeMoRun"
    assert out.read_text().splitlines()[0].endswith("step_time_s = 2.0 (measured)")
    args = test["cmd_args"]
    assert best is not None
    assert args["trainer"]["strategy"] == {
        "tensor_model_parallel_size": best["tensor_model_parallel_size"],
        "pipeline_model_parallel_size": best["pipeline_model_parallel_size"],
        "context_parallel_size": best["context_parallel_size"],
    }
    assert args["data"]["micro_batch_size"] == 1 and args["data"]["global_batch_size"] == 128
    assert args["recipe_name"] == "llama3_8b" and args["trainer"]["val_check_interval"] == 1000

    # every field is a scalar (ready to run, not a sweep)
    def walk(d: dict) -> list:  # type: ignore[type-arg]
        return [x for v in d.values() for x in (walk(v) if isinstance(v, dict) else [v])]

    assert not any(isinstance(v, list) for v in walk(test))


# Llama 3 70B (NeMo's Llama3Config70B): no example space has it
LLAMA3_70B = {
    "model": {
        "num_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_query_groups": 8,
        "ffn_hidden_size": 28672,
        "vocab_size": 128256,
    },
    "semantics": {"seq_length": 8192, "global_batch_size": 128},
}


def test_recipe_without_example_needs_model_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = TESTS / "dse_nemo_run_llama_70b_fp8.toml"
    unknown = tmp_path / "t.toml"
    unknown.write_text(src.read_text().replace("llama3_70b", "llama9_1t"))
    assert main(["cloudai", "import", str(unknown)]) == 2
    assert "no example space or catalog model for the recipe 'llama9_1t'" in (
        capsys.readouterr().err
    )
    # Llama 3 70B is a catalog model; the test leaves the sequence length to the recipe,
    # whose own default NeMo's recipe table gives (NeMo 2.0 llama3_70b: 8192)
    got = import_scenario(src)
    assert got.space["semantics"]["seq_length"] == 8192
    assert any("seq_length 8192 from the recipe's defaults" in n for n in got.notes)
    got = import_scenario(src, seq_length=8192)
    space = parse_space(got.space, "t")
    assert got.space["model"] == "llama3_70b" and space.model.num_layers == 80
    model = tmp_path / "m.yaml"
    model.write_text(yaml.safe_dump(LLAMA3_70B))
    got = import_scenario(src, model_from=model)
    space = parse_space(got.space, "t")
    # one-value lists are fixed: nothing is swept, so the recipe's values become knobs to widen
    assert space.fixed["pipeline_model_parallel_size"] == 8
    assert space.fixed["virtual_pipeline_model_parallel_size"] == 5
    assert space.knobs["tensor_model_parallel_size"].values() == [4]
    assert space.resources.world_size == 64
    assert any("sweeps nothing" in n for n in got.notes)
    assert space.fixed["fp8"] == "hybrid"  # trainer.plugins.fp8: dse's FP8 knob
    launcher = space.workload.launcher
    # ... and kept as the recipe's plugin override (NeMo's plugin sets FP8 at start-up)
    assert launcher is not None and launcher.overrides["trainer.plugins.fp8"] == "hybrid"


def test_export_bridge_best_as_cloudai_test(tmp_path: Path) -> None:
    text = import_scenario(FIX / "megatron_bridge_qwen_30b.toml", tests_dir=TESTS).to_yaml("s")
    text = text.replace("micro_batch_size:\n    values:\n    - 8", "micro_batch_size:\n"
                        "    values:\n    - 8\n    - 4")  # fmt: skip
    space = parse_space_text(text, "s")
    assert space.knobs["micro_batch_size"].values() == [8, 4]
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    storage = open_storage(url)
    rec = storage.create_study(space_yaml=text, **space.study_fields())
    for mbs, tflops in ((8, 300.0), (4, 410.0)):
        params = {"tensor_model_parallel_size": 1, "micro_batch_size": mbs}
        t = storage.claim_trial(
            study_id=rec.id, params=params, params_key=params_key(params), budget=10
        )
        assert t is not None
        storage.start_trial(t.id, runner="r", host="h", log_path="l", metrics_path="m")
        storage.finish_trial(t.id, Outcome("ok", {"tflops_per_gpu": tflops}), value=tflops)
    storage.close()
    out = tmp_path / "best.toml"
    assert main(["cloudai", "export", "--storage", url, "-o", str(out)]) == 0
    test = tomllib.loads(out.read_text())
    assert test["test_template_name"] == "MegatronBridge"
    args = test["cmd_args"]
    assert args["mb"] == 4 and args["tp"] == 1 and args["ep"] == 8 and args["gb"] == 512
    assert args["num_gpus"] == 8 and "gpus_per_node" not in args  # the system's, today
    assert args["model_family_name"] == "qwen" and args["model_recipe_name"] == "qwen3_30b_a3b"
    assert "model_name" not in args and "model_size" not in args


def test_scenario_cmd_args_override_the_named_test(tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    p.write_text(
        'name = "s"\n[[Tests]]\nid = "sweep"\ntest_name = "nemo_run_llama3_8b"\nnum_nodes = 2\n'
        "  [Tests.cmd_args.trainer.strategy]\n  tensor_model_parallel_size = [1, 2, 4]\n"
    )
    space = parse_space(import_scenario(p, tests_dir=TESTS).space, "t")
    assert space.knobs["tensor_model_parallel_size"].values() == [1, 2, 4]
    assert space.fixed["context_parallel_size"] == 2  # from the test definition
    assert space.resources.world_size == 16


# --- CloudAI as it is today (tests/fixtures/cloudai_current, each headed by its source) ---

CUR = Path(__file__).resolve().parents[1] / "fixtures" / "cloudai_current"
SYSTEM = CUR / "system" / "example_slurm_cluster.toml"

# kind -> (file, import options)
CURRENT = {
    "nemorun_dse": ("test_scenario/dse_nemo_run_llama3_8b.toml", {}),
    "nemorun_acceptance": ("test_scenario/nemo_acceptance_llama3_8b.toml", {}),
    "bridge_current_schema": ("test_scenario/megatron_bridge_qwen_30b.toml", {}),
    "bridge_dse_bayesian": (
        "test_scenario/megatron_bridge_standalone_deepseekv3.toml",
        {"seq_length": 4096},
    ),
    # current schema (model_family_name / model_recipe_name), derived from the file above
    "bridge_dse_bayesian_current": (
        "test_scenario/megatron_bridge_deepseekv3_bayesian.toml",
        {"seq_length": 4096},
    ),
    "nemotron_recipe": (
        "test/megatron_bridge_nemotron_nano_pytorch_profiler.toml",
        {"seq_length": 8192, "global_batch_size": 3072},
    ),
    # gb and seq_length left to the recipe: its defaults
    # (dse/space/catalog/bridge_recipe_defaults.yaml)
    "nemotron_recipe_defaults": ("test/megatron_bridge_nemotron_nano_pytorch_profiler.toml", {}),
    "bridge_dse_bayesian_recipe_defaults": (
        "test_scenario/megatron_bridge_deepseekv3_bayesian.toml",
        {},
    ),
}


def _import(kind: str, **extra: object):  # type: ignore[no-untyped-def]
    name, opts = CURRENT[kind]
    return import_scenario(CUR / name, tests_dir=CUR / "test", system=SYSTEM, **opts, **extra)


@pytest.mark.parametrize("kind", sorted(CURRENT))
def test_current_cloudai_files_round_trip(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """import -> validate -> dry-run -> export -> import again: the same recipe, semantics,
    world and baseline configuration come back."""
    from dse.interop.cloudai import dump_toml, export_test_full

    got = _import(kind)
    text = got.to_yaml(kind)
    path = tmp_path / "space.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 0
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    capsys.readouterr()
    assert main(["start", "--space", str(path), "--dry-run", "1", "--storage", db]) == 0
    assert "nothing was run" in capsys.readouterr().out
    space = parse_space_text(text, kind)
    assert space.runner.name == "slurm"  # from the system TOML
    assert space.runner.options.partition == "partition_1"  # type: ignore[union-attr]
    base = space.full_params(space.baseline())
    exported = export_test_full(space, space.baseline(), "best")
    assert exported.not_taken == []
    toml_text = dump_toml(exported.test)
    test = tomllib.loads(toml_text)  # valid TOML with scalar fields only
    assert all(not isinstance(v, list) for v in test["cmd_args"].values())
    if test["test_template_name"] == "MegatronBridge":
        args = test["cmd_args"]
        assert {"model_family_name", "model_recipe_name", "task"} <= set(args)
        assert "model_name" not in args and "model_size" not in args
    back_file = tmp_path / "best.toml"
    back_file.write_text(toml_text)
    opts = dict(CURRENT[kind][1])
    again = import_scenario(back_file, system=SYSTEM, **opts)  # type: ignore[arg-type]
    back = parse_space(again.space, "again")
    from dse.workloads.launchers._core import launcher_for

    # the exported knobs come back as knobs: no knob and recipe override set one field
    launcher_for(back).render(back.full_params(back.baseline()))
    assert back.workload.name == space.workload.name
    assert back.workload.launcher is not None and space.workload.launcher is not None
    assert back.workload.launcher.recipe == space.workload.launcher.recipe
    assert back.semantics.global_batch_size == space.semantics.global_batch_size
    assert back.semantics.seq_length == space.semantics.seq_length
    assert back.resources.world_size == space.resources.world_size
    assert back.resources.gpu == space.resources.gpu
    again_full = back.full_params(back.baseline())

    def active(knob: str) -> bool:
        spec = space.knobs.get(knob)
        when = (spec.when if spec else None) or {}
        return all(base.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items())

    for knob in set(space.knobs) | set(space.fixed):
        if active(knob):
            assert again_full.get(knob) == base.get(knob), knob
    assert back.env.fixed == space.env.fixed


@pytest.mark.parametrize("kind", ["bridge_dse_bayesian", "bridge_dse_bayesian_current"])
def test_bridge_dse_with_a_bayesian_agent_keeps_its_sweeps_and_agent(kind: str) -> None:
    got = _import(kind)
    space = parse_space(got.space, "t")
    assert space.agent.name == "gp"  # bo_gp: Bayesian optimisation with a GP
    assert not [u for u in got.unmapped if u.key == "agent"]
    assert space.knobs["recompute"].values() == ["selective", "none"]
    assert space.knobs["recompute_modules"].values() == ["mlp", "mlp,moe_act"]
    assert space.fixed["cuda_graph_impl"] == "transformer_engine"
    assert space.fixed["cuda_graph_scope"] == "attn"
    # compute_dtype fp8_cs: FP8 current scaling as dse's precision knobs (cost model, FLOPs)
    assert (space.fixed["fp8"], space.fixed["fp8_recipe"]) == ("hybrid", "tensorwise")
    launcher = space.workload.launcher  # the recipe runs Bridge's preset of compute_dtype
    assert launcher is not None
    assert launcher.overrides["mixed_precision"] == "bf16_with_fp8_current_scaling_mixed"
    assert space.fixed["overlap_moe_expert_parallel_comm"] is False  # moe_a2a_overlap
    assert space.derived["sequence_parallel"] == "bridge"
    # the older test names 4 GPUs per node; the current schema leaves it to the system's 8
    gpn = 4 if kind == "bridge_dse_bayesian" else 8
    assert space.resources.world_size == 256 and space.resources.gpus_per_node == gpn
    assert space.resources.gpu == "NVIDIA GB200" and space.resources.gpu_memory_gib
    assert space.budget.n_trials == 20  # agent_steps
    # model_name / model_size still read; the current names need no note
    assert any("older name" in n for n in got.notes) == (kind == "bridge_dse_bayesian")
    assert not [u for u in got.unmapped if u.key.startswith("cmd_args.model_")]
    # model_recipe_name deepseek_v3: Bridge sets the layout from (PP, VP), so PP 4 / 8 are
    # not refused for 61 layers that do not split evenly
    assert space.derived["pipeline_model_parallel_layout"] == "bridge_deepseek_v3"
    assert not any("cannot split the model's 61 layers" in n for n in got.notes)


def test_use_megatron_fsdp_is_the_knob_with_the_performance_launchers_sharding(
    tmp_path: Path,
) -> None:
    """CloudAI's use_megatron_fsdp is dse's knob (ddp.use_megatron_fsdp), with the sharding
    Megatron-Bridge's performance launcher pairs with it; fixed on, its other FSDP settings
    travel as recipe overrides; the export writes the field and imports back the same."""
    from dse.interop.cloudai import dump_toml, export_test_full
    from dse.workloads.launchers._core import launcher_for

    base = _import("bridge_dse_bayesian")
    assert base.space["fixed"]["use_megatron_fsdp"] is False  # CloudAI's false, as written
    src = (CUR / "test" / "megatron_bridge_standalone_deepseekv3.toml").read_text()
    for value, kind in (("true", "always"), ("[false, true]", "swept")):
        t = tmp_path / f"{kind}.toml"
        t.write_text(src.replace("use_megatron_fsdp = false", f"use_megatron_fsdp = {value}"))
        got = import_scenario(t, system=SYSTEM, seq_length=4096)
        assert not [u for u in got.unmapped if "fsdp" in u.key]
        assert any(n.startswith("use_megatron_fsdp") for n in got.notes)
        space = parse_space_text(got.to_yaml(kind), kind)
        assert space.fixed["data_parallel_sharding_strategy"] == "optim_grads_params"
        launcher = space.workload.launcher
        assert launcher is not None
        if kind == "swept":
            assert space.knobs["use_megatron_fsdp"].values() == [False, True]
            assert "ddp.average_in_collective" not in launcher.overrides
            continue
        assert space.fixed["use_megatron_fsdp"] is True
        assert launcher.overrides["ddp.average_in_collective"] is False
        assert launcher.overrides["model.init_model_with_meta_device"] is True
        argv = launcher_for(space).render(space.full_params(space.baseline())).argv
        assert "ddp.use_megatron_fsdp=true" in argv
        assert "ddp.data_parallel_sharding_strategy=optim_grads_params" in argv
        exported = export_test_full(space, space.baseline(), "best")
        assert exported.not_taken == []
        assert exported.test["cmd_args"]["use_megatron_fsdp"] is True
        back = tmp_path / "back.toml"
        back.write_text(dump_toml(exported.test))
        again = parse_space(import_scenario(back, system=SYSTEM, seq_length=4096).space, "b")
        assert again.fixed["use_megatron_fsdp"] is True
        full = again.full_params(again.baseline())
        argv = launcher_for(again).render(full).argv  # no knob and override set one field
        assert "ddp.data_parallel_sharding_strategy=optim_grads_params" in argv


def _cloudai_bridge_keeps(args: dict, layouts: set[tuple[int, int]] | None) -> bool:
    """CloudAI's MegatronBridge constraint_check (src/cloudai/workloads/megatron_bridge/
    megatron_bridge.py) restated for the fields this grid sweeps: the world divides by
    TP*PP*CP and by ET*EP*PP, DP > 0, GBS by MBS*DP, and (DeepSeek-V3) (PP, VP) among the
    pipeline layouts Bridge has."""
    n, tp, pp, cp = args["num_gpus"], args["tp"], args["pp"], args["cp"]
    vp, ep, et, mb, gb = args["vp"], args["ep"], args["et"], args["mb"], args["gb"]
    if n % (tp * pp * cp):
        return False
    dp = n // (tp * pp * cp)
    if dp == 0 or gb % (mb * dp):
        return False
    if n % (et * ep * pp):
        return False
    return layouts is None or (pp, vp) in layouts


def test_deepseek_v3_grid_valid_configurations_against_cloudai(tmp_path: Path) -> None:
    """The imported DeepSeek-V3 grid (the current-schema test, whose model_recipe_name
    deepseek_v3 turns on CloudAI's constraint 18): dse keeps a subset of what CloudAI's own
    check keeps, and each configuration CloudAI keeps that dse refuses breaks a rule dse
    states for the model it describes. Counted here (docs/interop.md, CloudAI): CloudAI keeps
    60 of the 192 configurations (12 at PP 1, 36 at PP 4, 12 at PP 8). The import derives
    the pipeline layout as Bridge's DeepSeek-V3 recipe sets it from (PP, VP)
    (bridge_deepseek_v3), and dse's rules then keep exactly CloudAI's 60 (MLP recompute
    included: the catalog's moe_layer_freq makes the first 3 layers dense, and Megatron-Core
    accepts it anyway); without the derivation only the 12 at PP 1 pass (61 layers do not
    split evenly over 4 or 8 stages)."""
    import itertools

    from dse.model.rules import check

    raw = tomllib.loads((CUR / "test" / "megatron_bridge_deepseekv3_bayesian.toml").read_text())
    cmd = raw["cmd_args"]
    assert "deepseek_v3" in cmd["model_recipe_name"]  # CloudAI applies constraint 18
    layouts = {(1, 1), (4, 1), (8, 1), (4, 2), (16, 1), (8, 2), (4, 4)}  # CloudAI constraint 18
    swept = {k: v for k, v in cmd.items() if isinstance(v, list)}
    keep_cloudai = []
    for combo in itertools.product(*swept.values()):
        a = {**cmd, **dict(zip(swept, combo, strict=True))}
        if _cloudai_bridge_keeps(a, layouts):
            keep_cloudai.append(a)
    n_grid = len(list(itertools.product(*swept.values())))
    space = parse_space(_import("bridge_dse_bayesian_current").space, "t")
    feats = space.resources.features
    assert isinstance(feats, list)
    configs = list(space.iter_configs())
    valid = [c for c in configs if not check(space, c, feats)]
    assert n_grid == 192 and len(configs) == 192  # recompute [] / [mlp] / [mlp, moe_act]
    assert len(keep_cloudai) == 60
    by_pp: dict[int, int] = {}
    for a in keep_cloudai:
        by_pp[a["pp"]] = by_pp.get(a["pp"], 0) + 1
    assert by_pp == {1: 12, 4: 36, 8: 12}
    assert len(valid) == 60
    assert {c["pipeline_model_parallel_size"] for c in valid} == {1, 4, 8}
    by_rule: dict[str, int] = {}
    for c in configs:
        for v in check(space, c, feats)[:1]:
            by_rule[v.rule] = by_rule.get(v.rule, 0) + 1
    # (PP, VP) outside Bridge's layouts: the even split, which 61 layers fail; VP without PP;
    # PP 8 x EP 64 over 256 GPUs
    assert by_rule == {"layers_pp": 84, "vpp_needs_pp": 36, "expert_grid": 12}
    plain = parse_space(
        {**_import("bridge_dse_bayesian_current").space, "derived": {
            k: v for k, v in space.derived.items() if k != "pipeline_model_parallel_layout"}},
        "t",
    )  # fmt: skip
    no_layout = [c for c in plain.iter_configs() if not check(plain, c, feats)]
    assert {c["pipeline_model_parallel_size"] for c in no_layout} == {1} and len(no_layout) == 12
    for c in valid:  # dse is never looser than CloudAI (here: exactly as loose)
        a = {
            **{k: v[0] if isinstance(v, list) else v for k, v in cmd.items()},
            "tp": c["tensor_model_parallel_size"],
            "pp": c["pipeline_model_parallel_size"],
            "ep": c["expert_model_parallel_size"],
            "vp": c["virtual_pipeline_model_parallel_size"] or 1,
        }
        assert _cloudai_bridge_keeps(a, layouts)
    # CloudAI's fields for those two model shapes become the model's moe_layer_freq and the
    # pipeline layout knob
    t = tmp_path / "t.toml"
    t.write_text(
        (CUR / "test" / "megatron_bridge_deepseekv3_bayesian.toml")
        .read_text()
        .replace("moe_a2a_overlap = false", 'moe_a2a_overlap = false\nfirst_k_dense_replace = 2\n'
                 'pipeline_model_parallel_layout = "Et|(tt|)*30L"')
    )  # fmt: skip
    got = import_scenario(t, system=SYSTEM, seq_length=4096)
    assert not {u.key for u in got.unmapped} & {
        "cmd_args.first_k_dense_replace", "cmd_args.pipeline_model_parallel_layout"
    }  # fmt: skip
    sp = parse_space(got.space, "t")
    assert sp.model.moe_layer_pattern()[:3] == [0, 0, 1] and sp.model.layer_counts()["mlp"] == 2
    assert sp.fixed["pipeline_model_parallel_layout"] == "Et|(tt|)*30L"


def test_tp_gt_1_moe_points_are_valid_through_derived_sp() -> None:
    from dse.model.rules import check

    space = parse_space(_import("bridge_dse_bayesian").space, "t")
    cfg = {**space.baseline(), "tensor_model_parallel_size": 2}
    names = {v.rule for v in check(space, cfg, space.resources.features)}  # type: ignore[arg-type]
    assert "moe_tp_needs_sp" not in names and not names


def test_system_toml_sets_resources_and_slurm_options(tmp_path: Path) -> None:
    sys_toml = tmp_path / "sys.toml"
    sys_toml.write_text(
        SYSTEM.read_text().replace('default_partition = "partition_1"', 'default_partition = '
        '"batch"\naccount = "proj"\nextra_sbatch_args = ["--reservation=r1"]\n'
        'extra_srun_args = "--mpi=pmix"\ncontainer_mount_home = true')
        .replace("gpus_per_node = 8", "gpus_per_node = 4")
    )  # fmt: skip
    got = import_scenario(
        CUR / "test_scenario" / "nemo_acceptance_llama3_8b.toml", tests_dir=CUR / "test",
        system=sys_toml,
    )  # fmt: skip
    space = parse_space(got.space, "t")
    assert space.resources.gpus_per_node == 4 and space.resources.world_size == 4
    opts = space.runner.options
    assert space.runner.name == "slurm"
    assert opts.partition == "batch" and opts.account == "proj"  # type: ignore[union-attr]
    assert opts.sbatch_args == ["--reservation=r1"]  # type: ignore[union-attr]
    assert opts.srun_args == ["--mpi=pmix", "--container-mount-home"]  # type: ignore[union-attr]
    assert opts.env["NCCL_IB_TIMEOUT"] == "20"  # type: ignore[union-attr]
    assert "CUDA_VISIBLE_DEVICES" not in opts.env  # type: ignore[union-attr]
    assert any(u.key == "system.global_env_vars.CUDA_VISIBLE_DEVICES" for u in got.unmapped)
    # without a system the import says what it assumed
    plain = import_scenario(
        CUR / "test_scenario" / "nemo_acceptance_llama3_8b.toml", tests_dir=CUR / "test"
    )
    assert any("8 GPUs per node assumed" in n for n in plain.notes)
    assert any("no --system" in n for n in plain.notes)
    assert plain.space["runner"] == {"name": "local"}


def test_acceptance_tp4_cp2_validates_anywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TP4 CP2 needs Transformer Engine's attention: the import declares the container's
    features and the TE backend, so validation does not depend on the machine: it passes
    with no warning about CP or TE (issue 29 item 10: validated against the space's declared
    features, not the controller's)."""
    got = import_scenario(
        CUR / "test_scenario" / "nemo_acceptance_llama3_8b.toml", tests_dir=CUR / "test"
    )
    space = parse_space(got.space, "t")
    assert space.resources.features == ["transformer_engine", "apex"]
    assert space.fixed["attention_backend"] == "te"
    assert space.fixed["context_parallel_size"] == 2
    p = tmp_path / "s.yaml"
    p.write_text(got.to_yaml("s"))
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["validate", str(p)]) == 0
    err = capsys.readouterr().err
    cp_te = re.compile(r"context.parallel|\bcp\b|cp_needs|transformer.engine|\bte\b", re.I)
    assert "warning" not in err.lower() and not cp_te.search(err), err
    assert not [w for w in caught if cp_te.search(str(w.message))], caught


def test_unknown_agent_is_named_and_swept_compute_dtype_is_two_knobs(tmp_path: Path) -> None:
    src = (CUR / "test" / "megatron_bridge_qwen_30b.toml").read_text()
    t = tmp_path / "t.toml"
    t.write_text(
        src.replace('compute_dtype = "fp8_cs"', 'compute_dtype = ["bf16", "fp8_cs", "fp8_mx"]')
        .replace('test_template_name = "MegatronBridge"',
                 'test_template_name = "MegatronBridge"\nagent = "mab_ucb"')
    )  # fmt: skip
    got = import_scenario(t, system=SYSTEM, seq_length=4096, global_batch_size=512)
    assert [u for u in got.unmapped if u.key == "agent"][0].value == "mab_ucb"
    text = got.to_yaml("t")
    assert "#   agent = 'mab_ucb'" in text
    space = parse_space_text(text, "t")
    assert space.agent.name == "tpe"
    assert space.knobs["fp8"].values() == [None, "hybrid", "e4m3"]
    from dse.model.rules import check

    pairs = {
        (c.get("fp8"), c.get("fp8_recipe") if c.get("fp8") else None)
        for c in space.iter_configs()
        if not check(space, c, ["transformer_engine"])
    }
    assert pairs == {(None, None), ("hybrid", "tensorwise"), ("e4m3", "mxfp8")}


def test_export_names_full_recipe_task_and_labels_an_estimate(tmp_path: Path) -> None:
    """The Omni SFT recipe: model_recipe_name is the recipe's stem, task sft; every tuned
    knob travels (CloudAI fields or the recipe's own overrides); a sim figure is an
    estimate."""
    from dse.interop.cloudai import bridge_recipe_parts, export_test_full

    parts = bridge_recipe_parts("nemotron_omni_cord_v2_sft_8gpu_h100_bf16_config")
    assert parts["model_recipe_name"] == "nemotron_omni_cord_v2"
    assert parts["task"] == "sft" and parts["model_family_name"] == "nemotron_omni"
    assert (
        bridge_recipe_parts("qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")["model_recipe_name"]
        == "qwen3_30b_a3b"
    )
    examples = Path(__file__).resolve().parents[2] / "examples"
    space = parse_space_text((examples / "nemotron_omni.yaml").read_text(), "omni")
    got = export_test_full(space, space.baseline(), "omni_best")
    args, extra = got.test["cmd_args"], got.test.get("extra_cmd_args", {})
    assert args["task"] == "sft" and args["model_recipe_name"] == "nemotron_omni_cord_v2"
    carried = set(args) | {k.split(".", 1)[1] for k in extra}
    dead = space.inactive_knobs(space.baseline())  # values that do nothing: not exported
    assert {"moe_flex_dispatcher_num_sms", "moe_flex_dispatcher_backend", "main_grads_dtype",
            "recompute_modules"} <= dead  # fmt: skip
    assert not dead & {k.split(".", 1)[1] for k in extra}
    tuned = {k for k in set(space.knobs) | set(space.fixed) if not k.startswith("env.")} - dead
    env_knobs = {k.removeprefix("env.") for k in space.knobs if k.startswith("env.")}
    assert env_knobs <= set(got.test.get("extra_env_vars", {}))  # environment knobs travel
    missing = {k for k in tuned if k not in carried} - {
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "expert_model_parallel_size", "expert_tensor_parallel_size", "micro_batch_size",
        "virtual_pipeline_model_parallel_size", "overlap_moe_expert_parallel_comm",
        "cuda_graph_impl", "cuda_graph_scope", "recompute", "recompute_modules", "fp8",
        "fp8_recipe",
    }  # fmt: skip
    named = {k for k, _v, _w in got.not_taken}
    assert missing <= named | {"attention_backend", "recompute"} or not missing, missing
    from dse.interop.cloudai import figure_label

    est = figure_label({"objective": {"value": 249.354}, "source": "estimate"})
    assert "estimate" in est and "measured" in figure_label(
        {"objective": {"value": 1.0}, "source": "measured"}
    )


def test_cloudai_gpu_type_env_gives_the_memory_prescreen(tmp_path: Path) -> None:
    """NeMoRun names its GPU in CLOUDAI_GPU_TYPE: the space gets the GPU and its memory, so
    the pre-screen is not blind; the CLOUDAI_* switches of CloudAI's own recipe factories
    are named (dse runs NeMo's recipe, not cloudai_nemorun.py's)."""
    src = (CUR / "test_scenario" / "dse_nemo_run_llama3_8b.toml").read_text()
    p = tmp_path / "s.toml"
    p.write_text(
        src.replace(
            '  ENABLE_NUMA_CONTROL = "1"',
            '  ENABLE_NUMA_CONTROL = "1"\n  CLOUDAI_GPU_TYPE = "h100"\n'
            '  CLOUDAI_ENABLE_CUDA_GRAPHS = "1"',
        )
    )
    got = import_scenario(p)
    space = parse_space(got.space, "t")
    assert space.resources.gpu == "NVIDIA H100 80GB HBM3"
    assert space.resources.gpu_memory_gib and space.prescreen.enabled
    keys = {u.key for u in got.unmapped}
    assert "extra_env_vars.CLOUDAI_ENABLE_CUDA_GRAPHS" in keys
    assert "CLOUDAI_GPU_TYPE" not in space.env.fixed
    assert any("cloudai_llama3_8b_recipe" in n for n in got.notes)


def _every_fixture() -> list[Path]:
    """Every NeMoRun / MegatronBridge test definition among the CloudAI fixtures."""
    out = []
    for p in sorted([*FIX.rglob("*.toml"), *CUR.rglob("*.toml")]):
        data = tomllib.loads(p.read_text())
        if data.get("test_template_name") in ("NeMoRun", "MegatronBridge"):
            out.append(p)
    return out


@pytest.mark.parametrize("path", _every_fixture(), ids=lambda p: p.parent.name + "/" + p.name)
def test_every_cloudai_test_imports_validates_renders_and_exports(path: Path) -> None:
    """Any current or older CloudAI test of the two workloads: its baseline passes dse's rules
    (e.g. a precision-aware optimizer with the recipes' distributed Adam), the launcher
    renders it, and it exports as valid TOML."""
    from dse.interop.cloudai import dump_toml, export_test_full
    from dse.model.rules import check_space
    from dse.workloads.launchers._core import launcher_for

    got = import_scenario(path, seq_length=4096, global_batch_size=512)
    space = parse_space_text(got.to_yaml(path.name), path.name)
    check_space(space, path.name, count=False)  # raises when the baseline breaks a rule
    launcher_for(space).render(space.full_params(space.baseline()))
    exported = export_test_full(space, space.baseline(), "b")
    assert tomllib.loads(dump_toml(exported.test))["test_template_name"] == (
        "NeMoRun" if space.workload.name == "nemo" else "MegatronBridge"
    )


def test_cli_import_with_system_says_what_it_took_and_assumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.yaml"
    src = CUR / "test_scenario" / "megatron_bridge_standalone_deepseekv3.toml"
    rc = main(["cloudai", "import", str(src), "--tests", str(CUR / "test"), "--system",
               str(SYSTEM), "--seq-length", "4096", "-o", str(out)])  # fmt: skip
    assert rc == 0
    err = capsys.readouterr().err
    assert "dse: note: agent 'bo_gp' is dse's 'gp'" in err
    assert "dse: note: Slurm runner options from the system 'example-cluster'" in err
    assert "dse: not mapped: cmd_args.hf_token = '<not copied>'" in err
    assert "REPLACE_ME" not in out.read_text()
    # without the sequence length: the recipe's default, said (Megatron-Bridge 0.6.2's table)
    assert main(["cloudai", "import", str(src), "--tests", str(CUR / "test")]) == 0
    assert "dse: note: seq_length 4096 from the recipe's defaults" in capsys.readouterr().err
    # a recipe the table does not have: the import names what is missing
    bad = _nano_with(tmp_path, model_family_name="mixtral", model_recipe_name="mixtral_8x7b")
    assert main(["cloudai", "import", str(bad)]) == 2
    assert "no Megatron-Bridge recipe for model_recipe_name 'mixtral_8x7b'" in (
        capsys.readouterr().err
    )


def test_nemorun_finetune_task_round_trips(tmp_path: Path) -> None:
    """NeMoRun's task (CloudAI runs llm.pretrain or llm.finetune): the import keeps it, the
    trial runs `nemo llm finetune`, the export writes it and it imports back."""
    from dse.interop.cloudai import dump_toml, export_test_full
    from dse.workloads.launchers._core import launcher_for

    src = (CUR / "test" / "nemo_run_llama3_8b.toml").read_text()
    assert 'task = "pretrain"' in src
    t = tmp_path / "ft.toml"
    t.write_text(src.replace('task = "pretrain"', 'task = "finetune"'))
    space = parse_space_text(import_scenario(t, system=SYSTEM).to_yaml("ft"), "ft")
    launcher = space.workload.launcher
    assert launcher is not None and launcher.task == "finetune"
    argv = launcher_for(space).render(space.full_params(space.baseline())).argv
    assert argv[:4] == ["nemo", "llm", "finetune", "--factory"]
    exported = export_test_full(space, space.baseline(), "best")
    assert exported.test["cmd_args"]["task"] == "finetune"
    back = tmp_path / "back.toml"
    back.write_text(dump_toml(exported.test))
    again = parse_space(import_scenario(back, system=SYSTEM).space, "again")
    assert again.workload.launcher is not None and again.workload.launcher.task == "finetune"
    # pretrain stays pretrain; a task NeMo's CLI does not run is named
    plain = import_scenario(CUR / "test" / "nemo_run_llama3_8b.toml", system=SYSTEM)
    assert plain.space["workload"]["launcher"]["task"] == "pretrain"
    t.write_text(src.replace('task = "pretrain"', 'task = "evaluate"'))
    bad = import_scenario(t, system=SYSTEM)
    assert [u.value for u in bad.unmapped if u.key == "cmd_args.task"] == ["evaluate"]
    assert bad.space["workload"]["launcher"]["task"] == "pretrain"


# --- a Megatron-Bridge test that leaves gb / seq_length to its recipe ----------------------

NANO = CUR / "test" / "megatron_bridge_nemotron_nano_pytorch_profiler.toml"


def _nano_with(tmp_path: Path, **cmd_args: object) -> Path:
    """The nemotron_nano fixture with ``cmd_args`` fields set (or replaced)."""
    text = NANO.read_text()
    for k, v in cmd_args.items():
        text = re.sub(rf"(?m)^{k} = .*\n", "", text)
        value = f'"{v}"' if isinstance(v, str) else str(v).lower()
        text = text.replace("[cmd_args]\n", f"[cmd_args]\n{k} = {value}\n", 1)
    path = tmp_path / "nano.toml"
    path.write_text(text)
    return path


def test_bridge_test_without_gb_or_seq_length_takes_the_recipe_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The current nemotron_nano file sets neither: the performance recipe Bridge's launcher
    builds for it (gb200, fp8_mx, 8 GPUs) gives them, named on stderr and in the header."""
    out = tmp_path / "nano.yaml"
    assert main(["cloudai", "import", str(NANO), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    text = out.read_text()
    space = parse_space_text(text, "nano")
    assert space.semantics.global_batch_size == 512 and space.semantics.seq_length == 8192
    for where in (err, "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))):
        assert "global_batch_size 512 and seq_length 8192 from the recipe's defaults" in where
        assert (
            "Megatron-Bridge 0.6 (r0.6.0 head) src/megatron/bridge/perf_recipes/nemotronh/gb200/"
            "nemotronh.py: "
            "nemotron_3_nano_pretrain_8gpu_gb200_fp8mx_config" in where
        )
        assert "the test pins Megatron-Bridge at 8a34622655951e44e1847796d9b2a0ce647999ee" in where
    assert main(["validate", str(out)]) == 0


def test_recipe_defaults_come_after_the_test_and_the_command_line(tmp_path: Path) -> None:
    got = import_scenario(_nano_with(tmp_path, gb=256))  # the test's own value
    assert got.space["semantics"]["global_batch_size"] == 256
    assert got.space["semantics"]["seq_length"] == 8192
    note = next(n for n in got.notes if "recipe's defaults" in n)
    assert note.startswith("seq_length 8192 from the recipe's defaults")
    got = import_scenario(NANO, global_batch_size=3072)  # the command line's
    assert got.space["semantics"]["global_batch_size"] == 3072
    assert got.space["semantics"]["seq_length"] == 8192
    got = import_scenario(NANO, global_batch_size=3072, seq_length=4096)
    assert not [n for n in got.notes if "recipe's defaults" in n]


def test_recipe_defaults_follow_bridge_launchers_choice_of_recipe(tmp_path: Path) -> None:
    # use_recipes: the library recipe nemotron_3_nano_pretrain_config (an alias)
    got = import_scenario(_nano_with(tmp_path, use_recipes=True))
    assert got.space["semantics"]["global_batch_size"] == 1024
    note = next(n for n in got.notes if "recipe's defaults" in n)
    assert "recipes/nemotronh/h100/nemotron_3_nano.py: nemotron_3_nano_pretrain_config (= " in note
    # no performance recipe for 16 GPUs: the library recipe stands in, and the note says why
    got = import_scenario(_nano_with(tmp_path, num_gpus=16))
    assert got.space["semantics"]["global_batch_size"] == 1024
    note = next(n for n in got.notes if "recipe's defaults" in n)
    assert "no performance recipe for 16 GPUs" in note
    assert "nemotron_3_nano_pretrain_8gpu_gb200_fp8mx_config exist" in note
    # the test's GPU type picks the performance recipe (h100 has bf16 and fp8_cs only)
    got = import_scenario(_nano_with(tmp_path, gpu_type="h100", compute_dtype="bf16"))
    note = next(n for n in got.notes if "recipe's defaults" in n)
    assert "nemotron_3_nano_pretrain_8gpu_h100_bf16_config" in note


def test_a_recipe_not_in_the_table_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    # Megatron-Bridge 0.6 has no Mixtral recipe (dse's catalog has the model): CloudAI's
    # launcher would build none, so no study runs a stand-in recipe, with or without gb / seq
    path = _nano_with(tmp_path, model_family_name="mixtral", model_recipe_name="mixtral_8x7b")
    for kw in ({}, {"global_batch_size": 256, "seq_length": 4096}):
        with pytest.raises(SpaceError, match=r"no Megatron-Bridge recipe for model_recipe_name "
                           r"'mixtral_8x7b', task 'pretrain', gpu_type 'gb200'"):  # fmt: skip
            import_scenario(path, **kw)  # type: ignore[arg-type]


def _toml_key(name: str) -> str:
    """``name`` as a TOML quoted key (every character outside printable ASCII escaped)."""
    inner = "".join(c if " " <= c <= "~" and c not in '"\\' else f"\\U{ord(c):08X}" for c in name)
    return f'"{inner}"'


#: Refused variable names that carry line breaks (each of YAML's), YAML syntax and document
#: markers: written raw into the header's comments, each would become live YAML.
HOSTILE_ENV_NAMES = (
    "X\nstorage: sqlite:///injected.db",
    "Y\n---\nstudy: injected",
    "Z\n...\n--- {study: injected}",
    "W\r\nrunner: {name: slurm}",
    "V\rbudget: {max_trials: 1}",
    "U\x85agent: {name: random}",
    "T\u2028objective: {metric: step_time}",
    "S\u2029table: /dev/zero",
    "R: {x: 1}  # [a, b] &anchor *alias !!python/object",
    "Q\n#\nknobs: {}\n  - x",
    "P\x00\x1b[2J",
)


def test_hostile_env_var_names_stay_in_the_comment_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "nemotron.yaml"
    model.write_text(yaml.safe_dump(NEMOTRON_15B))
    src = (TESTS / "nemo_run_nemotron_15b_bf16_2_node.toml").read_text()
    added = "".join(f'{_toml_key(n)} = "1\\nstorage: x"\n' for n in HOSTILE_ENV_NAMES)
    scenario = tmp_path / "hostile.toml"
    scenario.write_text(src.replace("[extra_env_vars]\n", "[extra_env_vars]\n" + added))
    got = import_scenario(scenario, model_from=model)
    assert {u.key for u in got.unmapped} == {f"extra_env_vars.{n}" for n in HOSTILE_ENV_NAMES}

    text = got.to_yaml("hostile\n---\nstorage: x.toml")  # the source's name is escaped too
    docs = list(yaml.safe_load_all(text))
    assert docs == [got.space]  # one document: exactly the keys dse meant to write
    header = text[: text.index(yaml.safe_dump(got.space, sort_keys=False))]
    lines = header.splitlines()  # str.splitlines breaks at every YAML line break and more
    assert len(lines) == 2 + len(got.notes) + len(got.unmapped)
    assert all(line.startswith("# ") for line in lines)
    for n in HOSTILE_ENV_NAMES:  # each refused name is listed, escaped
        assert sum(repr(n)[1:-1] in line for line in lines) >= 1

    out = tmp_path / "space.yaml"  # the command writes the same file, which validates
    rc = main(["cloudai", "import", str(scenario), "--model-from", str(model), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    written = out.read_text()
    assert yaml.safe_load(written) == got.space
    assert parse_space_text(written, "s").study == got.space["study"]
    assert all(line.startswith("dse: ") for line in err.splitlines())  # stderr: one line each


@pytest.mark.parametrize("srun", ["--mpi=pmix --export='A", '--comment "x', "--mpi=pmix \\"])
def test_unbalanced_quote_in_extra_srun_args_names_the_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], srun: str
) -> None:
    sys_toml = tmp_path / "sys.toml"
    sys_toml.write_text(
        SYSTEM.read_text().replace(
            'default_partition = "partition_1"',
            f'default_partition = "partition_1"\nextra_srun_args = {_toml_key(srun)}',
        )
    )
    src = CUR / "test_scenario" / "nemo_acceptance_llama3_8b.toml"
    rc = main(["cloudai", "import", str(src), "--tests", str(CUR / "test"), "--system",
               str(sys_toml)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert f"{sys_toml}: extra_srun_args is not a command line" in err
    assert repr(srun) in err
