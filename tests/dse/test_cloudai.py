"""CloudAI scenarios in and out: real CloudAI TOML files (tests/fixtures/cloudai, each headed
by its source in the NVIDIA/cloudai repository) import as valid spaces; what has no dse
equivalent is listed; the best configuration goes back out as a CloudAI test TOML."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from dse.cli import main
from dse.cloudai import import_scenario
from dse.exceptions import SpaceError
from dse.records import Outcome
from dse.space import params_key, parse_space, parse_space_text
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
    # [1]: a one-value list is fixed; the recipes' TE attention is declared
    assert space.fixed == {"micro_batch_size": 1, "attention_backend": "te"}
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
    # a CloudAI scenario keeps its environment (dse.envpolicy refuses only what loads code)
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
    # mlp recompute on a model with no dense layer: dse's rule names it at validate
    assert main(["validate", str(out)]) == 2
    assert "mlp recompute needs dense MLP layers" in capsys.readouterr().err


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
    # Llama 3 70B is a catalog model; the test leaves the sequence length to the recipe
    with pytest.raises(SpaceError, match="leaves seq_length"):
        import_scenario(src)
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
