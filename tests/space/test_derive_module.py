"""dse/space/derive.py on its own: each derivation of DERIVATIONS against the layout it reads,
forced() and inert() per knob, and canonical() folding twins into one configuration
(tests/space/test_derive.py checks the same facts end to end through the space file)."""

from __future__ import annotations

from typing import Any

import pytest

from dse.model.rules import check
from dse.space.derive import DERIVATIONS, INERT, canonical, derive, forced, inert
from dse.space.knobs import IGNORED
from tests.conftest import SMALL_MODEL, small_space

MOE = {**SMALL_MODEL, "num_moe_experts": 4, "moe_router_topk": 2}
TE = {"world_size": 4, "device": "cuda", "gpu_memory_gib": 80.0,
      "features": ["transformer_engine"]}  # fmt: skip


def _space(knobs: dict[str, Any], derived: dict[str, str], model: dict | None = None,
           fixed: dict | None = None) -> Any:  # fmt: skip
    return small_space(
        "d", knobs, world_size=4, model=dict(model or SMALL_MODEL), resources=dict(TE),
        derived=derived, fixed=fixed or {},
    )  # fmt: skip


def test_every_derivation_is_listed_under_its_knob() -> None:
    for knob, table in DERIVATIONS.items():
        for name, d in table.items():
            assert (d.knob, d.name) == (knob, name)
            assert "Megatron-Bridge" in d.description  # each says where Bridge does the same


@pytest.mark.parametrize(
    "tp,given,want",
    [(1, True, False), (2, True, True), (4, True, True), (2, False, False), (1, False, False)],
)
def test_sequence_parallel_bridge(tp: int, given: bool, want: bool) -> None:
    sp = _space({"tensor_model_parallel_size": {"values": [1, 2, 4]}},
                {"sequence_parallel": "bridge"})  # fmt: skip
    p = {"tensor_model_parallel_size": tp, "sequence_parallel": given}
    assert derive(sp, p)["sequence_parallel"] is want
    assert forced(sp, "sequence_parallel", p) is (tp == 1)  # as given elsewhere


@pytest.mark.parametrize("tp,want", [(1, False), (2, True), (4, True)])
def test_sequence_parallel_tp_gt_1_always_applies(tp: int, want: bool) -> None:
    sp = _space({"tensor_model_parallel_size": {"values": [1, 2, 4]}},
                {"sequence_parallel": "tp_gt_1"})  # fmt: skip
    for given in (True, False):
        p = {"tensor_model_parallel_size": tp, "sequence_parallel": given}
        assert derive(sp, p)["sequence_parallel"] is want
        assert forced(sp, "sequence_parallel", p)


@pytest.mark.parametrize("ep,etp,want", [(1, None, None), (2, None, 1), (4, None, 1), (2, 2, 2)])
def test_expert_tensor_parallel_bridge(ep: int, etp: int | None, want: int | None) -> None:
    sp = _space({"expert_model_parallel_size": {"values": [1, 2, 4]}},
                {"expert_tensor_parallel_size": "bridge"}, model=MOE)  # fmt: skip
    p = {"expert_model_parallel_size": ep, "expert_tensor_parallel_size": etp}
    assert derive(sp, p)["expert_tensor_parallel_size"] == want


@pytest.mark.parametrize(
    "tp,sp_on,given,want",
    [
        (1, True, True, False),
        (2, False, True, False),
        (2, True, True, True),
        (2, True, False, False),
    ],
)
def test_tp_comm_overlap_reads_the_derived_sequence_parallel(
    tp: int, sp_on: bool, given: bool, want: bool
) -> None:
    """Derivations apply in order: with ``sequence_parallel: bridge`` at TP 1 the overlap
    sees SP already off."""
    sp = _space({"tensor_model_parallel_size": {"values": [1, 2]}},
                {"sequence_parallel": "bridge", "tp_comm_overlap": "bridge"})  # fmt: skip
    p = {"tensor_model_parallel_size": tp, "sequence_parallel": sp_on, "tp_comm_overlap": given}
    assert derive(sp, p)["tp_comm_overlap"] is want


