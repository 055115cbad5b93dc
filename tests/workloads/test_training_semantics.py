"""PEFT (LoRA) and packed sequences as training semantics (issue 38): the space, the
rules, the memory model, the launchers' settings and the built-in trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dse.core.exceptions import SpaceError
from dse.model.costmodel._params import lora_layer_params
from dse.model.costmodel.memory import estimate_memory
from dse.model.rules import check
from dse.space.searchspace import LoraSpec, parse_space
from dse.workloads.launchers import NotTaken, launcher_for

TINY = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
        "ffn_hidden_size": 128, "vocab_size": 1024}  # fmt: skip


def _space(sem: dict[str, Any], fixed: dict[str, Any] | None = None, **extra: Any) -> Any:
    return parse_space(
        {
            "study": "t",
            "model": extra.pop("model", TINY),
            "semantics": {"seq_length": 64, "global_batch_size": 8, **sem},
            "resources": {"world_size": 1, "device": "cpu", "gpu_memory_gib": 80},
            "fixed": fixed or {},
            "knobs": {"micro_batch_size": {"values": [1, 2]}},
            **extra,
        },
        "t.yaml",
    )


def test_lora_spec_has_bridges_defaults_and_refuses_bad_targets() -> None:
    lora = LoraSpec()
    assert (lora.dim, lora.alpha, lora.dropout) == (32, 32, 0.0)
    assert lora.target_modules == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    with pytest.raises(SpaceError, match="target_modules"):
        _space({"peft": {"target_modules": ["linear_qkv", "linear_qkv"]}})
    with pytest.raises(SpaceError, match="target_modules"):
        _space({"peft": {"target_modules": ["q_proj"]}})


def test_a_space_without_the_new_semantics_keeps_its_hashes() -> None:
    plain = _space({})
    same = _space({"packed_sequences": False})
    assert plain.digest() == same.digest() and plain.identity_digest() == same.identity_digest()
    lora = _space({"peft": {"dim": 8}})
    assert lora.identity_digest() != plain.identity_digest()


def test_packed_sequences_need_mbs_1_and_te_attention_off_the_builtin_trainer() -> None:
    """A recipe's packed SFT (THD) needs TE attention; the built-in trainer (workload
    megatron) packs through a mask on the local spec, so local attention passes there."""
    space = _space({"packed_sequences": True}, {"attention_backend": "te"})
    assert not check(space, {"micro_batch_size": 1})
    assert [v.rule for v in check(space, {"micro_batch_size": 2})] == ["packed_sequences"]
    local = _space({"packed_sequences": True}, {"attention_backend": "unfused"},
                   workload={"name": "sim"})  # fmt: skip
    got = check(local, {"micro_batch_size": 1})
    assert [v.rule for v in got] == ["packed_sequences"] and "packed_seq_params" in got[0].message
    builtin = _space({"packed_sequences": True}, {"attention_backend": "unfused"})
    assert not check(builtin, {"micro_batch_size": 1})
    assert [v.rule for v in check(builtin, {"micro_batch_size": 2})] == ["packed_sequences"]


def test_lora_memory_freezes_the_base_and_trains_the_adapters() -> None:
    full = _space({})
    lora = _space({"peft": {"dim": 4, "alpha": 8}})
    p = full.full_params({"micro_batch_size": 1})
    a = estimate_memory(full.model, full.semantics, full.resources, p)
    b = estimate_memory(lora.model, lora.semantics, lora.resources, p)
    # the base keeps its weights (a frozen copy), loses its gradients and optimizer state
    assert b.weights_gib == pytest.approx(a.weights_gib, rel=0.05)
    assert b.gradients_gib < a.gradients_gib / 10 and b.optimizer_gib < a.optimizer_gib / 10
    assert b.total_gib < a.total_gib
    # the adapter count is rank x (in + out) per target linear
    att, _ = lora_layer_params(lora.model, "attention", LoraSpec(dim=4))
    mlp, _ = lora_layer_params(lora.model, "mlp", LoraSpec(dim=4))
    assert att == 4 * (64 + 64 + 2 * 32) + 4 * (64 + 64) and mlp == 4 * (64 + 256) + 4 * (128 + 64)


def test_launchers_render_lora_under_the_upstream_names() -> None:
    """Bridge's and NeMo's LoRA dataclasses (the fields read from their source files, named
    in dse.workloads.launchers._core.lora_fields) take peft.dim / alpha / dropout /
    target_modules; Megatron-LM has no PEFT and says so."""
    from tests.conftest import EXAMPLES

    for name, fmt in (("qwen3_30b_a3b.yaml", "peft.dim=16"), ("llama3_8b.yaml", "peft.dim=16")):
        import yaml

        data = yaml.safe_load((EXAMPLES / name).read_text())
        data["semantics"]["peft"] = {"dim": 16, "target_modules": ["linear_qkv"]}
        space = parse_space(data, name)
        argv = launcher_for(space).render(space.full_params(space.baseline())).argv
        assert fmt in argv
        assert any(a.startswith("peft.target_modules=") and "linear_qkv" in a for a in argv)
    data = yaml.safe_load((EXAMPLES / "llama3_8b_megatron_lm.yaml").read_text())
    data["semantics"]["peft"] = {"dim": 16}
    space = parse_space(data, "mlm")
    with pytest.raises(NotTaken) as e:
        launcher_for(space).render(space.full_params(space.baseline()))
    assert e.value.knob == "semantics.peft" and "no PEFT" in e.value.why


def test_launchers_render_packing_under_the_upstream_names() -> None:
    """A packed study renders Bridge's offline packing (dataset.enable_offline_packing,
    dataset.offline_packing_specs.packed_sequence_size) and NeMo's
    data.packed_sequence_specs.packed_sequence_size, each name in the pinned upstream
    tables; an unpacked study renders none of them."""
    import yaml

    from tests.conftest import EXAMPLES
    from tests.workloads import upstream

    nested = upstream.load("nemo_recipe")["prefixes"]["data.packed_sequence_specs"]
    assert any("packed_sequence_size" in names for names in nested.values())
    for name, tool, want in (
        ("qwen3_30b_a3b.yaml", "bridge", ["dataset.enable_offline_packing=true",
                                          "dataset.offline_packing_specs.packed_sequence_size=4096"]),
        ("llama3_8b.yaml", "nemo", ["data.packed_sequence_specs.packed_sequence_size=4096"]),
    ):  # fmt: skip
        data = yaml.safe_load((EXAMPLES / name).read_text())
        assert data["workload"]["name"] == tool
        data["semantics"].update(packed_sequences=True, seq_length=4096)
        data["model"].pop("seq_length", None)
        space = parse_space(data, name)
        argv = launcher_for(space).render(space.full_params(space.baseline())).argv
        assert [a for a in argv if "pack" in a] == want
        assert upstream.problems(tool, argv) == []
        data["semantics"]["packed_sequences"] = False
        space = parse_space(data, name)
        argv = launcher_for(space).render(space.full_params(space.baseline())).argv
        assert not [a for a in argv if "pack" in a]


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_builtin_trainer_trains_lora_adapters_on_a_frozen_base(tmp_path: Path) -> None:
    """The CPU trainer's adapters: B starts at zero, so step 0's loss is the full model's;
    then only the adapters move (another loss curve); their count is the cost model's."""
    from tests.conftest import require_megatron
    from tests.workloads.test_megatron_trainer import losses, make_spec, run_trial

    require_megatron()
    got, state = {}, {}
    for name, sem in (("full", {}), ("lora", {"peft": {"dim": 4, "alpha": 8}})):
        rc, out = run_trial(make_spec(tmp_path, name, semantics=sem), tmp_path, torchrun=False)
        assert rc == 0
        got[name] = (losses(out), out.metrics["init"])
        state[name] = out.metrics["training_state_bytes"]
    assert got["lora"][0][0] == pytest.approx(got["full"][0][0], abs=1e-6)
    assert got["lora"][0][1:] != got["full"][0][1:]
    space = _space({"peft": {"dim": 4}})
    per_layer = sum(lora_layer_params(space.model, k, LoraSpec(dim=4))[0]
                    for k in ("attention", "mlp"))  # fmt: skip
    trained = int(per_layer * 4)
    assert f"lora(trained={trained}," in got["lora"][1]
    # the training state counted from the live tensors after the steps: the frozen base
    # holds fp32 weights only, no gradient and no optimizer state
    full, lora = state["full"], state["lora"]
    assert full["frozen_in_optimizer"] == lora["frozen_in_optimizer"] == 0
    assert lora["optimizer_params"] == trained and lora["grads"] == 4 * trained
    assert lora["weights_trained"] == 4 * trained
    assert lora["weights_frozen"] == full["weights_trained"] == 4 * full["optimizer_params"]
    # Adam's two fp32 moments per trained element (plus its per-tensor step counters)
    assert 8 * trained <= lora["optimizer"] < 8 * trained + 1024
    assert lora["optimizer"] < full["optimizer"] / 10


