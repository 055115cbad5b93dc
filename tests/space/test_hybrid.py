"""Hybrid (Mamba) models, the model catalog, MoE routing semantics, the tuned hybrid/MoE
recipes' knobs and their rules, and the Omni example space."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

from dse.core.exceptions import SpaceError
from dse.model import rules
from dse.model.costmodel._params import total_params
from dse.space.catalog import catalog, get_entry
from dse.space.knobs import KNOBS, assignments
from dse.space.searchspace import ModelSpec, load_space, parse_space
from dse.workloads.launchers import NotTaken
from dse.workloads.launchers.flags import launch_flags
from tests.conftest import require_megatron

ROOT = Path(__file__).resolve().parents[2]
OMNI = ROOT / "examples" / "nemotron_omni.yaml"

#: The hand-tuned 4K SFT configuration (reference knob catalog, section 2).
TUNED = {
    "tensor_model_parallel_size": 2,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 8,
    "micro_batch_size": 4,
    "moe_token_dispatcher_type": "flex",
    "moe_flex_dispatcher_backend": "hybridep",
    "recompute": "selective",
    "recompute_modules": "moe,layernorm",
    "attention_backend": "fused",
    "cross_entropy_fusion_impl": "te",
    "use_fused_weighted_squared_relu": True,
    "moe_router_fusion": True,
    "use_precision_aware_optimizer": True,
    "main_grads_dtype": "bf16",
    "main_params_dtype": "fp16",
    "exp_avg_dtype": "bf16",
    "exp_avg_sq_dtype": "bf16",
    "store_param_remainders": False,
    "grad_reduce_in_fp32": False,
}


@pytest.fixture(scope="module")
def omni():
    return load_space(OMNI)


def _omni_dict() -> dict:
    import yaml

    return yaml.safe_load(OMNI.read_text())


# --- catalog and hybrid model fields ----------------------------------------------------------


def test_catalog_entries_have_sources_and_valid_models():
    entries = catalog()
    for name in (
        "nemotron_3_nano_30b_a3b",
        "nemotron_3_nano_omni_llm",
        "nemotron_h_8b",
        "llama3_8b",
        "llama3_70b",
        "qwen3_30b_a3b",
        "mixtral_8x7b",
        "nemotron4_15b",
        "nemotron4_340b",
        "nemotron3_8b",
        "llama3_405b",
        "deepseek_v3",
    ):
        e = entries[name]
        assert e.sources and all(isinstance(s, str) and s for s in e.sources)
        ModelSpec.model_validate(e.model)  # every entry is a valid model section


def test_nano_parameter_count_matches_its_published_total():
    nano = ModelSpec.model_validate(get_entry("nemotron_3_nano_30b_a3b").model)
    assert nano.layer_counts() == {"mamba": 23, "attention": 6, "mlp": 0, "moe": 23}
    # "31.6B total parameters" (Nemotron 3 Nano 30B-A3B model card)
    assert total_params(nano, 4096) == pytest.approx(31.6e9, rel=0.005)
    h8 = ModelSpec.model_validate(get_entry("nemotron_h_8b").model)
    assert total_params(h8, 8192) == pytest.approx(8.1e9, rel=0.02)


#: Published total parameters of the catalog's CloudAI models, and the relative tolerance of
#: the check: 1% for figures published to a tenth of a billion or to the billion at 405B,
#: 10% for a size published only as its round name ("8 billion parameters").
PUBLISHED_PARAMS = {
    # Nemotron-4 15B technical report (arXiv 2402.16819), Table 1: 3.2B embedding + 12.5B
    # non-embedding parameters
    "nemotron4_15b": (15.7e9, 0.01),
    # Nemotron-4 340B technical report (arXiv 2406.11704), Table 1: 9.4B embedding + 331.6B
    # non-embedding parameters
    "nemotron4_340b": (341.0e9, 0.01),
    # Hugging Face nvidia/nemotron-3-8b-base-4k model card: "8 billion parameters" (dse counts
    # 8.54B: 2.1B of them the untied 256,000-token embedding and output layer)
    "nemotron3_8b": (8e9, 0.10),
    # The Llama 3 Herd of Models (arXiv 2407.21783): 405B parameters
    "llama3_405b": (405e9, 0.01),
}


def test_cloudai_catalog_models_match_their_published_sizes():
    for name, (published, rel) in PUBLISHED_PARAMS.items():
        m = ModelSpec.model_validate(get_entry(name).model)
        assert total_params(m, 4096) == pytest.approx(published, rel=rel), name


def test_deepseek_v3_parameter_count_is_the_published_one():
    """DeepSeek-V3: 671B total parameters (technical report, arXiv 2412.19437; the 14B
    multi-token-prediction module, which the catalog leaves out, not included). The catalog
    entry describes its Multi-Latent Attention with Megatron-Core's MLA fields and its first
    3 layers as dense (moe_layer_freq): dse's count is the published total within 0.1%."""
    m = ModelSpec.model_validate(get_entry("deepseek_v3").model)
    assert m.multi_latent_attention and m.layer_counts()["mlp"] == 3  # first_k_dense_replace
    assert total_params(m, 4096) == pytest.approx(671e9, rel=0.001)


