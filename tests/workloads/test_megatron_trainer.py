"""The built-in Megatron-Core trial process (dse.workloads.megatron).

Fast tests cover the torch-free parts (plan, checks, metrics file, data slicing, weight
keys). Tests marked ``slow`` run the real trainer under torchrun on CPU (gloo) with a tiny
GPT and compare loss curves across layouts; each torchrun costs ~10 s here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dse.core.records import Outcome, TrialSpec, read_metrics
from dse.workloads.megatron._plan import TrialFailure, make_plan
from tests.conftest import needs_megatron, require_megatron

TINY_MODEL = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "ffn_hidden_size": 128,
    "vocab_size": 1024,
}
TINY_SEM = {
    "global_batch_size": 8,
    "seq_length": 64,
    "steps": 4,
    "warmup_steps": 1,
    "precision": "fp32",
    "lr": 1e-3,
}


def make_spec(
    tmp: Path,
    name: str,
    params: dict[str, Any] | None = None,
    *,
    world: int = 1,
    model: dict[str, Any] | None = None,
    semantics: dict[str, Any] | None = None,
    features: list[str] | None = None,
) -> TrialSpec:
    return TrialSpec(
        study="t",
        trial_number=0,
        params=params or {},
        model={**TINY_MODEL, **(model or {})},
        semantics={**TINY_SEM, **(semantics or {})},
        world_size=world,
        device="cpu",
        metrics_path=str(tmp / f"{name}.jsonl"),
        features=features,
    )


# --- plan and checks (no torch) ------------------------------------------------------------


def test_plan_derives_layout_and_microbatches(tmp_path: Path) -> None:
    spec = make_spec(
        tmp_path,
        "p",
        {"tensor_model_parallel_size": 2, "micro_batch_size": 2, "attention_backend": "sdpa"},
        world=4,
    )
    plan = make_plan(spec)
    assert (plan.layout.tp, plan.layout.pp, plan.layout.cp, plan.layout.dp) == (2, 1, 1, 2)
    assert plan.layout.num_microbatches == 8 // (2 * 2)
    assert plan.local_spec and plan.attention_backend == "sdpa"
    # attention fields are the trainer's business, not copied into TransformerConfig
    assert "attention_backend" not in plan.fields["model"]
    assert plan.fields["train"] == {"micro_batch_size": 2}
    assert plan.layout.as_dict()["num_microbatches"] == 2


@pytest.mark.parametrize(
    ("params", "world", "model", "match"),
    [
        ({"micro_batch_size": 3}, 1, None, "global_batch_size=8, micro_batch_size=3, dp=1"),
        ({"tensor_model_parallel_size": 2}, 3, None, "world_size=3, tp=2"),
        ({"virtual_pipeline_model_parallel_size": 2}, 1, None, "virtual pipeline needs PP > 1"),
        ({"expert_model_parallel_size": 2}, 2, None, "expert parallelism needs num_moe_experts"),
        ({"tensor_model_parallel_sise": 2}, 1, None, "did you mean"),
        ({"recompute": "some"}, 1, None, "knob recompute"),
        (
            {"tensor_model_parallel_size": 2},
            2,
            {"num_moe_experts": 4},
            "MoE with TP > 1 needs sequence_parallel",
        ),
    ],
)
def test_plan_rejects_impossible_layouts(
    tmp_path: Path, params: dict[str, Any], world: int, model: Any, match: str
) -> None:
    with pytest.raises(TrialFailure, match=match) as err:
        make_plan(make_spec(tmp_path, "p", params, world=world, model=model))
    assert err.value.failure_class == "invalid"


def test_features_are_checked_against_the_knob_catalog(tmp_path: Path) -> None:
    def plan(params: dict[str, Any], features: list[str]) -> Any:
        return make_plan(make_spec(tmp_path, "p", params), features)

    with pytest.raises(TrialFailure, match="needs transformer_engine") as err:
        plan({"attention_backend": "te"}, [])
    assert err.value.failure_class == "invalid"
    plan({"attention_backend": "te"}, ["transformer_engine"])
    with pytest.raises(TrialFailure, match="needs deepep"):
        plan({"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}, [])
    # the backend of a dispatcher that is not used needs nothing
    plan({"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": "deepep"}, [])


def test_local_spec_limits_are_invalid(tmp_path: Path) -> None:
    sp = {"tensor_model_parallel_size": 2, "sequence_parallel": True}
    with pytest.raises(TrialFailure, match="sp_needs_te_norm"):  # RMSNorm: a torch norm
        make_plan(make_spec(tmp_path, "p", sp, world=2), ["transformer_engine", "apex"])
    cp = make_spec(tmp_path, "p", {"context_parallel_size": 2}, world=2)
    with pytest.raises(TrialFailure, match="context parallelism needs Transformer Engine"):
        make_plan(cp, [])
    te = {"context_parallel_size": 2, "attention_backend": "te"}
    make_plan(make_spec(tmp_path, "p", te, world=2), ["transformer_engine"])


def test_importing_the_package_does_not_import_torch() -> None:
    code = (
        "import sys, dse.workloads.megatron, dse.workloads.megatron.trainer\n"
        "assert 'torch' not in sys.modules and 'megatron' not in sys.modules\n"
        "print(dse.workloads.megatron.TRAINER_MODULE)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "dse.workloads.megatron.trainer"


# --- data and weights (torch, no megatron) ---------------------------------------------------


@needs_megatron
def test_global_batches_do_not_depend_on_the_layout(tmp_path: Path) -> None:
    import torch

    from dse.space.searchspace import DataSpec
    from dse.workloads.megatron._data import GlobalBatches

    data = GlobalBatches(DataSpec(seed=7), global_batch_size=8, seq_length=16, vocab_size=50)
    b0 = data.global_batch(3)
    assert torch.equal(b0, data.global_batch(3)) and not torch.equal(b0, data.global_batch(4))
    assert b0.shape == (8, 17) and int(b0.max()) < 50
    for dp, mbs in [(1, 1), (2, 1), (2, 2), (4, 2), (8, 1)]:
        rows = []
        for r in range(dp):
            for tokens, labels in data.microbatches(
                b0, dp_rank=r, dp_size=dp, micro_batch_size=mbs
            ):
                assert tokens.shape == (mbs, 16) and torch.equal(tokens[:, 1:], labels[:, :-1])
                rows.extend(torch.cat([tokens, labels[:, -1:]], dim=1))
        assert torch.equal(
            torch.stack(sorted(rows, key=lambda t: t.tolist())),
            torch.stack(sorted(b0, key=lambda t: t.tolist())),
        )


@needs_megatron
def test_token_file_data(tmp_path: Path) -> None:
    import numpy as np

    from dse.space.searchspace import DataSpec
    from dse.workloads.megatron._data import GlobalBatches

    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(1000, dtype=np.int32) % 97)
    data = GlobalBatches(
        DataSpec(kind="path", path=str(path)), global_batch_size=4, seq_length=8, vocab_size=97
    )
    batch = data.global_batch(1)
    assert batch.shape == (4, 9)
    assert batch[0].tolist() == [(32 + i) % 97 for i in range(9)]  # step 1 starts at 4 * 8
    small = GlobalBatches(
        DataSpec(kind="path", path=str(path)), global_batch_size=4, seq_length=8, vocab_size=50
    )
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small.global_batch(1)  # ids 32..64


@needs_megatron
def test_weight_keys_and_tensor_parallel_slices() -> None:
    import torch

    from dse.workloads.megatron._init import param_key, tp_slice

    layers = {0: 5, 1: 6}
    assert param_key("decoder.layers.1.mlp.linear_fc1.weight", layers, 0, False) == (
        "layers.6.mlp.linear_fc1.weight"
    )
    assert param_key(
        "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight", layers, 4, False
    ) == ("layers.5.mlp.experts.5.linear_fc2.weight")
    assert param_key("decoder.layers.0.mlp.experts.weight1", layers, 0, False) is None
    assert param_key("output_layer.weight", layers, 0, True) == "word_embeddings"
    assert param_key("output_layer.weight", layers, 0, False) == "output_layer"
    full = torch.arange(8).reshape(8, 1)
    # stride 2 (SwiGLU fc1 = [gate; up]): rank r gets gate and up rows of its partition
    assert tp_slice(full, 0, 2, 0, 2).flatten().tolist() == [0, 1, 4, 5]
    assert tp_slice(full, 0, 2, 1, 2).flatten().tolist() == [2, 3, 6, 7]
    assert tp_slice(full, 0, 1, 1, 2).flatten().tolist() == [4, 5, 6, 7]


# --- real training under torchrun (slow) ---------------------------------------------------


def run_trial(spec: TrialSpec, tmp: Path, *, torchrun: bool = True) -> tuple[int, Outcome]:
    path = tmp / f"{Path(spec.metrics_path).stem}.json"
    path.write_text(spec.model_dump_json())
    module = ["-m", "dse.workloads.megatron.trainer", "--spec", str(path)]
    if torchrun:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={spec.world_size}",
            *module,
        ]
    else:
        cmd = [sys.executable, *module]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    out = read_metrics(spec.metrics_path)
    assert out is not None, f"no final metrics line; rc={proc.returncode}\n{proc.stderr[-3000:]}"
    return proc.returncode, out


def losses(out: Outcome) -> list[float]:
    assert out.ok, f"{out.failure_class}: {out.reason}"
    return list(out.metrics["losses"])


CONFIGS: dict[str, tuple[dict[str, Any], int, dict[str, Any]]] = {
    "tp1": ({}, 1, {}),
    "tp2": ({"tensor_model_parallel_size": 2}, 2, {}),
    "dp2_full_recompute": ({"recompute": "full"}, 2, {}),
    "pp2": ({"pipeline_model_parallel_size": 2}, 2, {}),
    "pp2_vpp2": (
        {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
        2,
        {},
    ),
    "sdpa_tp2_selective": (
        {"attention_backend": "sdpa", "tensor_model_parallel_size": 2, "recompute": "selective"},
        2,
        {},
    ),
    "bf16_distopt": (
        {"use_distributed_optimizer": True, "overlap_grad_reduce": True, "micro_batch_size": 2},
        2,
        {"precision": "bf16"},
    ),
}


@pytest.fixture(scope="module")
def trials(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Outcome]]:
    """Every configuration of CONFIGS, trained once for the module."""
    require_megatron()
    tmp = tmp_path_factory.mktemp("megatron_trials")
    out = {}
    for name, (params, world, sem) in CONFIGS.items():
        out[name] = run_trial(make_spec(tmp, name, params, world=world, semantics=sem), tmp)
    return out


@pytest.mark.slow
def test_tp1_trains_and_writes_steps_and_summary(trials: dict[str, Any]) -> None:
    rc, out = trials["tp1"]
    assert rc == 0 and out.ok and out.source == "measured"
    assert [s.step for s in out.steps] == [0, 1, 2, 3]
    m = out.metrics
    assert m["device"] == "cpu" and m["world_size"] == 1 and m["dp"] == 1
    assert m["num_microbatches"] == 8 and m["steps"] == 4 and m["init"] == "layout_invariant"
    assert m["loss"] == out.steps[-1].loss and len(m["losses"]) == 4
    assert all(0 < s.loss < 10 for s in out.steps)  # ~ln(1024) = 6.93 on random tokens
    assert m["losses"][-1] < m["losses"][0]
    assert m["tflops_per_gpu"] > 0 and m["peak_mem_gib"] > 0.05 and m["step_time_s"] > 0
    assert all(s.grad_norm is not None and s.grad_norm > 0 for s in out.steps)
    # where the trial's own time went apart from its steps (issue 36's accounting); no Triton
    # autotune record on a CPU
    assert m["setup_s"] > 0 and m["build_s"] > 0 and m["step_gaps_s"] >= 0
    assert "triton_autotune" not in m


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tp2", "dp2_full_recompute", "pp2", "pp2_vpp2"])
def test_layouts_reproduce_tp1_losses(trials: dict[str, Any], name: str) -> None:
    """Same global batches and layout-invariant weights: the same loss curve (fp32)."""
    base = losses(trials["tp1"][1])
    rc, out = trials[name]
    assert rc == 0
    assert losses(out) == pytest.approx(base, abs=1e-3)
    assert out.metrics["world_size"] == 2


@pytest.mark.slow
def test_sdpa_matches_unfused_attention(trials: dict[str, Any]) -> None:
    rc, out = trials["sdpa_tp2_selective"]
    assert rc == 0 and out.metrics["attention_backend"] == "sdpa"
    assert losses(out) == pytest.approx(losses(trials["tp1"][1]), abs=1e-4)


@pytest.mark.slow
def test_bf16_with_distributed_optimizer(trials: dict[str, Any]) -> None:
    rc, out = trials["bf16_distopt"]
    assert rc == 0 and out.metrics["precision"] == "bf16"
    assert out.metrics["num_microbatches"] == 2  # 8 / (MBS 2 x DP 2)
    # bf16 weights and activations: close to the fp32 curve, not equal
    assert losses(out) == pytest.approx(losses(trials["tp1"][1]), abs=0.05)


@pytest.mark.slow
@needs_megatron
def test_megatron_assertion_at_build_is_an_invalid_failure(tmp_path: Path) -> None:
    """A check that Megatron-Core makes and dse's rules do not (a top-1 router needs
    ``moe_router_pre_softmax``) still ends as ``invalid`` with Megatron's message."""
    spec = make_spec(tmp_path, "top1", {}, model={"num_moe_experts": 2, "moe_router_topk": 1})
    rc, out = run_trial(spec, tmp_path)
    assert rc != 0
    assert out.failure_class == "invalid" and out.status == "infeasible", out.reason
    assert "moe-router-pre-softmax when topk is 1" in (out.reason or "")


