"""The throughput estimate on MoE and hybrid Mamba-MoE models against published Megatron
figures (estimates, labelled so): the Omni prior and tuned recipes (Megatron-Bridge PR
#5524), Qwen3-30B-A3B on 16 H100 (PR #5123), and the physics each term stands for."""

from __future__ import annotations

from pathlib import Path

import pytest

import dse.model.costmodel.throughput as thr
from dse.model.flops import model_flops_per_step
from dse.space.searchspace import load_space
from tests.space.test_hybrid import TUNED

ROOT = Path(__file__).resolve().parents[3]
OMNI = ROOT / "examples" / "nemotron_omni.yaml"
QWEN = ROOT / "examples" / "qwen3_30b_a3b.yaml"

#: Published: tuned 197.1 TFLOP/s/GPU at 3,603.67 ms per step; prior 111 TFLOP/s/GPU on
#: the same work per step (the card's FLOPs also count the vision encoder).
TUNED_STEP_S = 3.60367
PRIOR_STEP_S = TUNED_STEP_S * 197.1 / 111.0
#: Qwen3-30B-A3B, 16 H100, BF16, TP1 EP16 HybridEP, MBS1, GBS 1024: 20,147.29 ms.
QWEN_STEP_S = 20.14729


def _thr(space, params):
    p = space.full_params(space.apply_conditions({**space.baseline(), **params}))
    return thr.estimate_throughput(space.model, space.semantics, space.resources, p)


@pytest.fixture(scope="module")
def omni():
    return load_space(OMNI)


def test_omni_prior_and_tuned_step_times_within_15_percent(omni):
    tuned, prior = _thr(omni, TUNED), _thr(omni, {})
    assert tuned["source"] == prior["source"] == "estimate"
    assert tuned["step_time_s"] == pytest.approx(TUNED_STEP_S, rel=0.15)
    assert prior["step_time_s"] == pytest.approx(PRIOR_STEP_S, rel=0.15)
    # dse counts the language model's FLOPs only (the card adds the vision encoder)
    flops = model_flops_per_step(omni.model, omni.semantics, tensor_model_parallel_size=2)
    assert tuned["tflops_per_gpu"] == pytest.approx(flops / (TUNED_STEP_S * 8e12), rel=0.15)
    assert tuned["tflops_per_gpu"] > 1.5 * prior["tflops_per_gpu"]


def test_qwen3_moe_step_time_is_a_held_out_check():
    """A pure MoE transformer (no Mamba layer): the MoE terms alone, EP 16 over two nodes."""
    qwen = load_space(QWEN)
    est = _thr(
        qwen,
        {
            "expert_model_parallel_size": 16,
            "micro_batch_size": 1,
            "recompute": "none",
            "moe_token_dispatcher_type": "flex",
            "moe_flex_dispatcher_backend": "hybridep",
        },
    )
    assert est["step_time_s"] == pytest.approx(QWEN_STEP_S, rel=0.25)


def test_mamba_scan_time_follows_tokens_not_the_heads_a_rank_holds(omni):
    """The calibrated scan term is per token of the micro-batch: TP 4 does not halve it
    against TP 2, and with DP halved each rank runs twice the micro-batches."""
    base = {k: v for k, v in TUNED.items() if k != "tensor_model_parallel_size"}

    def scan_share(tp):
        p = {**base, "tensor_model_parallel_size": tp}
        with_scan = _thr(omni, p)["breakdown_s"]["compute"]
        saved = thr.MAMBA_SCAN_S_PER_TOKEN
        thr.MAMBA_SCAN_S_PER_TOKEN = 0.0
        try:
            without = _thr(omni, p)["breakdown_s"]["compute"]
        finally:
            thr.MAMBA_SCAN_S_PER_TOKEN = saved
        return with_scan - without

    assert scan_share(4) == pytest.approx(2 * scan_share(2), rel=1e-9)


def test_expert_work_per_rank_is_shared_by_tp_whatever_the_etp(omni):
    """Balanced routing: a rank runs 1/TP of its micro-batch's expert work with ETP 1 (EP
    splits the tokens) as with ETP = TP (the expert FFN is split)."""
    saved = thr.MAMBA_SCAN_S_PER_TOKEN
    etp1 = _thr(omni, {**TUNED, "expert_model_parallel_size": 4})
    etp2 = _thr(
        omni,
        {**TUNED, "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 2},
    )
    assert thr.MAMBA_SCAN_S_PER_TOKEN == saved
    # same work; the grouped GEMMs' M differs (per-expert tokens), so only close
    assert etp1["breakdown_s"]["compute"] == pytest.approx(
        etp2["breakdown_s"]["compute"], rel=0.05
    )


def test_alltoall_waits_for_the_host_flex_does_not(omni):
    a2a = _thr(omni, {**TUNED, "moe_token_dispatcher_type": "alltoall"})
    flex = _thr(omni, TUNED)
    assert a2a["breakdown_s"]["compute"] > flex["breakdown_s"]["compute"]


def test_hierarchical_dispatch_sends_a_token_once_per_remote_node():
    """Across nodes the flex dispatchers send a token once per remote node; the all-to-all
    sends each of its top-k copies over InfiniBand."""
    qwen = load_space(QWEN)
    common = {"expert_model_parallel_size": 16, "micro_batch_size": 1, "recompute": "none"}
    flex = _thr(qwen, {**common, "moe_token_dispatcher_type": "flex"})
    a2a = _thr(qwen, {**common, "moe_token_dispatcher_type": "alltoall"})
    assert a2a["breakdown_s"]["communication"] > 3 * flex["breakdown_s"]["communication"]
