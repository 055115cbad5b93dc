"""The cost model on hybrid Mamba-MoE models: layer kinds, per-module recompute, the
precision-aware optimizer's dtypes, FP8 and the flex dispatcher's buffers; the Omni tuned
recipe against its published peak (estimates, labelled so)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dse.cli.main import main
from dse.model.costmodel.memory import GIB, Coefficients, estimate_memory
from dse.space.searchspace import load_space
from tests.space.test_hybrid import TUNED

ROOT = Path(__file__).resolve().parents[3]
OMNI = ROOT / "examples" / "nemotron_omni.yaml"

#: Published peaks (MiB) of the Omni verification card (Megatron-Bridge PR #5524).
TUNED_4K_MIB = 76_349
PACKED_8K_MIB = 75_197

#: The 8K packed variant: TP4 CP2 EP8 alltoall MBS2, seq 8192, the tuned optimizer dtypes.
PACKED_8K = {
    "tensor_model_parallel_size": 4,
    "context_parallel_size": 2,
    "expert_model_parallel_size": 8,
    "micro_batch_size": 2,
    "moe_token_dispatcher_type": "alltoall",
    "recompute": "none",
    "attention_backend": "flash",
    "cross_entropy_fusion_impl": "native",
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


def _est(space, params, co=None, semantics=None):
    p = space.full_params(space.apply_conditions({**space.baseline(), **params}))
    return estimate_memory(space.model, semantics or space.semantics, space.resources, p, co)


def test_example_elastic_coefficient_is_the_8k_fit(omni):
    """The example's one calibrated coefficient comes from the 8K figure alone, and it is
    the elastic reserve, not memory every layout needs (the context stays physical)."""
    sem8 = omni.semantics.model_copy(update={"seq_length": 8192})
    physics = _est(omni, PACKED_8K, Coefficients(), sem8)
    fitted = PACKED_8K_MIB / 1024 - physics.total_gib
    assert omni.prescreen.coefficients == {"elastic_gib": pytest.approx(fitted, abs=0.05)}
    co = Coefficients.from_dict(omni.prescreen.coefficients)
    assert _est(omni, PACKED_8K, co, sem8).total_gib == pytest.approx(physics.total_gib)


def test_tuned_omni_fits_80gb_and_is_within_15_percent_of_its_published_peak(omni):
    co = Coefficients.from_dict(omni.prescreen.coefficients)
    cap = omni.resources.gpu_memory_gib
    tuned = _est(omni, TUNED, co)
    published = TUNED_4K_MIB / 1024
    assert tuned.total_gib <= cap
    assert tuned.device_peak_gib(cap) == pytest.approx(published, rel=0.15)
    prior = _est(omni, {}, co)
    assert prior.total_gib > tuned.total_gib  # the prior keeps fp32 states and grads


def test_the_prior_recipe_fits_80gb(omni):
    """The prior recipe ran (111 TFLOP/s/GPU published): its need must fit. Its static state
    alone is 70.5 GiB (fp32 master and moments of 3.67B expert parameters unsharded at
    expert-DP 1, fp32 gradients), so no fixed 18 GiB overhead can be part of that need."""
    co = Coefficients.from_dict(omni.prescreen.coefficients)
    cap = omni.resources.gpu_memory_gib
    prior = _est(omni, {}, co)
    assert prior.static_gib == pytest.approx(70.45, abs=0.05)
    assert prior.total_gib <= cap
    assert prior.device_peak_gib(cap) == cap  # the reserve takes what the GPU has left
    assert prior.device_peak_gib(None) == pytest.approx(prior.total_gib + co.elastic_gib)


def test_precision_aware_optimizer_step_unscales_fp16_master_weights(omni):
    """TE FusedAdam keeps fp32 copies of a parameter group's fp16 master weights (and of
    moments unless both are bf16) during the step; the expert group is the larger one."""
    tuned = _est(omni, TUNED)
    step = tuned.details["optimizer_step_gib"]
    expert = tuned.details["stages"]["0"]["expert_params"]
    assert step == pytest.approx(4 * expert / GIB, rel=1e-6)  # fp16 master only
    fp16_moments = _est(omni, {**TUNED, "exp_avg_dtype": "fp16", "exp_avg_sq_dtype": "fp16"})
    assert fp16_moments.details["optimizer_step_gib"] == pytest.approx(3 * step, rel=1e-6)
    remainders = _est(omni, {**TUNED, "main_params_dtype": "fp32", "store_param_remainders": True})
    assert remainders.details["optimizer_step_gib"] == 0.0
    assert _est(omni, {}).details["optimizer_step_gib"] == 0.0  # fp32 states: no copies


def test_recompute_modules_moe_layernorm_is_what_makes_it_small(omni):
    none = _est(omni, {**TUNED, "recompute": "none"})
    moe = _est(omni, {**TUNED, "recompute_modules": "moe"})
    both = _est(omni, TUNED)
    assert none.activations_gib > moe.activations_gib > both.activations_gib
    moe_kind = none.details["layer_kind_gib"]["moe"]["saved"]
    assert both.details["layer_kind_gib"]["moe"]["saved"] < moe_kind / 10


def test_mamba_layers_hold_activations(omni):
    est = _est(omni, TUNED)
    kinds = est.details["layer_kind_gib"]
    # 23 Mamba layers of 16384 tokens: in_proj output, scan output, norm input and output
    assert kinds["mamba"]["saved"] > kinds["attention"]["saved"]
    stage = est.details["stages"]["0"]["layers"]
    per_layer = est.activations_gib / sum(stage.values())
    assert per_layer == pytest.approx(
        sum(kinds[k]["saved"] * n for k, n in stage.items()) / sum(stage.values()), rel=0.2
    )


def test_optimizer_dtypes_and_param_remainders(omni):
    pa = {**TUNED, "main_params_dtype": "fp32", "store_param_remainders": True}
    remainders = _est(omni, pa)
    fp32_master = _est(omni, {**pa, "store_param_remainders": False})
    assert remainders.details["master_bytes_per_param"] == 2
    assert fp32_master.details["master_bytes_per_param"] == 4
    assert fp32_master.optimizer_gib > remainders.optimizer_gib
    prior = _est(omni, {})  # no precision-aware optimizer: fp32 master, moments and grads
    assert prior.details["master_bytes_per_param"] == 4
    assert prior.gradients_gib == pytest.approx(2 * _est(omni, TUNED).gradients_gib, rel=0.3)


def test_flex_dispatcher_buffers_and_fp8_weights(omni):
    flex = _est(omni, TUNED)
    a2a = _est(omni, {**TUNED, "moe_token_dispatcher_type": "alltoall"})
    assert flex.buffers_gib > 0 and a2a.buffers_gib == 0
    fp8 = _est(omni, {**TUNED, "fp8": "e4m3", "fp8_recipe": "tensorwise"})
    fp8p = _est(omni, {**TUNED, "fp8": "e4m3", "fp8_recipe": "tensorwise", "fp8_param": True})
    assert fp8.weights_gib > flex.weights_gib > fp8p.weights_gib


def test_frozen_encoders_count_as_weights_only(omni):
    est = _est(omni, TUNED)
    frozen = est.details["stages"]["0"]["frozen_params"]
    assert frozen == omni.model.frozen_params > 1e9
    assert est.weights_gib * GIB == pytest.approx(
        2 * (est.details["stages"]["0"]["params"] + frozen), rel=1e-6
    )


def test_dse_estimate_json_for_the_tuned_configuration(capsys):
    sets = []
    for k, v in TUNED.items():
        sets += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    assert main(["estimate", "--space", str(OMNI), *sets, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "estimate"
    assert out["fits"] is True
    assert out["params"]["recompute_modules"] == "moe,layernorm"
    assert out["memory"]["device_peak_gib"] == pytest.approx(TUNED_4K_MIB / 1024, rel=0.15)
    assert out["memory"]["total_gib"] <= out["capacity_gib"]