@pytest.mark.parametrize("knob", ["overlap_grad_reduce", "overlap_param_gather"])
@pytest.mark.parametrize(
    "tp,distopt,given,want",
    [(1, True, False, True), (4, True, True, False), (2, True, False, True),
     (4, False, True, True), (1, False, False, False)],
)  # fmt: skip
def test_overlap_follows_dp_with_the_distributed_optimizer(
    knob: str, tp: int, distopt: bool, given: bool, want: bool
) -> None:
    sp = _space({"tensor_model_parallel_size": {"values": [1, 2, 4]}}, {knob: "bridge"})
    p = {"tensor_model_parallel_size": tp, "use_distributed_optimizer": distopt, knob: given}
    assert derive(sp, p)[knob] is want  # DP = 4 / TP
    assert forced(sp, knob, p) is distopt


def test_no_derived_section_changes_nothing() -> None:
    sp = _space({"tensor_model_parallel_size": {"values": [1, 2]}}, {})
    p = {"tensor_model_parallel_size": 1, "sequence_parallel": True}
    assert derive(sp, p) == p and derive(sp, p) is not p
    assert not forced(sp, "sequence_parallel", p)


def test_inert_knobs() -> None:
    dense = _space({"tensor_model_parallel_size": {"values": [1, 4]}}, {})
    # the knobs Megatron does not read under the others' values are inert (one table: IGNORED)
    assert set(INERT) == {"use_distributed_optimizer", "moe_token_dispatcher_type", *IGNORED}
    assert {"moe_flex_dispatcher_backend", "cross_entropy_fusion_impl", "recompute_modules",
            "moe_flex_dispatcher_num_sms"} <= set(IGNORED)  # fmt: skip
    # the distributed optimizer does nothing at DP 1 (TP 4 of 4 ranks), something at DP 4
    assert inert(dense, "use_distributed_optimizer", {"tensor_model_parallel_size": 4})
    assert not inert(dense, "use_distributed_optimizer", {"tensor_model_parallel_size": 1})
    # ... unless a setting that needs it is on
    assert not inert(dense, "use_distributed_optimizer",
                     {"tensor_model_parallel_size": 4, "overlap_param_gather": True})  # fmt: skip
    assert inert(dense, "moe_token_dispatcher_type", {})  # no MoE layer
    assert inert(dense, "cross_entropy_fusion_impl", {"cross_entropy_loss_fusion": False})
    assert not inert(dense, "cross_entropy_fusion_impl", {"cross_entropy_loss_fusion": True})
    assert not inert(dense, "micro_batch_size", {})  # not an inert knob at all
    moe = _space({"expert_model_parallel_size": {"values": [1, 2]}}, {}, model=MOE)
    assert not inert(moe, "moe_token_dispatcher_type", {})
    assert inert(moe, "moe_flex_dispatcher_backend", {"moe_token_dispatcher_type": "alltoall"})
    assert not inert(moe, "moe_flex_dispatcher_backend", {"moe_token_dispatcher_type": "flex"})


def test_canonical_folds_twins_into_one() -> None:
    sp = _space(
        {"tensor_model_parallel_size": {"values": [1, 2, 4]},
         "use_distributed_optimizer": {"type": "bool", "baseline": False},
         "sequence_parallel": {"type": "bool", "baseline": False}},
        {"sequence_parallel": "bridge"},
    )  # fmt: skip

    def inactive(name: str) -> Any:
        return sp.knobs[name].baseline

    a = {"tensor_model_parallel_size": 4, "use_distributed_optimizer": True,
         "sequence_parallel": True}  # fmt: skip
    b = {**a, "use_distributed_optimizer": False}
    assert canonical(sp, a, inactive) == canonical(sp, b, inactive) == b  # DP 1: one config
    c = {"tensor_model_parallel_size": 1, "use_distributed_optimizer": True,
         "sequence_parallel": True}  # fmt: skip
    assert canonical(sp, c, inactive)["sequence_parallel"] is False  # derived off at TP 1
    d = {"tensor_model_parallel_size": 2, "use_distributed_optimizer": True,
         "sequence_parallel": True}  # fmt: skip
    assert canonical(sp, d, inactive) == d  # DP 2, TP 2: nothing to fold


# --- pipeline_model_parallel_layout: bridge_deepseek_v3 ---------------------------------------


