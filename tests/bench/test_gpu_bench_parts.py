"""Parts of the GPU benches and of the trainer's GPU path that a CPU can check (issue 36):

* ``bench/speed_ab.py``'s profile summary classifies device work by kernel name and leaves the
  profiler's annotations out (a synthetic Chrome trace: a ``ProfilerStep`` range on the
  device's timeline once counted as "elementwise/other" and hid the matmul share);
* ``bench/measure_table.py`` writes every ``ModelSpec`` field in a row's ``model`` (the hybrid
  pattern and the Mamba fields too), and a reader rebuilds the same model from it;
* the trainer seeds Megatron-Core's RNG tracker afresh (``force_reset_rng``), so a graph-safe
  tracker is made even where the process made another one before (Megatron-Core's real
  ``initialize_rng_tracker``);
* the stored Triton autotune choice of kernels with pre-hooks
  (``dse.workloads.megatron._autotune_cache``): read back only for the same configurations.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dse.space.searchspace import ModelSpec, load_space
from dse.space.tablemodel import space_model_fields
from tests.conftest import EXAMPLES

REPO = Path(__file__).resolve().parents[2]


def _bench(name: str) -> Any:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(
            f"bench_{name}", REPO / "bench" / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(REPO / "bench"))


def _k(name: str, ts: float, dur: float, cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_profile_summary_counts_kernels_by_name_and_leaves_annotations_out() -> None:
    ab = _bench("speed_ab")
    # one 1000 us step: 540 us of GEMMs, 100 us attention, 60 us norm, 50 us optimizer,
    # 200 us elementwise, 35 us copies, 15 us idle; the profiler's step range and a
    # record_function range lie on the device's timeline over all of it
    kernels = [
        _k("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NTN", 0, 300),
        _k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 300, 240),
        _k("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", 540, 100),
        _k("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel", 640, 60),
        _k("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 700, 50),
        _k("void at::native::vectorized_elementwise_kernel<4, silu>", 750, 200),
        _k("Memcpy DtoD (Device -> Device)", 950, 35, cat="gpu_memcpy"),
    ]
    annotations = [
        _k("ProfilerStep#2", 0, 1000, cat="gpu_user_annotation"),
        _k("forward", 0, 640, cat="gpu_user_annotation"),
        _k("ProfilerStep#2", 0, 1000, cat="user_annotation"),
        _k("aten::mm", 0, 300, cat="cpu_op"),
        _k("cudaLaunchKernel", 1, 5, cat="cuda_runtime"),
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 3},
    ]
    s = ab.summarise_trace(annotations[:2] + kernels + annotations[2:], wall_s=1000e-6)
    share = s["by_kind_share"]
    assert s["kernels"] == len(kernels)
    assert share["matmul"] == pytest.approx(540 / 985)
    assert share["attention"] == pytest.approx(100 / 985)
    assert share["norm"] == pytest.approx(60 / 985)
    assert share["optimizer"] == pytest.approx(50 / 985)
    assert share["memcpy/memset"] == pytest.approx(35 / 985)
    assert share["elementwise/other"] == pytest.approx(200 / 985)
    assert s["idle_share"] == pytest.approx(0.015)
    assert s["left_out"] == {"cpu_op": 1, "cuda_runtime": 1, "gpu_user_annotation": 2,
                             "user_annotation": 1}  # fmt: skip
    assert all(name != "ProfilerStep#2" for name, _ in s["top"])


def test_profile_summary_counts_overlapping_kernels_once_in_the_busy_time() -> None:
    ab = _bench("speed_ab")
    s = ab.summarise_trace(
        [_k("nvjet_a", 0, 400), _k("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 100, 400)],
        wall_s=1000e-6,
    )
    assert s["busy_union_s"] == pytest.approx(500e-6)
    assert s["kernel_s"] == pytest.approx(800e-6)
    assert s["by_kind_share"]["communication"] == pytest.approx(0.5)
    assert s["idle_share"] == pytest.approx(0.5)


def test_measured_table_rows_carry_every_model_field() -> None:
    mt = _bench("measure_table")
    space = load_space(EXAMPLES / "nemotron_h_proxy_h200.yaml")
    row = mt.model_row(space)
    assert set(ModelSpec.model_fields) <= set(row)
    assert row["hybrid_layer_pattern"] == "MEMEM*EMEMEM*"
    assert row["mamba_num_heads"] == 64 and row["mamba_state_dim"] == 128
    assert row["num_moe_experts"] == 16 and row["moe_router_topk"] == 6
    assert row["activation"] == "squared_relu" and row["gated_linear_unit"] is False
    assert row["seq_length"] == 4096 and row["global_batch_size"] == 16
    json.dumps(row)  # a JSON line
    # the reader's model section is the space's model again
    assert ModelSpec.model_validate(space_model_fields(row)) == space.model


def test_rng_tracker_is_made_afresh_for_cuda_graphs() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as mrandom

    from dse.workloads.megatron._speed import rng_seed_kwargs

    plain = rng_seed_kwargs({}, tensor_parallel)
    graphs = rng_seed_kwargs({"cuda_graph_impl": "local"}, tensor_parallel)
    assert plain == {"use_cudagraphable_rng": False, "force_reset_rng": True}
    assert graphs == {"use_cudagraphable_rng": True, "force_reset_rng": True}
    import torch

    try:
        # a trial without graphs made the process's tracker first
        mrandom.initialize_rng_tracker(use_cudagraphable_rng=False, force_reset=True)
        first = mrandom.get_cuda_rng_tracker()
        # what Megatron-Core does when asked again without the reset: the old one is kept
        mrandom.initialize_rng_tracker(use_cudagraphable_rng=True)
        assert mrandom.get_cuda_rng_tracker() is first and not first.use_cudagraphable_rng
        # the trainer's arguments (model_parallel_cuda_manual_seed passes them on): a new one
        mrandom.initialize_rng_tracker(
            use_cudagraphable_rng=plain["use_cudagraphable_rng"],
            force_reset=plain["force_reset_rng"],
        )
        assert mrandom.get_cuda_rng_tracker() is not first
        if hasattr(torch.cuda.CUDAGraph, "register_generator_state") and hasattr(
            torch.Generator, "graphsafe_set_state"
        ):  # this torch has graph-safe generators (CUDA builds): the graph-safe tracker
            mrandom.initialize_rng_tracker(
                use_cudagraphable_rng=graphs["use_cudagraphable_rng"],
                force_reset=graphs["force_reset_rng"],
            )
            assert mrandom.is_graph_safe_cuda_rng_tracker(mrandom.get_cuda_rng_tracker())
    finally:
        mrandom.initialize_rng_tracker(force_reset=True)


class _Cfg:
    """Stands for a ``triton.Config``: its text and its pre-hook (what the key reads)."""

    def __init__(self, block: int, hook: Any = None) -> None:
        self.block, self.pre_hook = block, hook

    def __str__(self) -> str:
        return f"BLOCK: {self.block}, num_warps: 4"


def _zero(_args: dict[str, Any]) -> None:
    pass


def test_autotune_choice_is_read_back_only_for_the_same_configurations() -> None:
    from dse.workloads.megatron import _autotune_cache as ac

    configs = [_Cfg(32, _zero), _Cfg(64, _zero), _Cfg(128, _zero)]
    timings = {configs[0]: [3.0, 2.9, 3.1], configs[1]: [1.0, 0.9, 1.1], configs[2]: [2.0] * 3}
    text = ac.dump_choice((128, 64, "torch.bfloat16"), configs, configs[1], timings)
    # another process: its own, equal configuration objects
    again = [_Cfg(32, _zero), _Cfg(64, _zero), _Cfg(128, _zero)]
    best, got = ac.load_choice(text, again) or (None, None)
    assert best == 1 and got == [[3.0, 2.9, 3.1], [1.0, 0.9, 1.1], [2.0, 2.0, 2.0]]
    assert ac.load_choice(text, again[::-1]) is None  # another order
    assert ac.load_choice(text, again[:2]) is None  # another pruning
    assert ac.load_choice(text, [_Cfg(32), _Cfg(64), _Cfg(128)]) is None  # no pre-hooks
    assert ac.load_choice(None, again) is None
    assert ac.load_choice("{not json", again) is None
    bad = json.loads(text)
    bad["best"] = 7
    assert ac.load_choice(json.dumps(bad), again) is None
    assert "pre_hook: _zero" in ac.describe_config(configs[0])


def test_the_measured_hybrid_table_rebuilds_the_proxy_and_replays() -> None:
    """examples/tables/h200_hybrid_proxy_1gpu.jsonl (issue 36, measured on one H200 by
    bench/hybrid_gpu.sh table): at least 24 rows, each row's model carrying every ModelSpec
    field, the proxy's model rebuilt from it, and a replay space over its knobs."""
    from dse.stats.table import read_table
    from dse.workloads.replay import ReplayTable

    path = REPO / "examples" / "tables" / "h200_hybrid_proxy_1gpu.jsonl"
    rows = read_table(path)
    assert len(rows) >= 24 and len({json.dumps(r.params, sort_keys=True) for r in rows}) == len(
        rows
    )
    proxy = load_space(EXAMPLES / "nemotron_h_proxy_h200.yaml").model
    # moe_layer_freq, frozen_params and the Multi-Latent Attention fields came after the table
    # was measured (issue 38); their defaults (every layer's MLP an MoE, nothing frozen, standard
    # attention) are the proxy's, checked just below
    later = {
        "moe_layer_freq",
        "frozen_params",
        "multi_latent_attention",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_head_dim",
        "qk_pos_emb_head_dim",
        "v_head_dim",
        "qk_layernorm",
    }
    for r in rows:
        assert set(ModelSpec.model_fields) - later <= set(r.model)
        assert ModelSpec.model_validate(space_model_fields(r.model)) == proxy
        assert r.status in ("ok", "oom")
        if r.status == "ok":
            assert r.metrics["peak_mem_gib"] > 0 and r.metrics["step_time_s"] > 0
            assert r.metrics["mamba_kernels"]["ssd"] == "mamba_ssm-triton"
    space = ReplayTable.load(path).to_space("hybrid-replay")
    assert space.model == proxy
    assert {"micro_batch_size", "recompute", "use_mamba_mem_eff_path"} <= set(space.knobs)