@pytest.mark.slow
@needs_megatron
def test_a_rule_is_reported_by_the_trial_process_with_its_pre_launch_text(
    tmp_path: Path,
) -> None:
    """num_attention_heads % TP: the trial process (2 ranks under torchrun) checks
    dse.model.rules before building and reports the rule's own text."""
    spec = make_spec(
        tmp_path,
        "heads",
        {"tensor_model_parallel_size": 2},
        world=2,
        model={"num_attention_heads": 3, "num_query_groups": None, "kv_channels": 32},
    )
    rc, out = run_trial(spec, tmp_path)
    assert rc != 0
    assert out.failure_class == "invalid" and out.status == "infeasible"
    assert out.reason == (
        "heads_tp: num_attention_heads must be divisible by TP (num_attention_heads=3, tp=2)"
    )


@needs_megatron
def test_missing_transformer_engine_is_an_invalid_failure(tmp_path: Path) -> None:
    """Rejected before torch or megatron is imported (no torchrun needed for one rank)."""
    spec = make_spec(tmp_path, "te", {"attention_backend": "te"}, features=[])
    rc, out = run_trial(spec, tmp_path, torchrun=False)
    assert rc == 3
    assert out.failure_class == "invalid"
    assert "missing_feature: attention_backend='te' needs transformer_engine" in (out.reason or "")
    lines = [json.loads(x) for x in Path(spec.metrics_path).read_text().splitlines()]
    assert [x["type"] for x in lines] == ["failure"]