def test_builtin_trainer_says_what_it_cannot(tmp_path: Path) -> None:
    from dse.workloads.megatron._plan import TrialFailure, make_plan
    from tests.workloads.test_megatron_trainer import make_spec

    spec = make_spec(tmp_path, "packed", semantics={"packed_sequences": True},
                     params={"attention_backend": "te"})  # fmt: skip
    with pytest.raises(TrialFailure, match="block-diagonal attention mask on the local spec"):
        make_plan(spec, ["transformer_engine"])
    for why, sem, params in (
        ("ignores a given attention_mask", {"precision": "bf16"}, {"masked_softmax_fusion": True}),
        ("end-of-document id", {"data": {"kind": "path", "path": "t.bin"}}, {}),
    ):
        spec = make_spec(tmp_path, "packed", params,
                         semantics={"packed_sequences": True, **sem})  # fmt: skip
        with pytest.raises(TrialFailure, match=why):
            make_plan(spec, ["apex"])
    spec = make_spec(tmp_path, "lora_tp2", {"tensor_model_parallel_size": 2}, world=2,
                     semantics={"peft": {"dim": 4}})  # fmt: skip
    with pytest.raises(TrialFailure, match="not tensor-parallel"):
        make_plan(spec, [])


def test_megatron_lm_renders_the_layer_pattern_and_pipeline_split_and_reads_them_back() -> None:
    """--moe-layer-freq from the model; the pipeline split knobs as Megatron-LM's flags
    (--num-virtual-stages-per-pipeline-rank where the split is not even), read back into
    the same knob values."""
    import yaml

    from dse.workloads.launchers.megatron_lm import parse_megatron_args
    from tests.conftest import EXAMPLES

    data = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu_megatron_lm.yaml").read_text())
    data["model"].update(num_moe_experts=4, moe_router_topk=2, moe_layer_freq=[0, 1, 1, 1])
    space = parse_space(data, "mlm")
    launcher = launcher_for(space)
    cases = [
        {"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 1},
        {"pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et|t|tt|tL",
         "virtual_pipeline_model_parallel_size": 2},
        {"pipeline_model_parallel_size": 2, "account_for_embedding_in_pipeline_split": True,
         "account_for_loss_in_pipeline_split": True},
    ]  # fmt: skip
    for params in cases:
        full = space.full_params({**space.baseline(), **params})
        argv = launcher.render(full).argv
        assert "--moe-layer-freq" in argv and argv[argv.index("--moe-layer-freq") + 1] == (
            "[0,1,1,1]"
        )
        if "virtual_pipeline_model_parallel_size" in params:
            assert argv[argv.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"
        args = argv[argv.index("dse.workloads.megatron.mlm") + 1 :]
        args = args[2:] if args[:1] == ["--dse-device"] else args
        _model, _sem, knobs = parse_megatron_args(args)
        assert {k: knobs.get(k) for k in params} == params
