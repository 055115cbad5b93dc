"""MoE layer patterns (Megatron-Core ``moe_layer_freq``) and pipeline splits (uneven first /
last stages, the embedding / loss counted as layers, an explicit layout): the model spec,
the rules, FLOPs, the cost model per stage and the built-in trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.model.flops import model_flops_per_step
from dse.model.rules import check
from dse.space.layout import PipelineSplit, PipelineSplitError, pipeline_chunks
from dse.space.searchspace import ModelSpec, parse_space

CATALOG = Path(__file__).resolve().parents[2] / "dse" / "space" / "catalog" / "models"

TINY = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128,
        "vocab_size": 1024, "num_moe_experts": 4, "moe_router_topk": 2}  # fmt: skip


def _catalog(name: str) -> ModelSpec:
    return ModelSpec(**yaml.safe_load((CATALOG / f"{name}.yaml").read_text())["model"])


def test_moe_layer_freq_follows_megatron_semantics() -> None:
    # int N: layer i is MoE when i % N == 0 (gpt_layer_specs.get_gpt_decoder_layer_specs)
    assert ModelSpec(**{**TINY, "moe_layer_freq": 2}).moe_layer_pattern() == [1, 0, 1, 0]
    m = ModelSpec(**{**TINY, "moe_layer_freq": [0, 1, 1, 1]})
    assert m.layer_counts() == {"mamba": 0, "attention": 4, "mlp": 1, "moe": 3}
    assert m.mixed_moe
    assert not ModelSpec(**TINY).mixed_moe  # default 1: every layer MoE
    assert ModelSpec(**{**TINY, "num_moe_experts": None}).layer_counts()["mlp"] == 4


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"moe_layer_freq": [0, 1]}, "one entry per layer"),
        ({"moe_layer_freq": [0, 1, 2, 1]}, "0 (dense) or 1 (MoE)"),
        ({"moe_layer_freq": 0}, ">= 1"),
        ({"moe_layer_freq": 2, "num_moe_experts": None}, "num_moe_experts is unset"),
    ],
)
def test_bad_moe_layer_freq_is_refused_naming_it(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match="moe_layer_freq") as e:
        ModelSpec(**{**TINY, **change})
    assert words in str(e.value)


def test_catalog_deepseek_v3_has_three_dense_first_layers_and_qwen3_is_all_moe() -> None:
    ds = _catalog("deepseek_v3")
    assert ds.moe_layer_pattern()[:4] == [0, 0, 0, 1]
    assert ds.layer_counts()["mlp"] == 3 and ds.layer_counts()["moe"] == 58
    qwen = _catalog("qwen3_30b_a3b")
    assert qwen.layer_counts()["mlp"] == 0 and qwen.layer_counts()["moe"] == 48


def test_flops_count_dense_layers_at_ffn_and_moe_layers_at_topk_experts() -> None:
    sem = {"global_batch_size": 1, "seq_length": 8}
    all_moe = model_flops_per_step(ModelSpec(**TINY), sem)
    mixed = model_flops_per_step(ModelSpec(**{**TINY, "moe_layer_freq": [0, 1, 1, 1]}), sem)
    # one layer's MoE MLP (top-2 of width 128) replaced by a dense MLP of width 128:
    # 3 x 2 x tokens x h x 3 GEMMs x (128 - 2 x 128)
    assert mixed - all_moe == pytest.approx(3 * 2 * 8 * 64 * 3 * (128 - 256))


def _space(model: dict[str, Any], fixed: dict[str, Any], world: int = 8) -> Any:
    return parse_space(
        {
            "study": "t",
            "model": model,
            "semantics": {"seq_length": 64, "global_batch_size": 64},
            "resources": {"world_size": world, "device": "cpu"},
            "fixed": fixed,
            "knobs": {"micro_batch_size": {"values": [1]}},
        },
        "t",
    )


def test_mlp_recompute_is_valid_wherever_megatron_core_accepts_it() -> None:
    """Megatron-Core 0.16.1 recomputes the MLP of dense layers only and accepts the module
    on an all-MoE model (transformer_layer.py); dse's rule no longer refuses it."""
    for freq in (1, [0, 1, 1, 1]):
        space = _space({**TINY, "moe_layer_freq": freq},
                       {"recompute": "selective", "recompute_modules": "mlp"})  # fmt: skip
        assert not check(space, space.baseline())
    # what Megatron-Core refuses still is: moe_act without grouped GEMM
    space = _space(TINY, {"recompute": "selective", "recompute_modules": "moe_act"})
    assert [v.rule for v in check(space, space.baseline())] == ["recompute_modules"]