@pytest.mark.slow
@needs_megatron
def test_diverging_loss_is_a_nan_failure(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "nan", semantics={"lr": 1e30})
    rc, out = run_trial(spec, tmp_path)
    assert rc != 0
    assert out.failure_class == "nan" and out.status == "failed"
    # Megatron's NaN check of the gradient buckets (on, as in Megatron-LM) sees it first
    assert "NaN or Inf in the gradients at step" in (out.reason or "")
    assert "found NaN in local grad norm" in (out.reason or "")
    assert out.metrics["peak_mem_gib"] > 0
    assert len(out.steps) >= 1  # the finite steps before it are kept


@needs_megatron
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_dropout_comes_from_the_model_spec(tmp_path: Path) -> None:
    """The cost model counts dropout's masks from the model spec; the trainer sets the same
    TransformerConfig fields (off unless the model declares them)."""
    from dse.workloads.megatron.trainer import transformer_config_kwargs

    off = transformer_config_kwargs(make_plan(make_spec(tmp_path, "p"), []))
    assert (off["hidden_dropout"], off["attention_dropout"]) == (0.0, 0.0)
    model = {"hidden_dropout": 0.1, "attention_dropout": 0.05}
    on = transformer_config_kwargs(make_plan(make_spec(tmp_path, "p", model=model), []))
    assert (on["hidden_dropout"], on["attention_dropout"]) == (0.1, 0.05)


