"""``dse start --space examples/nemotron_omni.yaml --dry-run 2``: the Bridge commands of the
prior recipe (the baseline) and of the hand-tuned configuration (the warm start), golden."""

from __future__ import annotations

from pathlib import Path

import pytest

from dse.cli.main import main
from tests.conftest import EXAMPLES

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "dryrun_nemotron_omni.txt"


def test_omni_dry_run_golden(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["start", "--space", str(EXAMPLES / "nemotron_omni.yaml"), "--dry-run", "2",
               "--storage", f"sqlite:///{tmp_path}/never.db"])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert out == GOLDEN.read_text()
    assert not (tmp_path / "never.db").exists()
    tuned = out.split("## trial 1:")[1]
    for item in (
        "export CUDA_DEVICE_MAX_CONNECTIONS=32",
        "--step_func nemotron_omni_step",
        "model.tensor_model_parallel_size=2",
        "model.expert_model_parallel_size=8",
        "model.expert_tensor_parallel_size=1",
        "train.micro_batch_size=4",
        "model.moe_token_dispatcher_type=flex",
        "model.moe_flex_dispatcher_backend=hybridep",
        "model.recompute_granularity=selective",
        "'model.recompute_modules=[moe,layernorm]'",
        "model.attention_backend=fused",
        "model.cross_entropy_fusion_impl=te",
        "model.use_fused_weighted_squared_relu=true",
        "optimizer.main_params_dtype=fp16",
        "optimizer.store_param_remainders=false",
    ):
        assert item in tuned, item
    prior = out.split("## trial 1:")[0]
    assert "model.recompute_modules" not in prior  # no recompute: the list is not set
    # the alltoall baseline: the flex backend knob is inactive and passes nothing
    assert "model.moe_flex_dispatcher_backend" not in prior
    # the baseline's fp32 reduction survives runtime_config_update: the mixed-precision
    # config, which Bridge copies onto the DDP config, says so too
    assert "ddp.grad_reduce_in_fp32=true" in prior
    assert "mixed_precision.grad_reduce_in_fp32=true" in prior
    assert "mixed_precision.grad_reduce_in_fp32=false" in tuned
    assert "dse_bridge_entry.py" in prior and "/opt/Megatron-Bridge/scripts/training/" in prior
