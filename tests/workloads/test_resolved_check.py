"""The resolved-configuration check: a launcher trial compares what the recipe resolved with
every field dse set, and fails ``invalid`` naming field, asked and resolved where they differ.

The Megatron-LM log is real upstream output (tests/fixtures/logs, its source in its header):
``pretrain_gpt.py`` of core_v0.16.1 given ``--sequence-parallel`` at TP=1, which its
``validate_args`` turns off."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dse.core.records import MetricsWriter, TrialSpec, read_metrics
from dse.space.searchspace import ModelSpec, MoeRouting
from dse.workloads.launchers.megatron_lm import (
    ARG_DEFAULTS,
    BUILTIN_MODULE,
    resolved_expectations,
    routing_flags,
)
from dse.workloads.launchers.resolved import (
    RESOLVED_FILE,
    ArgsTableReader,
    Mismatch,
    check_for,
    compare,
    normalize,
)
from dse.workloads.launchers.run import run_rendered
from tests.conftest import LOGS

LOG = LOGS / "megatron_lm_v0161_cpu_sequence_parallel.log"
MODEL = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128,
         "vocab_size": 1024}  # fmt: skip
SEM = {"global_batch_size": 4, "seq_length": 64, "steps": 3, "warmup_steps": 1}
#: The knob values of the logged run (every other Megatron-LM default left as it is).
RAN = {"micro_batch_size": 2, "recompute": "selective", "tensor_model_parallel_size": 1}


def _table() -> dict[str, str]:
    r = ArgsTableReader()
    ended = [r.feed(line) for line in LOG.read_text().splitlines()]
    assert r.done and ended.count(True) == 1
    return r.values


def test_the_printed_argument_table_reads_as_megatron_printed_it() -> None:
    t = _table()
    assert len(t) > 600  # every argument of core_v0.16.1's namespace
    assert t["micro_batch_size"] == "2" and t["sequence_parallel"] == "False"
    # no --recompute-modules given: None, which Megatron-Core reads as ["core_attn"]
    assert t["recompute_granularity"] == "selective" and t["recompute_modules"] == "None"
    assert t["params_dtype"] == "torch.float32" and t["attention_backend"] == "AttnBackend.auto"
    # names of 48+ characters have no dots: "  name  value"
    assert t["inference_dynamic_batching_cuda_graph_max_tokens"] == "16384"
    assert t["data_path"] == "None" and normalize(t["data_path"]) is None


@pytest.mark.parametrize(
    ("asked", "printed", "same"),
    [(2, "2", True), (2, "1", False), (True, "True", True), (None, "None", True),
     ("bf16", "torch.bfloat16", True), ("fp32", "torch.bfloat16", False),
     ("flash", "AttnBackend.flash", True), (["core_attn"], "['core_attn']", True),
     (["core_attn", "mlp"], "['core_attn']", False), (1e-3, "0.001", True),
     ("selective", "selective", True), (False, "0", False)],
)  # fmt: skip
def test_values_compare_as_printed(asked: object, printed: str, same: bool) -> None:
    assert (compare({"f": asked}, {"f": printed}) == []) is same


def test_a_field_the_recipe_does_not_resolve_is_named() -> None:
    (m,) = compare({"no_such_field": 1}, {"micro_batch_size": "2"})
    assert m == Mismatch("no_such_field", 1, None, missing=True)
    assert "not in the resolved configuration" in str(m)


def test_expectations_cover_fields_left_at_megatrons_default() -> None:
    model = ModelSpec.model_validate({**MODEL, "activation": "swiglu"})
    want = resolved_expectations(
        {**RAN, "apply_rope_fusion": True, "bias_activation_fusion": False,
         "grad_reduce_in_fp32": True, "sequence_parallel": True},
        model, ["--num-layers", "2", "--bf16", "--disable-bias-linear"],
    )  # fmt: skip
    assert want["apply_rope_fusion"] is True  # on by default: no flag, still checked
    assert want["bias_swiglu_fusion"] is False  # the swiglu model's bias-activation fusion
    assert want["accumulate_allreduce_grads_in_fp32"] is True
    assert want["recompute_modules"] == ["core_attn"] and want["sequence_parallel"] is True
    assert want["num_layers"] == "2" and want["bf16"] is True and want["add_bias_linear"] is False


ROUTING = ("moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_router_score_function",
           "moe_router_enable_expert_bias")  # fmt: skip


def test_the_declared_moe_routing_is_checked_against_the_table() -> None:
    # semantics.moe_routing is rendered as flags; the table of core_v0.16.1 prints each field
    # under its own name (the load-balancing type and the coefficient, taken as lists, are
    # printed as the value: validate_args unwraps a one-element list)
    model = ModelSpec.model_validate(MODEL)
    same = MoeRouting(moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.0,
                      moe_router_score_function="softmax")  # fmt: skip
    want = resolved_expectations(RAN, model, routing_flags(same))
    assert want["moe_router_load_balancing_type"] == "aux_loss"
    assert want["moe_router_score_function"] == "softmax"
    assert normalize(want["moe_aux_loss_coeff"]) == 0.0
    assert compare(want, _table(), ARG_DEFAULTS) == []
    other = MoeRouting(
        moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=0.01,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
    )  # fmt: skip
    bad = compare(resolved_expectations(RAN, model, routing_flags(other)), _table(), ARG_DEFAULTS)
    assert {m.field for m in bad} == set(ROUTING)
    assert "moe_router_enable_expert_bias: asked True, resolved 'False'" in map(str, bad)


def _spec(tmp_path: Path, params: dict, **launcher: object) -> TrialSpec:
    return TrialSpec(
        study="s", trial_number=0, params=params, model=MODEL, semantics=SEM, world_size=1,
        device="cpu", metrics_path=str(tmp_path / "metrics.jsonl"),
        workload={"name": "megatron_lm", "launcher": {"script": "pretrain_gpt.py", **launcher},
                  "rendered": {"launcher": "megatron_lm", "argv": ["cat", str(LOG)], "env": {},
                               "log_format": "megatron", "world_size": 1}},
    )  # fmt: skip


def test_a_knob_the_recipe_overwrites_fails_the_trial_invalid_naming_it(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {**RAN, "sequence_parallel": True})
    out = io.StringIO()
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), out) == 3
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.failure_class == "invalid"
    assert "sequence_parallel: asked True, resolved 'False'" in (o.reason or "")
    assert "argument table" in (o.reason or "") and "megatron_lm" in (o.reason or "")
    assert "dse: stopping the recipe" in out.getvalue()
    assert o.steps == ()  # nothing after the table is measured


def test_the_configuration_as_asked_passes_and_says_what_it_checked(tmp_path: Path) -> None:
    spec = _spec(tmp_path, RAN)
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 0
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok
    assert o.metrics["resolved_check"].startswith("resolved-configuration check: ")
    assert "fields as asked" in o.metrics["resolved_check"]
    # after warm-up; upstream's iteration 2 prints the mean of iterations 1 and 2 (5.2429 ms
    # with iteration 1 at 5.3294): its own is 2 * 5.2429 - 5.3294
    assert o.metrics["step_time_s"] == pytest.approx((2 * 5.2429 - 5.3294 + 4.4285) / 2)
    assert o.metrics["tflops_per_gpu_log"] == 0.0  # the log's own count, printed as 0.0


def test_the_check_can_be_turned_off_and_skips_the_built_in_trainer(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {**RAN, "sequence_parallel": True}, check_resolved=False)
    assert check_for(spec, [], tmp_path) is None
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 0
    builtin = _spec(tmp_path, RAN)
    builtin.workload["launcher"] = {"module": BUILTIN_MODULE}
    assert check_for(builtin, [], tmp_path) is None


def test_bridge_resolved_file_is_compared_with_the_overrides(tmp_path: Path) -> None:
    argv = ["torchrun", "run.py", "--recipe", "r", "ddp.grad_reduce_in_fp32=true",
            "train.micro_batch_size=2", "model.recompute_modules=[core_attn]"]  # fmt: skip
    spec = TrialSpec(
        study="s", trial_number=0, params={}, model=MODEL, semantics=SEM, world_size=1,
        device="cpu", metrics_path=str(tmp_path / "metrics.jsonl"),
        workload={"name": "bridge", "launcher": {"recipe": "r"},
                  "rendered": {"launcher": "bridge", "argv": argv, "env": {}}},
    )  # fmt: skip
    check = check_for(spec, argv, tmp_path)
    assert check is not None and check.file == tmp_path / RESOLVED_FILE
    assert check.asked == {"ddp.grad_reduce_in_fp32": True, "train.micro_batch_size": 2,
                           "model.recompute_modules": ["core_attn"]}  # fmt: skip
    assert check.finish() is None and "wrote no resolved.json" in check.note
    fields = {"ddp.grad_reduce_in_fp32": False, "train.micro_batch_size": 2,
              "model.recompute_modules": ["core_attn"]}  # fmt: skip
    (tmp_path / RESOLVED_FILE).write_text(json.dumps({"source": "s", "fields": fields}))
    check = check_for(spec, argv, tmp_path)
    assert check is not None
    why = check.finish()
    assert why is not None and "ddp.grad_reduce_in_fp32: asked True, resolved False" in why