def test_space_names_a_catalog_model_with_overrides():
    d = _omni_dict()
    d["model"] = {"catalog": "nemotron_3_nano_30b_a3b", "frozen_params": 5}
    space = parse_space(d, "s.yaml")
    assert space.model.hybrid_layer_pattern.startswith("MEMEM*")
    assert space.model.frozen_params == 5
    d["model"] = "llama3_8b"
    d.pop("semantics")
    d["semantics"] = {"global_batch_size": 64, "seq_length": 4096}
    d["knobs"] = {"micro_batch_size": {"values": [1, 2]}}
    d["fixed"] = {}
    d["agent"] = {"name": "tpe"}
    d["resources"] = {"world_size": 8}
    d["prescreen"] = {}
    assert parse_space(d, "s.yaml").model.num_layers == 32


def test_unknown_catalog_model_names_the_known_ones():
    d = _omni_dict()
    d["model"] = {"catalog": "nemotron_4"}
    with pytest.raises(
        SpaceError, match="model.catalog: unknown catalog model 'nemotron_4'.*llama3"
    ):
        parse_space(d, "s.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hybrid_layer_pattern": "MEX*"}, "unknown symbols \\['X'\\]"),
        ({"hybrid_layer_pattern": "ME*"}, "num_layers must equal the length"),
        ({"mamba_num_groups": 7}, "divisible by mamba_num_groups"),
    ],
)
def test_bad_hybrid_model_is_refused_with_the_field(change, message):
    m = dict(get_entry("nemotron_3_nano_30b_a3b").model)
    if change.get("hybrid_layer_pattern") == "MEX*":
        m["num_layers"] = 4
    m.update(change)
    d = _omni_dict()
    d["model"] = m
    with pytest.raises(SpaceError, match=message) as e:
        parse_space(d, "omni.yaml")
    assert "omni.yaml: model" in str(e.value)


def test_moe_routing_is_semantics_and_checked():
    d = _omni_dict()
    d["semantics"]["moe_routing"]["moe_router_score_function"] = "softmax"
    with pytest.raises(SpaceError, match="semantics.moe_routing.*needs moe_router_score"):
        parse_space(d, "omni.yaml")
    d = _omni_dict()
    d["semantics"]["moe_routing"]["moe_pad_expert_input_to_capacity"] = True
    with pytest.raises(SpaceError, match="needs moe_expert_capacity_factor"):
        parse_space(d, "omni.yaml")
    d = _omni_dict()
    d["knobs"]["moe_expert_capacity_factor"] = {"values": [1.0, 2.0]}
    with pytest.raises(SpaceError, match="unknown knob 'moe_expert_capacity_factor'"):
        parse_space(d, "omni.yaml")  # routing is not a knob