def test_memory_of_a_dense_first_model_is_set_by_its_largest_stage() -> None:
    from dse.model.costmodel.memory import estimate_memory

    model = ModelSpec(**{**TINY, "num_layers": 8, "moe_layer_freq": [0, 0, 1, 1, 1, 1, 1, 1]})
    space = _space(model.model_dump(), {"pipeline_model_parallel_size": 2})
    est = estimate_memory(model, space.semantics, space.resources, space.full_params({}))
    stages = est.details["stages"]
    assert stages["0"]["layers"]["mlp"] == 2 and stages["1"]["layers"]["mlp"] == 0
    assert stages["1"]["layers"]["moe"] == 4
    # stage 1 holds 4 MoE layers' 4 experts: more parameters than stage 0's 2 dense + 2 MoE
    assert stages["1"]["params"] > stages["0"]["params"] - 1024 * 64  # less the embedding


# --- pipeline splits ------------------------------------------------------------------------


def test_even_split_with_virtual_stages_interleaves_chunks() -> None:
    assert pipeline_chunks(8, 2, 2) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_uneven_first_and_last_stage() -> None:
    split = PipelineSplit(
        num_layers_in_first_pipeline_stage=3, num_layers_in_last_pipeline_stage=2
    )
    got = pipeline_chunks(13, 4, None, split)
    assert [len(r[0]) for r in got] == [3, 4, 4, 2]
    with pytest.raises(PipelineSplitError, match="divisible by the middle pipeline stages"):
        pipeline_chunks(12, 4, None, split)


def test_accounting_the_embedding_and_loss_as_layers() -> None:
    split = PipelineSplit(
        account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True
    )
    assert [len(r[0]) for r in pipeline_chunks(10, 4, None, split)] == [2, 3, 3, 2]
    with pytest.raises(PipelineSplitError, match="must be divisible by PP"):
        pipeline_chunks(11, 4, None, split)


def test_bridge_deepseek_v3_pp4_vp4_layout_places_61_layers() -> None:
    """Bridge's set_deepseek_v3_pipeline_model_parallel_layout for (PP 4, VP 4), without its
    MTP layer (the catalog model has none): 16 virtual stages, rank r holding stages
    r, r+4, r+8, r+12."""
    layout = "Etttt|" + "tttt|" * 14 + "tL"
    got = pipeline_chunks(61, 4, None, PipelineSplit(pipeline_model_parallel_layout=layout))
    assert [sum(len(c) for c in r) for r in got] == [16, 16, 16, 13]
    assert got[0][0] == [0, 1, 2, 3] and got[3][3] == [60]
    with pytest.raises(PipelineSplitError, match="conflicts"):
        pipeline_chunks(61, 4, 2, PipelineSplit(pipeline_model_parallel_layout=layout))
    with pytest.raises(PipelineSplitError, match="must equal num_layers"):
        pipeline_chunks(60, 4, None, PipelineSplit(pipeline_model_parallel_layout=layout))
    with pytest.raises(PipelineSplitError, match="cannot be set with"):
        pipeline_chunks(
            61, 4, None,
            PipelineSplit(pipeline_model_parallel_layout=layout,
                          num_layers_in_first_pipeline_stage=16),
        )  # fmt: skip


