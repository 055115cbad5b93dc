"""Derived settings (the space file's ``derived:``) and knobs that do nothing in a layout."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dse.core.exceptions import SpaceError
from dse.model.rules import check, layout
from dse.space.searchspace import params_key, parse_space


@pytest.fixture
def moe_dict(tiny_space_dict: dict) -> dict:
    """Four TE ranks, a MoE model, SP on in the recipe (Bridge style)."""
    d = copy.deepcopy(tiny_space_dict)
    d["model"].update(num_moe_experts=4, moe_router_topk=2)
    d["resources"] = {"world_size": 4, "device": "cuda", "features": ["transformer_engine"]}
    d["knobs"] = {
        "tensor_model_parallel_size": {"values": [1, 2, 4]},
        "expert_model_parallel_size": {"values": [1, 2, 4]},
        "micro_batch_size": {"values": [1, 2]},
    }
    d["fixed"] = {"sequence_parallel": True, "attention_backend": "te"}
    return d


def _rules(space: Any, params: dict) -> list[str]:
    return [v.rule for v in check(space, params, ["transformer_engine"])]


def test_sequence_parallel_as_bridge_derives_it(moe_dict: dict) -> None:
    plain = parse_space(moe_dict)
    tp1 = {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 1}
    assert "sp_needs_tp" in _rules(plain, tp1)  # without derived: TP 1 is impossible
    d = {**moe_dict, "derived": {"sequence_parallel": "bridge"}}
    s = parse_space(d)
    assert s.full_params(tp1)["sequence_parallel"] is False
    assert _rules(s, tp1) == []
    tp2 = {**tp1, "tensor_model_parallel_size": 2}
    assert s.full_params(tp2)["sequence_parallel"] is True
    # fixed off + bridge: stays off at TP 2 (Bridge only turns it off)
    d2 = copy.deepcopy(d)
    d2["fixed"]["sequence_parallel"] = False
    assert parse_space(d2).full_params(tp2)["sequence_parallel"] is False
    # tp_gt_1: on exactly when TP > 1, whatever is given
    d3 = {**copy.deepcopy(moe_dict), "derived": {"sequence_parallel": "tp_gt_1"}}
    del d3["fixed"]["sequence_parallel"]
    s3 = parse_space(d3)
    assert [s3.full_params({**tp1, "tensor_model_parallel_size": t})["sequence_parallel"]
            for t in (1, 2, 4)] == [False, True, True]  # fmt: skip
    # the valid share of the space goes up: TP 1 configurations come back
    n_plain = sum(not check(plain, c, ["transformer_engine"]) for c in plain.iter_configs())
    n_bridge = sum(not check(s, c, ["transformer_engine"]) for c in s.iter_configs())
    assert n_bridge > n_plain


def test_expert_tensor_parallel_bridge_default(moe_dict: dict) -> None:
    d = {**moe_dict, "derived": {"expert_tensor_parallel_size": "bridge"}}
    s = parse_space(d)
    p = {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 4}
    # Megatron-Core's default ETP = TP: 2 * 4 does not divide 4 ranks
    assert "expert_grid" in _rules(parse_space(moe_dict), p)
    assert s.full_params(p)["expert_tensor_parallel_size"] == 1
    assert layout(s, p).etp == 1 and "expert_grid" not in _rules(s, p)
    assert "expert_tensor_parallel_size" not in s.full_params(
        {**p, "expert_model_parallel_size": 1}
    )


def test_explored_derived_knob_is_one_configuration_where_forced(moe_dict: dict) -> None:
    d = copy.deepcopy(moe_dict)
    del d["fixed"]["sequence_parallel"]
    d["knobs"]["sequence_parallel"] = {"type": "bool"}
    d["derived"] = {"sequence_parallel": "bridge"}
    s = parse_space(d)
    configs = list(s.iter_configs())
    # TP 1: SP forced off (one value), TP 2/4: both values
    assert len(configs) == 3 * 2 + 2 * 3 * 2 * 2
    assert all(not c["sequence_parallel"] for c in configs if c["tensor_model_parallel_size"] == 1)


@pytest.mark.parametrize(
    ("derived", "knobs", "needle"),
    [
        ({"sequence_parallel": "always"}, None, "derived.sequence_parallel: unknown derivation"),
        ({"recompute": "bridge"}, None, "derived.recompute: no derivation is known"),
        ({"sequence_paralel": "bridge"}, None, "did you mean 'sequence_parallel'"),
        (
            {"sequence_parallel": "tp_gt_1"},
            {"sequence_parallel": {"type": "bool"}},
            "remove knobs",
        ),
    ],
)
def test_bad_derived_section(
    moe_dict: dict, derived: dict, knobs: dict | None, needle: str
) -> None:
    d = copy.deepcopy(moe_dict)
    d["derived"] = derived
    if knobs:
        del d["fixed"]["sequence_parallel"]
        d["knobs"].update(knobs)
    with pytest.raises(SpaceError) as e:
        parse_space(d, "space.yaml")
    assert needle in str(e.value)


def test_distributed_optimizer_is_inert_at_dp1(tiny_space_dict: dict) -> None:
    s = parse_space(tiny_space_dict)  # 2 ranks: TP 2 -> DP 1
    on = {
        "tensor_model_parallel_size": 2,
        "micro_batch_size": 1,
        "use_distributed_optimizer": True,
    }
    off = {**on, "use_distributed_optimizer": False}
    assert params_key(s.apply_conditions(on)) == params_key(s.apply_conditions(off))
    dp2 = {**on, "tensor_model_parallel_size": 1}
    assert params_key(s.apply_conditions(dp2)) != params_key(
        s.apply_conditions({**dp2, "use_distributed_optimizer": False})
    )
    # not inert when something that needs it is on
    d = copy.deepcopy(tiny_space_dict)
    d["fixed"] = {"overlap_param_gather": True, "overlap_grad_reduce": True}
    s2 = parse_space(d)
    assert s2.apply_conditions(on)["use_distributed_optimizer"] is True


def test_knobs_read_only_by_another_knob_are_inert(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["cross_entropy_loss_fusion"] = {"type": "bool"}
    d["knobs"]["cross_entropy_fusion_impl"] = {"values": ["native", "te"]}
    s = parse_space(d)
    keys = {
        params_key(s.apply_conditions(
            {"tensor_model_parallel_size": 1, "micro_batch_size": 1,
             "use_distributed_optimizer": False, "cross_entropy_loss_fusion": fused,
             "cross_entropy_fusion_impl": impl}))
        for fused in (False,) for impl in ("native", "te")
    }  # fmt: skip
    assert len(keys) == 1