def test_digest_of_a_gpt_space_is_unchanged_by_the_new_fields(tiny_space_dict):
    # the digest this space had before the hybrid, routing and coefficient fields existed
    # (stored studies are found again by it)
    space = parse_space(tiny_space_dict, "t.yaml")
    assert space.digest() == "1c99ab3e97f7a1decd2d6332b6c3f47bda4a923e50b18719a14746f153aa0dc1"
    d = copy.deepcopy(tiny_space_dict)
    d["model"]["mamba_head_dim"] = 32
    assert parse_space(d, "t.yaml").digest() != space.digest()
    d = copy.deepcopy(tiny_space_dict)
    d["agent"] = {"estimate": False}  # a later agent setting: counted only when set
    assert parse_space(d, "t.yaml").digest() != space.digest()


# --- knobs -------------------------------------------------------------------------------------


def test_recompute_modules_refines_selective_recompute(omni):
    fas = {
        (a.section, a.field): a.value
        for a in assignments({"recompute_modules": "moe,layernorm", "recompute": "selective"})
    }
    assert fas[("model", "recompute_granularity")] == "selective"
    assert fas[("model", "recompute_modules")] == ["moe", "layernorm"]
    params = {"recompute": "selective", "recompute_modules": "moe,layernorm"}
    assert launch_flags(omni, params, "bridge").args[:2] == [
        "model.recompute_granularity=selective",
        "model.recompute_modules=[moe,layernorm]",
    ]
    assert KNOBS["recompute_modules"].check_value("moe,mamba") is not None
    assert KNOBS["recompute_modules"].check_value("moe,moe") is not None


def test_recompute_modules_refines_selective_recompute_on_megatron_lm(omni):
    params = {"recompute": "selective", "recompute_modules": "moe,layernorm"}
    assert launch_flags(omni, params, "megatron_lm").args == [
        "--recompute-granularity",
        "selective",
        "--recompute-modules",
        "moe",
        "layernorm",
    ]


def test_tuned_recipe_settings_map_to_their_bridge_fields(omni):
    params = {
        **TUNED,
        "moe_flex_dispatcher_num_sms": 16,
        "moe_hybridep_pad_uneven_dispatch_inputs": True,
        "stage_precision_aware_optimizer_state_on_cpu": True,
        "data_parallel_sharding_strategy": "optim_grads_params",
        "cuda_graph_impl": "none",
    }
    out = dict(a.split("=", 1) for a in launch_flags(omni, params, "bridge").args)
    assert out["model.recompute_modules"] == "[moe,layernorm]"
    assert out["model.moe_flex_dispatcher_backend"] == "hybridep"
    assert out["model.moe_flex_dispatcher_num_sms"] == "16"
    assert out["model.moe_hybridep_pad_uneven_dispatch_inputs"] == "true"
    assert out["model.use_fused_weighted_squared_relu"] == "true"
    assert out["optimizer.store_param_remainders"] == "false"
    assert out["checkpoint.stage_precision_aware_optimizer_state_on_cpu"] == "true"
    assert out["ddp.data_parallel_sharding_strategy"] == "optim_grads_params"
    with pytest.raises(NotTaken, match="no Megatron-LM argument sets checkpoint"):
        launch_flags(omni, {"stage_precision_aware_optimizer_state_on_cpu": True}, "megatron_lm")


def test_knob_fields_exist_in_megatron_core_or_are_sourced():
    """Every field a knob sets is a field of the installed Megatron-Core's config classes,
    or the catalog says where it is defined (a newer Megatron-Core or Megatron-Bridge)."""
    require_megatron()
    import dataclasses

    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

    from dse.space.knobs import FIELD_SOURCES

    have = {
        "model": {f.name for f in dataclasses.fields(TransformerConfig)},
        "ddp": {f.name for f in dataclasses.fields(DistributedDataParallelConfig)},
        "optimizer": {f.name for f in dataclasses.fields(OptimizerConfig)},
    }
    missing = set()
    for knob in KNOBS.values():
        value = knob.default if knob.kind != "choice" or not knob.choices else knob.choices[-1]
        if knob.name == "recompute_modules" or knob.name == "cuda_graph_scope":
            value = knob.choices[0]
        for a in knob.fields(value if value is not None else 1):
            if a.section in have and a.field not in have[a.section]:
                missing.add(a.field)
    assert missing == set(FIELD_SOURCES) - {"stage_precision_aware_optimizer_state_on_cpu"}