# --- the built-in trainer -------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_trainer_builds_dense_and_moe_layers_from_moe_layer_freq(tmp_path: Path) -> None:
    from tests.conftest import require_megatron
    from tests.workloads.test_megatron_trainer import losses, make_spec, run_trial

    require_megatron()
    got = {}
    for name, freq in (("mixed", [0, 1, 0, 1]), ("all_moe", 1)):
        model = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_layer_freq": freq}
        spec = make_spec(tmp_path, name, model=model, semantics={"steps": 3})
        rc, out = run_trial(spec, tmp_path, torchrun=False)
        assert rc == 0
        got[name] = losses(out)
    assert len(got["mixed"]) == 3 and all(x > 0 for x in got["mixed"])
    # the dense layers are built (another model, other losses from the same seed and data)
    assert got["mixed"] != got["all_moe"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_uneven_pipelines_train_the_same_losses_as_one_stage(tmp_path: Path) -> None:
    """Megatron-Core places the 4 layers 1+3 (first stage), by a layout string (3+1), or
    with the embedding and loss counted (2+2): the built-in trainer passes the fields to
    TransformerConfig and trains the same loss curve as one stage (layout-invariant
    weights, fp32)."""
    from tests.conftest import require_megatron
    from tests.workloads.test_megatron_trainer import losses, make_spec, run_trial

    require_megatron()
    base = losses(run_trial(make_spec(tmp_path, "pp1"), tmp_path)[1])
    cases = {
        "first1": {"num_layers_in_first_pipeline_stage": 1},
        "layout": {"pipeline_model_parallel_layout": "Ettt|tL"},
        "accounted": {"account_for_embedding_in_pipeline_split": True,
                      "account_for_loss_in_pipeline_split": True},
    }  # fmt: skip
    for name, split in cases.items():
        params = {"pipeline_model_parallel_size": 2, **split}
        rc, out = run_trial(make_spec(tmp_path, name, params, world=2), tmp_path)
        assert rc == 0, (name, out.reason)
        assert losses(out) == pytest.approx(base, abs=1e-3), name


def test_rules_and_cost_model_take_the_pipeline_split() -> None:
    from dse.model.costmodel.memory import estimate_memory

    model = {**TINY, "num_moe_experts": None, "num_layers": 6}
    space = _space(model, {"pipeline_model_parallel_size": 2})
    heavy = {"num_layers_in_first_pipeline_stage": 5}
    assert not check(space, {**space.baseline(), **heavy})
    bad = {"num_layers_in_first_pipeline_stage": 6}  # nothing left for the last stage
    assert [v.rule for v in check(space, {**space.baseline(), **bad})] == ["pipeline_split"]
    conflict = {"pipeline_model_parallel_layout": "Ett|tt|t|tL",  # 4 stages: VPP 2
                "virtual_pipeline_model_parallel_size": 3}  # fmt: skip
    got = check(space, {**space.baseline(), **conflict})
    assert got[0].rule == "pipeline_split" and "conflicts" in got[0].message
    m = ModelSpec(**model)
    params = {**space.full_params(space.baseline()), **heavy}
    est = estimate_memory(m, space.semantics, space.resources, params)
    stages = est.details["stages"]
    assert stages["0"]["layers"]["attention"] == 5 and stages["1"]["layers"]["attention"] == 1
    assert est.peak_stage == 0  # the stage of 5 layers sets the peak
    even = estimate_memory(m, space.semantics, space.resources, space.full_params({}))
    assert est.total_gib > even.total_gib


def test_deepseek_grid_bench_keeps_what_cloudai_keeps_but_for_predicted_oom() -> None:
    """bench/deepseek_grid.py (BENCHMARKS, issue 38): with Bridge's DeepSeek-V3 layouts as
    pipeline_model_parallel_layout, dse keeps nothing CloudAI refuses, and each configuration
    CloudAI keeps that dse refuses is a predicted OOM (an estimate) or a named rule; Bridge's
    GB200 performance layout breaks no rule."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(repo / "bench" / "deepseek_grid.py"), "--json"],
                       capture_output=True, text=True, cwd=repo, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(repo)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    g = out["grid"]
    assert g["grid"] == 192 and g["cloudai_keeps"] == 60
    assert g["dse_keeps_outside_cloudai"] == 0
    assert g["dse_keeps"] + sum(g["cloudai_kept_dse_refused_by_reason"].values()) == 60
    assert set(g["cloudai_kept_dse_refused_by_reason"]) == {"predicted_oom"}
    assert {row["pp"] for row in g["kept"]} >= {4, 8}  # uneven pipelines now launchable
    p = out["gb200_perf_layout"]
    assert p["rules_broken"] == []
    assert p["stages"]["0"]["layers"]["mlp"] == 3  # the 3 dense first layers, on stage 0
    assert p["stages"]["3"]["layers"]["attention"] == 13
    # with MLA (issue 38) and Bridge's fp8cs precision settings, the layout NVIDIA runs is
    # estimated under the GB200's memory; the earlier settings are not
    assert p["peak_gib_estimate"] < p["gpu_memory_gib"] < (
        out["gb200_perf_layout_earlier_settings"]["peak_gib_estimate"])  # fmt: skip
    assert out["gb200_bf16_layout"]["rules_broken"] == []
    assert 0.97 < out["flops"]["ratio"] < 1.01  # 6 x 37B active + attention matmuls


def _megatron_chunks(n: int, pp: int, vpp: int | None, split: PipelineSplit) -> Any:
    """Megatron-Core 0.16.1's own placement: TransformerConfig's checks, then each (rank,
    chunk)'s offset and layer count (get_transformer_layer_offset, get_num_layers_to_build;
    a layout's own table)."""
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    cfg = TransformerConfig(
        num_layers=n, hidden_size=8, num_attention_heads=2, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp, pipeline_dtype=torch.float32,
        **{k: v for k, v in vars(split).items() if v not in (None, False)},
    )  # fmt: skip
    v = cfg.virtual_pipeline_model_parallel_size or 1
    out = []
    for rank in range(pp):
        row = []
        for chunk in range(v):
            vp = chunk if cfg.virtual_pipeline_model_parallel_size else None
            if cfg.pipeline_model_parallel_layout is not None:
                lay = cfg.pipeline_model_parallel_layout.layout
                start = sum(
                    lay[r][c].count(lay[r][c][0].__class__.decoder)
                    for c in range(v) for r in range(pp) if (c, r) < (chunk, rank)
                )  # fmt: skip
                count = lay[rank][chunk].count(lay[rank][chunk][0].__class__.decoder) if (
                    lay[rank][chunk]) else 0  # fmt: skip
            else:
                start = get_transformer_layer_offset(cfg, vp_stage=vp, pp_rank=rank)
                count = get_num_layers_to_build(cfg, vp_stage=vp, pp_rank=rank)
            row.append(list(range(start, start + count)))
        out.append(row)
    return out


SPLITS = [
    (8, 2, None, PipelineSplit()),
    (8, 2, 2, PipelineSplit()),
    (13, 4, None, PipelineSplit(num_layers_in_first_pipeline_stage=3,
                                num_layers_in_last_pipeline_stage=2)),
    (12, 4, None, PipelineSplit(num_layers_in_first_pipeline_stage=3,
                                num_layers_in_last_pipeline_stage=2)),
    (14, 3, 2, PipelineSplit(num_layers_in_first_pipeline_stage=4)),
    (14, 3, 2, PipelineSplit(num_layers_in_first_pipeline_stage=3)),
    (4, 1, None, PipelineSplit(num_layers_in_first_pipeline_stage=3)),
    (4, 1, None, PipelineSplit(num_layers_in_first_pipeline_stage=4)),
    (10, 4, None, PipelineSplit(account_for_embedding_in_pipeline_split=True,
                                account_for_loss_in_pipeline_split=True)),
    (14, 4, 2, PipelineSplit(account_for_embedding_in_pipeline_split=True,
                             account_for_loss_in_pipeline_split=True)),
    (11, 4, None, PipelineSplit(account_for_loss_in_pipeline_split=True)),
    (61, 4, None, PipelineSplit(pipeline_model_parallel_layout="Et*4|(t*4|)*14tL")),
    (61, 4, None, PipelineSplit(pipeline_model_parallel_layout="Et*16|t*16|t*16|t*13L")),
    (60, 4, None, PipelineSplit(pipeline_model_parallel_layout="Et*16|t*16|t*16|t*13L")),
    (8, 2, None, PipelineSplit(num_layers_in_last_pipeline_stage=3,
                               account_for_loss_in_pipeline_split=True)),
]  # fmt: skip


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize(("n", "pp", "vpp", "split"), SPLITS)
def test_pipeline_chunks_agree_with_megatron_core(
    n: int, pp: int, vpp: int | None, split: PipelineSplit
) -> None:
    """dse's placement (dse.space.layout.pipeline_chunks) against Megatron-Core's own code:
    the same refusals, the same layers on every rank and chunk."""
    from tests.conftest import require_megatron

    require_megatron()
    try:
        want = _megatron_chunks(n, pp, vpp, split)
    except (ValueError, AssertionError):
        with pytest.raises(PipelineSplitError):
            pipeline_chunks(n, pp, vpp, split)
        return
    assert pipeline_chunks(n, pp, vpp, split) == want


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_the_differential_cases_cover_both_outcomes() -> None:
    """Of SPLITS, Megatron-Core refuses 6 and places 9 (so both branches above are tested)."""
    from tests.conftest import require_megatron

    require_megatron()
    refused = 0
    for n, pp, vpp, split in SPLITS:
        try:
            _megatron_chunks(n, pp, vpp, split)
        except (ValueError, AssertionError):
            refused += 1
    assert (refused, len(SPLITS) - refused) == (6, 9)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("freq", [1, 2, 3, [0, 0, 1, 1, 0, 1]])
def test_moe_layer_pattern_is_megatron_cores(freq: Any) -> None:
    """dse's pattern against the layer specs Megatron-Core 0.16.1 builds from the same
    moe_layer_freq (gpt_layer_specs.get_gpt_decoder_layer_specs): MoE where its spec's MLP
    is a MoELayer."""
    from tests.conftest import require_megatron

    require_megatron()
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=6, hidden_size=8, num_attention_heads=2,
                            num_moe_experts=4, moe_layer_freq=freq)  # fmt: skip
    specs = get_gpt_decoder_layer_specs(cfg, use_transformer_engine=False)
    want = [int(s.submodules.mlp.module is MoELayer) for s in specs]
    got = ModelSpec(**{**TINY, "num_layers": 6, "moe_layer_freq": freq}).moe_layer_pattern()
    assert got == want and 0 < sum(want)