def test_fields_newer_than_the_trainers_megatron_core_are_refused(tmp_path: Path) -> None:
    """Knobs whose field Megatron-Core 0.16.1 lacks are refused by name at a non-default
    value, and left out at their default (never passed to a config class that would fail)."""
    with pytest.raises(TrialFailure, match="moe_flex_dispatcher_num_sms=16 sets a field of"):
        make_plan(make_spec(tmp_path, "n", {"moe_flex_dispatcher_num_sms": 16}))
    plan = make_plan(make_spec(tmp_path, "n", {"fused_residual_rmsnorm": False,
                                               "stage_precision_aware_optimizer_state_on_cpu":
                                               False}))  # fmt: skip
    assert "fused_residual_rmsnorm" not in plan.fields["model"]


# --- adaptive trial length and early stop (slow: real training) ------------------------------


@pytest.mark.slow
@needs_megatron
def test_adaptive_trial_stops_between_min_and_max_on_every_rank(tmp_path: Path) -> None:
    """Two ranks (TP 2): rank 0 decides and broadcasts, so both stop at the same step (a
    rank that went on alone would wait in a collective until the timeout)."""
    from scipy import stats

    from dse.stats.measure import TRIM

    m = {"mode": "adaptive", "min_steps": 6, "max_steps": 40, "rel_halfwidth": 0.25}
    spec = make_spec(tmp_path, "adaptive", {"tensor_model_parallel_size": 2}, world=2)
    spec = spec.model_copy(update={"measurement": m})
    rc, out = run_trial(spec, tmp_path)
    assert rc == 0 and out.ok and not out.pruned, out.reason
    n = len(out.steps)
    assert 6 <= n < 40 and out.metrics["steps"] == n and len(out.metrics["losses"]) == n
    meas = out.metrics["measurement"]
    assert meas["mode"] == "adaptive" and meas["stop_reason"] == "converged"
    assert meas["warmup_steps"] + meas["measured_steps"] == n and meas["measured_steps"] >= 4
    lo, hi = out.metrics["step_time_ci_s"]
    t = out.metrics["step_time_s"]
    assert 0 < lo <= t <= hi and (hi - lo) / 2 <= 0.25 * t
    steady = [s.step_time_s for s in out.steps[meas["warmup_steps"] :]]
    # the steady-state figure: the trimmed mean of the steps after the warm-up
    assert t == pytest.approx(float(stats.trim_mean(steady, TRIM)))
    tlo, thi = out.metrics["tflops_per_gpu_ci"]
    assert tlo <= out.metrics["tflops_per_gpu"] <= thi
    flops = out.metrics["model_flops_per_step"]
    assert out.metrics["tflops_per_gpu"] == pytest.approx(flops / (t * 2 * 1e12), rel=1e-6)


