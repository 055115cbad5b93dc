from __future__ import annotations

import copy

import pytest

from dse.model.rules import RULES, check, layout
from dse.space.searchspace import parse_space


def _space(d: dict, **model) -> object:
    d = copy.deepcopy(d)
    d["model"].update(model)
    return parse_space(d)


def _rules(space, params, features=None) -> list[str]:
    return [v.rule for v in check(space, params, features)]


def test_valid_baseline(tiny_space_dict: dict) -> None:
    s = parse_space(tiny_space_dict)
    assert check(s, s.baseline(), []) == []


def test_layout_dp(tiny_space_dict: dict) -> None:
    s = parse_space(tiny_space_dict)
    L = layout(s, {"tensor_model_parallel_size": 2, "micro_batch_size": 2})
    assert (L.tp, L.dp, L.num_microbatches) == (2, 1, 4)


def test_gbs_divisibility(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["semantics"]["global_batch_size"] = 6
    s = parse_space(d)
    v = check(s, {"tensor_model_parallel_size": 1, "micro_batch_size": 4})
    assert v[0].rule == "gbs_divisible"
    assert v[0].values == {"global_batch_size": 6, "micro_batch_size": 4, "dp": 2}
    assert "global_batch_size=6" in str(v[0])


def test_heads_and_groups(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["resources"]["world_size"] = 8
    d["knobs"]["tensor_model_parallel_size"] = {"values": [1, 8]}
    s = parse_space(d)
    rules = _rules(s, {"tensor_model_parallel_size": 8, "micro_batch_size": 1})
    assert "heads_tp" in rules  # 4 heads % 8
    assert "world_divisible" not in rules


def test_world_divisible_and_pp_layers(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["resources"]["world_size"] = 3
    d["knobs"]["pipeline_model_parallel_size"] = {"values": [1, 3]}
    s = parse_space(d)
    assert "world_divisible" in _rules(s, {"tensor_model_parallel_size": 2})
    assert "layers_pp" in _rules(s, {"pipeline_model_parallel_size": 3, "micro_batch_size": 1})


def test_vpp_rules(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["pipeline_model_parallel_size"] = {"values": [1, 2]}
    d["knobs"]["virtual_pipeline_model_parallel_size"] = {"values": [2, 4]}
    s = parse_space(d)
    assert "vpp_needs_pp" in _rules(s, {"virtual_pipeline_model_parallel_size": 2})
    assert "layers_vpp" in _rules(
        s, {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 4}
    )
    ok = {
        "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2,
        "micro_batch_size": 1,
    }
    assert _rules(s, ok) == []


def test_cp_and_sp_and_features(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["context_parallel_size"] = {"values": [1, 2]}
    d["knobs"]["sequence_parallel"] = {"type": "bool"}
    d["knobs"]["attention_backend"] = {"values": ["unfused", "te"]}
    d["semantics"]["seq_length"] = 62
    s = parse_space(d)
    assert "seq_cp" in _rules(s, {"context_parallel_size": 2, "tensor_model_parallel_size": 1})
    assert "cp_needs_te" in _rules(s, {"context_parallel_size": 2})
    assert "sp_needs_tp" in _rules(s, {"sequence_parallel": True})
    assert "sp_needs_te_norm" in _rules(
        s, {"sequence_parallel": True, "tensor_model_parallel_size": 2}
    )
    assert "missing_feature" in _rules(s, {"attention_backend": "te"}, features=[])
    assert "missing_feature" not in _rules(
        s, {"attention_backend": "te"}, features=["transformer_engine"]
    )
    # unknown environment: feature rules are left to the trial process
    assert "missing_feature" not in _rules(s, {"attention_backend": "te"}, features=None)


def test_bias_activation_fusion_needs_gelu_or_silu(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["bias_activation_fusion"] = {"type": "bool"}
    s = _space(d, activation="squared_relu")
    assert "bias_activation_fusion" in _rules(s, {"bias_activation_fusion": True})
    assert "bias_activation_fusion" not in _rules(_space(d), {"bias_activation_fusion": True})


def test_moe_rules(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["expert_model_parallel_size"] = {"values": [1, 2]}
    dense = parse_space(d)
    assert "ep_needs_moe" in _rules(dense, {"expert_model_parallel_size": 2})
    moe = _space(d, num_moe_experts=3, moe_router_topk=2)
    assert "experts_ep" in _rules(moe, {"expert_model_parallel_size": 2})


def test_optimizer_rules(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["overlap_param_gather"] = {"type": "bool"}
    d["knobs"]["exp_avg_dtype"] = {"values": ["fp32", "bf16"]}
    s = parse_space(d)
    assert "overlap_param_gather" in _rules(s, {"overlap_param_gather": True})
    assert "optimizer_dtypes" in _rules(s, {"exp_avg_dtype": "bf16"})


def test_megatron_fsdp_needs_the_distributed_optimizer_and_not_one_connection(
    tiny_space_dict: dict,
) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["use_megatron_fsdp"] = {"type": "bool"}
    s = parse_space(d)
    fsdp = {"use_megatron_fsdp": True}
    assert "megatron_fsdp" in _rules(s, {**fsdp, "use_distributed_optimizer": False})
    assert "megatron_fsdp" not in _rules(s, {**fsdp, "use_distributed_optimizer": True})
    one = {**fsdp, "use_distributed_optimizer": True, "env.CUDA_DEVICE_MAX_CONNECTIONS": 1}
    assert "megatron_fsdp" in _rules(s, one)
    assert "megatron_fsdp" not in _rules(s, {**one, "env.CUDA_DEVICE_MAX_CONNECTIONS": 32})
    d["env"] = {"fixed": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}  # fixed in the space's env
    assert "megatron_fsdp" in _rules(parse_space(d), {**fsdp, "use_distributed_optimizer": True})
    assert "megatron_fsdp" not in _rules(parse_space(d), {"use_distributed_optimizer": True})


def test_every_rule_has_a_docstring() -> None:
    for name, fn in RULES.items():
        assert fn.__doc__, name


def test_moe_tp_needs_sp_and_conditional_features(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["moe_token_dispatcher_type"] = {"values": ["allgather", "flex"]}
    d["knobs"]["moe_flex_dispatcher_backend"] = {"values": ["deepep", "hybridep"]}
    moe = _space(d, num_moe_experts=4, moe_router_topk=2)
    assert "moe_tp_needs_sp" in _rules(moe, {"tensor_model_parallel_size": 2}, features=[])
    # the flex backend is only read by the flex dispatcher: no DeepEP needed for allgather
    allgather = {"moe_token_dispatcher_type": "allgather", "moe_flex_dispatcher_backend": "deepep"}
    assert _rules(moe, allgather, features=[]) == []
    flex = {**allgather, "moe_token_dispatcher_type": "flex"}
    assert "missing_feature" in _rules(moe, flex, features=[])
    assert "missing_feature" not in _rules(moe, flex, features=["deepep"])


def test_alltoall_dispatcher_needs_nccl(tiny_space_dict: dict) -> None:
    # measured: EP 2 + alltoall on two gloo ranks fails in all_to_all_single with a TypeError
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["expert_model_parallel_size"] = {"values": [1, 2]}
    d["knobs"]["moe_token_dispatcher_type"] = {"values": ["allgather", "alltoall"]}
    moe = _space(d, num_moe_experts=4, moe_router_topk=2)
    a2a = {"expert_model_parallel_size": 2, "moe_token_dispatcher_type": "alltoall"}
    vs = check(moe, a2a, [])
    assert [v.rule for v in vs] == ["alltoall_needs_nccl"]
    assert "NCCL" in str(vs[0]) and "alltoall" in str(vs[0])
    assert _rules(moe, {**a2a, "moe_token_dispatcher_type": "allgather"}) == []
    assert _rules(moe, {**a2a, "expert_model_parallel_size": 1}) == []
    d["resources"]["device"] = "cuda"
    assert _rules(_space(d, num_moe_experts=4, moe_router_topk=2), a2a) == []


def test_the_space_check_estimates_a_sampled_space_like_its_whole_count(
    tiny_space_dict: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the cap the space check samples combinations at random; its estimate of the
    distinct valid configurations counts equivalent combinations once (an inactive
    conditional knob, the distributed optimizer at DP 1) and lands near the whole count."""
    import dse.model.rules
    from dse.model.rules import check_space

    d = copy.deepcopy(tiny_space_dict)
    d["resources"]["world_size"] = 8
    d["semantics"]["global_batch_size"] = 32
    d["knobs"] = {
        "tensor_model_parallel_size": {"values": [1, 2, 4, 8]},
        "pipeline_model_parallel_size": {"values": [1, 2, 4]},
        "micro_batch_size": {"values": [1, 2, 4, 8]},
        "recompute": {"values": ["none", "selective", "full"]},
        "recompute_modules": {
            "values": ["core_attn", "mlp", "layernorm"],
            "when": {"recompute": "selective"},
        },
        "use_distributed_optimizer": {"type": "bool"},
        "attention_backend": {"values": ["unfused", "sdpa"]},
    }
    sp = parse_space(d, "x")
    whole = check_space(sp, "x")
    assert whole.complete and whole.estimated_valid == whole.valid
    assert whole.valid < whole.looked_at < sp.size()  # rules and equivalent combinations
    monkeypatch.setattr(dse.model.rules, "CHECK_SPACE_CAP", 1_000)
    sampled = check_space(sp, "x")
    assert not sampled.complete and sampled.combinations == sp.size() == 1728
    assert abs(sampled.estimated_valid - whole.valid) <= 0.1 * whole.valid, (
        sampled.estimated_valid,
        whole.valid,
    )
    # without counting equivalent combinations once, the share found valid would be far off
    assert sp.size() * sampled.valid / sampled.looked_at > 1.3 * whole.valid


def test_the_space_check_evaluates_the_constraints_once_per_values_they_read(
    tiny_space_dict: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The space check evaluates the constraints once per distinct tuple of the values they
    read (kept jointly), not once per constraint per configuration: 16 environment knobs
    that no constraint reads change in every configuration."""
    import dse.space.searchspace as ss
    from dse.model.rules import check_space

    calls = 0
    original = ss._eval_expr

    def counted(expr: str, env: object, where: str) -> object:
        nonlocal calls
        calls += 1
        return original(expr, env, where)

    monkeypatch.setattr(ss, "_eval_expr", counted)
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"] = {
        "micro_batch_size": {"values": [1, 2]},
        **{f"env.NCCL_X{i}": {"type": "int", "low": 1, "high": 4} for i in range(16)},
    }
    d["constraints"] = [f"micro_batch_size <= {i + 2}" for i in range(8)]
    got = check_space(parse_space(d, "x"), "x")
    assert not got.complete and got.looked_at > 1000
    assert calls <= 8 * 2, f"the constraints were evaluated {calls} times"