def _bridge_dsv3(pp: int, vp: int) -> list[list[str]] | None:
    """Megatron-Bridge's ``_get_deepseek_v3_pipeline_layout(pp, vp, mtp_layers=0)``
    (recipes/deepseek/h100/deepseek_v3.py), written out here as its map gives it: the first
    stage opens with the embedding, the last ends with ``["mtp"] * 0 + ["loss"]``; None where
    the map has None or no entry (Bridge then leaves the field unset)."""
    last = ["loss"]  # dse's DeepSeek-V3 has no MTP layer: mtp_num_layers 0
    counts = {
        (4, 1): [16, 16, 16, 13],
        (8, 1): [8] * 7 + [5], (4, 2): [8] * 7 + [5],
        (16, 1): [4] * 15 + [1], (8, 2): [4] * 15 + [1], (4, 4): [4] * 15 + [1],
    }.get((pp, vp))  # fmt: skip
    if counts is None:
        return None
    stages = [["decoder"] * n for n in counts]
    stages[0] = ["embedding", *stages[0]]
    stages[-1] = [*stages[-1], *last]
    return stages


_BRIDGE_PAIRS = [(1, 1), (4, 1), (8, 1), (4, 2), (16, 1), (8, 2), (4, 4)]
_OUTSIDE = [(2, 1), (2, 2), (8, 4), (4, 8), (1, 2), (2, 8)]


def _dsv3_space() -> Any:
    return small_space(
        "dsv3", {"pipeline_model_parallel_size": {"values": [1, 2, 4, 8, 16]},
                 "virtual_pipeline_model_parallel_size": {"values": [None, 2, 4, 8]}},
        world_size=256, model="deepseek_v3",
        semantics={"global_batch_size": 2048, "seq_length": 4096},
        resources={"world_size": 256, "gpu_memory_gib": 184.0, "features": []},
        derived={"pipeline_model_parallel_layout": "bridge_deepseek_v3"},
    )  # fmt: skip


def _pp_vp(pp: int, vp: int) -> dict[str, Any]:
    return {"pipeline_model_parallel_size": pp,
            "virtual_pipeline_model_parallel_size": None if vp == 1 else vp}  # fmt: skip


_SYMBOL = {"E": "embedding", "t": "decoder", "L": "loss", "m": "mtp"}


@pytest.mark.parametrize(("pp", "vp"), _BRIDGE_PAIRS + _OUTSIDE)
def test_bridge_deepseek_v3_layout_is_bridges_for_each_pp_vp(pp: int, vp: int) -> None:
    """Each (PP, VP): the derived layout, read back stage by stage, is the list Bridge's
    function gives with no MTP layer; None where Bridge has none ((1, 1), and every pair
    outside its map)."""
    from dse.space.layout import parse_pipeline_layout

    sp = _dsv3_space()
    got = derive(sp, _pp_vp(pp, vp))["pipeline_model_parallel_layout"]
    want = _bridge_dsv3(pp, vp)
    if want is None:
        assert got is None
        return
    assert [[_SYMBOL[c] for c in st] for st in parse_pipeline_layout(got)] == want
    # the rules take it: 61 layers on PP x VP stages, no divisibility refusal
    full = sp.full_params(_pp_vp(pp, vp))
    assert not [v for v in check(sp, full) if v.rule in ("layers_pp", "pipeline_split")]


@pytest.mark.parametrize(("pp", "vp"), _BRIDGE_PAIRS[1:])
def test_bridge_deepseek_v3_layout_as_megatron_core_reads_it(pp: int, vp: int) -> None:
    """Megatron-Core's own parser of the layout string gives Bridge's stages."""
    from tests.conftest import require_megatron

    require_megatron()
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    got = derive(_dsv3_space(), _pp_vp(pp, vp))["pipeline_model_parallel_layout"]
    stages = PipelineParallelLayerLayout.parse_str_to_list(got)
    assert [[t.name for t in st] for st in stages] == _bridge_dsv3(pp, vp)


def test_bridge_deepseek_v3_layout_keeps_a_given_layout_and_is_otherwise_forced() -> None:
    sp = _dsv3_space()
    mine = "Et*30|t*31L"
    p = {**_pp_vp(2, 1), "pipeline_model_parallel_layout": mine}
    assert derive(sp, p)["pipeline_model_parallel_layout"] == mine  # Bridge: a layout given wins
    assert not forced(sp, "pipeline_model_parallel_layout", p)
    assert forced(sp, "pipeline_model_parallel_layout", _pp_vp(4, 4))
    # outside Bridge's map: none, so the even split is judged, and 61 layers do not split
    assert "layers_pp" in {v.rule for v in check(sp, sp.full_params(_pp_vp(2, 1)))}