# --- rules -------------------------------------------------------------------------------------


def test_tuned_and_prior_configurations_pass_the_rules(omni):
    feats = omni.resources.features
    assert rules.check(omni, omni.baseline(), feats) == []
    tuned = omni.apply_conditions({**omni.baseline(), **TUNED})
    assert rules.check(omni, tuned, feats) == []


@pytest.mark.parametrize(
    ("params", "rule"),
    [
        ({"tensor_model_parallel_size": 16}, "mamba_tp"),
        ({"context_parallel_size": 16, "tensor_model_parallel_size": 8}, "mamba_cp"),
        ({"recompute": "selective", "recompute_modules": "moe_act"}, "recompute_modules"),
        ({"fused_single_qkv_rope": True}, "fused_qkv_rope"),
        ({"use_grouped_gemm_for_shared_expert": True}, "shared_expert_grouped_gemm"),
        (
            {
                "use_precision_aware_optimizer": True,
                "main_params_dtype": "fp16",
                "optimizer_cuda_graph": True,
            },
            "optimizer_cuda_graph",
        ),  # fmt: skip
        (
            {
                "overlap_moe_expert_parallel_comm": True,
                "recompute": "selective",
                "recompute_modules": "moe",
            },
            "moe_a2a_overlap",
        ),  # fmt: skip
        ({"fp8_param": True}, "fp8"),
        ({"cuda_graph_impl": "local", "cuda_graph_scope": "mlp"}, "cuda_graphs"),
        (
            {
                "moe_token_dispatcher_type": "flex",
                "moe_flex_dispatcher_backend": "deepep",
                "tensor_model_parallel_size": 1,
                "expert_model_parallel_size": 1,
                "sequence_parallel": False,
            },
            "flex_deepep",
        ),  # fmt: skip
    ],
)
def test_hybrid_moe_rules_name_what_the_stack_rejects(omni, params, rule):
    p = {**omni.baseline(), **params}
    if "moe_act" in str(params.get("recompute_modules")):
        p["moe_grouped_gemm"] = False
    names = [v.rule for v in rules.check(_Ctx(omni, p), p, omni.resources.features)]
    assert rule in names


class _Ctx:
    """The Omni space with some fixed knobs overridden (rules read fixed values)."""

    def __init__(self, space, params):
        self._s, self._p = space, params
        self.model, self.semantics, self.resources = space.model, space.semantics, space.resources

    def full_params(self, params):
        return {**self._s.fixed, **self._p, **params}

    def constraint_values(self, params):
        return []


def test_mamba_needs_its_kernels(omni):
    feats = [f for f in omni.resources.features if f != "mamba_ssm"]
    names = [v for v in rules.check(omni, omni.baseline(), feats) if v.rule == "missing_feature"]
    assert names and "mamba-ssm kernels" in str(names[0])


def test_shared_expert_grouped_gemm_is_fine_with_swiglu(omni):
    m = copy.deepcopy(get_entry("nemotron_3_nano_30b_a3b").model)
    m.update(activation="swiglu", hybrid_layer_pattern="E*", num_layers=2)
    d = _omni_dict()
    d["model"] = m
    space = parse_space(d, "s.yaml")
    p = {**space.baseline(), "use_grouped_gemm_for_shared_expert": True}
    assert "shared_expert_grouped_gemm" not in [v.rule for v in rules.check(space, p)]


def test_mamba_ssm_feature_probe_is_declared():
    from dse.space.knobs import FEATURES

    assert "mamba_ssm" in FEATURES
    assert importlib.util.find_spec("dse.workloads.megatron.features") is not None
