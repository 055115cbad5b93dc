from __future__ import annotations

import pytest

from dse.exceptions import UnknownKnobError
from dse.knobs import (
    KNOBS,
    assignments,
    get_knob,
    to_bridge_overrides,
    to_megatron_args,
    to_nemo_overrides,
)


def test_every_knob_has_fields_and_description() -> None:
    for k in KNOBS.values():
        assert k.description
        sample = k.choices[0] if k.kind == "choice" else (True if k.kind == "bool" else 2)
        assert k.fields(sample), k.name


def test_unknown_knob_suggests() -> None:
    with pytest.raises(UnknownKnobError, match="did you mean 'micro_batch_size'"):
        get_knob("micro_batch_sise")


def test_recompute_fields() -> None:
    full = {(a.field, a.value) for a in assignments({"recompute": "full"})}
    assert full == {
        ("recompute_granularity", "full"),
        ("recompute_method", "uniform"),
        ("recompute_num_layers", 1),
    }


def test_exports() -> None:
    params = {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2,
        "micro_batch_size": 4,
        "recompute": "selective",
        "use_distributed_optimizer": True,
        "bias_activation_fusion": False,
        "overlap_grad_reduce": True,
    }
    args = to_megatron_args(params, num_layers=16)
    s = " ".join(args)
    assert "--tensor-model-parallel-size 2" in s
    assert "--num-layers-per-virtual-pipeline-stage 4" in s
    assert "--micro-batch-size 4" in s
    assert "--recompute-granularity selective" in s
    assert "--use-distributed-optimizer" in args
    assert "--no-bias-swiglu-fusion" in args
    assert "--overlap-grad-reduce" in args
    b = to_bridge_overrides(params)
    assert b["model.tensor_model_parallel_size"] == 2
    assert b["train.micro_batch_size"] == 4
    assert b["ddp.overlap_grad_reduce"] is True
    assert b["optimizer.use_distributed_optimizer"] is True
    n = to_nemo_overrides(params)
    assert n["trainer.strategy.tensor_model_parallel_size"] == 2
    assert n["data.micro_batch_size"] == 4
    assert n["model.config.recompute_granularity"] == "selective"
    assert n["trainer.strategy.ddp.overlap_grad_reduce"] is True
    assert n["optim.config.use_distributed_optimizer"] is True


def test_vpp_export_needs_layers() -> None:
    with pytest.raises(ValueError, match="num_layers"):
        to_megatron_args(
            {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}
        )


def test_megatron_lm_grad_reduce_flags() -> None:
    # Megatron-LM's flags are --accumulate-allreduce-grads-in-fp32 / --grad-reduce-in-bf16
    assert to_megatron_args({"grad_reduce_in_fp32": True}) == [
        "--accumulate-allreduce-grads-in-fp32"
    ]
    assert to_megatron_args({"grad_reduce_in_fp32": False}) == ["--grad-reduce-in-bf16"]