@pytest.mark.slow
@needs_megatron
def test_a_dominated_trial_stops_early_and_is_stored_pruned(tmp_path: Path) -> None:
    from dse.storage import open_storage

    # a best far above anything a CPU reaches: dominated as soon as the rule may say so
    best = {"metric": "tflops_per_gpu", "direction": "maximize", "best": 50.0, "bound": 45.0,
            "margin": 0.05, "best_trial": 0}  # fmt: skip
    m = {"mode": "adaptive", "min_steps": 6, "max_steps": 40, "prune": True}
    spec = make_spec(tmp_path, "dominated").model_copy(update={"measurement": m, "prune": best})
    rc, out = run_trial(spec, tmp_path, torchrun=False)
    assert rc == 0 and out.ok and out.pruned, out.reason
    assert 6 <= len(out.steps) < 40
    meas = out.metrics["measurement"]
    assert meas["stop_reason"] == "dominated" and meas["dominated_by"]["trial"] == 0
    assert out.metrics["tflops_per_gpu"] > 0 and out.metrics["tflops_per_gpu_ci"][1] < 45 * 0.95
    with open_storage("sqlite://") as st:
        s = st.create_study(name="s", space_yaml="x: 1\n", space_hash="h", direction="maximize",
                            metric="tflops_per_gpu", model={}, hardware={})  # fmt: skip
        a = st.claim_trial(study_id=s.id, params={"a": 0}, params_key="a0", budget=5)
        b = st.claim_trial(study_id=s.id, params={"a": 1}, params_key="a1", budget=5)
        assert a is not None and b is not None
        st.finish_trial(a.id, Outcome("ok", {"tflops_per_gpu": 1e-9}), value=1e-9)
        rec = st.finish_trial(b.id, out, value=out.metrics["tflops_per_gpu"])
        assert rec.state == "pruned" and len(rec.steps) == len(out.steps)
        best_rec = st.best_trial(s.id, "maximize")  # the pruned trial's higher value: not best
        assert best_rec is not None and best_rec.number == a.number


@pytest.mark.slow
@needs_megatron
def test_fixed_window_records_its_interval(trials: dict[str, Any]) -> None:
    _rc, out = trials["tp1"]
    meas = out.metrics["measurement"]
    assert meas == {**meas, "mode": "fixed", "warmup_steps": 1, "measured_steps": 3,
                    "stop_reason": "fixed"}  # fmt: skip
    lo, hi = out.metrics["step_time_ci_s"]
    assert lo <= out.metrics["step_time_s"] <= hi


@needs_megatron
def test_loss_function_builds_nothing_from_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-micro-batch loss stays on the device: a tensor made from host data there is a
    blocking copy on a GPU, once per micro-batch (what made micro-batch-1 trials slow and
    noisy on the H200, bench/host_jitter.py)."""
    import torch

    from dse.workloads.megatron import trainer

    def no_host_tensor(*a: Any, **k: Any) -> Any:
        raise AssertionError(f"torch.tensor{a} in the loss function: a copy from host memory")

    losses = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    monkeypatch.setattr(torch, "tensor", no_host_tensor)
    loss_sum, num_tokens, report = trainer._loss_func(losses)
    monkeypatch.undo()
    assert float(loss_sum) == 15.0
    assert num_tokens.dtype == torch.int and int(num_tokens) == 6
    assert report["lm loss"].tolist() == [15.0, 6.0]


_L2_CHECK = """
import json, torch
from dse.workloads.megatron import _cpu_shims
_cpu_shims.install()
from megatron.core import utils
from dse.workloads.megatron import _compat
g = torch.Generator().manual_seed(0)
lists = [[torch.randn(37, 5, generator=g), torch.randn(11, generator=g) * 1e3,
          torch.randn(3, 3, generator=g).bfloat16()]]  # as clip_grads passes them: one list
ref, _ = utils.local_multi_tensor_l2_norm(2048, None, lists, False)
got, _ = _compat.l2_norm_on_device(2048, None, lists, False)
first, again = _compat.apply(), _compat.apply()
from megatron.core.optimizer import clip_grads
print(json.dumps({"ref": ref.tolist(), "got": got.tolist(), "dtype": str(got.dtype),
                  "first": first, "again": again,
                  "bound": clip_grads.l2_norm_impl is _compat.l2_norm_on_device}))
"""


@needs_megatron
def test_gradient_norm_without_apex_stays_on_the_device() -> None:
    """Megatron-Core's own fallback (a host copy per parameter tensor) and dse's on-device
    one give the same norm; apply() binds it once, where Megatron fell back."""
    r = subprocess.run([sys.executable, "-c", _L2_CHECK], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["dtype"] == "torch.float32" and len(out["got"]) == 1
    assert out["got"][0] == pytest.approx(out["ref"][0], rel=1e-6)
    assert "clip_grads.l2_norm_impl=l2_norm_on_device" in out["first"]
    assert not any("clip_grads" in x for x in out["again"]) and out["bound"]


@pytest.mark.slow
@needs_megatron
def test_the_cpu_clock_leaves_out_the_time_spent_waiting_for_a_core(tmp_path: Path) -> None:
    """``measurement.clock: cpu``: a trial sharing its one core with a busy process waits for
    it about half the time; its steps are timed by the CPU time it used, the wall time kept
    beside them (the demo's defence against a shared machine's drift). The wall clock's
    figures are the wall time."""
    spin = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-c", "while True: pass"]
    )  # a process as busy as the trial, on the trial's core
    try:
        spec = make_spec(tmp_path, "cpuclock", {"micro_batch_size": 2})
        spec = spec.model_copy(update={"measurement": {"clock": "cpu"}})
        path = tmp_path / "cpuclock.json"
        path.write_text(spec.model_dump_json())
        cmd = ["taskset", "-c", "0", sys.executable, "-m", "dse.workloads.megatron.trainer",
               "--spec", str(path)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    finally:
        spin.kill()
        spin.wait()
    out = read_metrics(spec.metrics_path)
    assert proc.returncode == 0 and out is not None and out.ok, proc.stderr[-3000:]
    m = out.metrics
    assert m["step_clock"] == "cpu"
    # sharing one core half and half: the wall time is about twice the CPU time
    assert m["step_time_s"] < 0.75 * m["step_wall_time_s"], m
    flops = m["model_flops_per_step"]
    assert m["tflops_per_gpu"] == pytest.approx(flops / (m["step_time_s"] * 1e12), rel=1e-6)


@pytest.mark.slow
def test_the_wall_clock_records_no_second_clock(trials: dict[str, Any]) -> None:
    _rc, out = trials["tp1"]
    assert "step_clock" not in out.metrics and "step_wall_time_s" not in out.metrics
