"""The built-in trainer's effective settings against upstream Megatron-LM's printed argument
table for the same space (dse/workloads/megatron/effective.py; docs/trainer_vs_upstream.md).

The tables are upstream's own: ``pretrain_gpt.py`` of Megatron-LM core_v0.16.1 run on CPU
through bench/mlm_cpu_shim by ``bench/upstream_mlm.py --cpu`` for
examples/tiny_gpt_cpu_megatron_lm_upstream.yaml at MBS 1 and 2 (tests/fixtures/logs/
megatron_lm_v0161_cpu_tiny_gpt_mbs*.log). The built-in side is the configuration objects the
trainer builds for the same trial (``TransformerConfig``, ``DistributedDataParallelConfig``,
``OptimizerConfig``). A difference planted on either side (a dtype, a buffer, a default)
fails the comparison, naming the setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.core.records import TrialSpec
from dse.space.searchspace import parse_space
from dse.workloads.megatron import effective
from dse.workloads.megatron._plan import make_plan
from tests.conftest import EXAMPLES, LOGS, needs_megatron

SPACE = EXAMPLES / "tiny_gpt_cpu_megatron_lm_upstream.yaml"


def _table(mbs: int, precision: str = "fp32") -> str:
    tag = "" if precision == "fp32" else f"{precision}_"
    return (LOGS / f"megatron_lm_v0161_cpu_tiny_gpt_{tag}mbs{mbs}.log").read_text()


def _plan(mbs: int, precision: str = "fp32", **params: Any) -> Any:
    """The built-in trainer's plan of the upstream space's trial at ``mbs``."""
    data = yaml.safe_load(SPACE.read_text())
    data["semantics"]["precision"] = precision
    space = parse_space(data)
    knobs = {**space.fixed, **space.baseline(), "micro_batch_size": mbs, **params}
    spec = TrialSpec(
        study="s", trial_number=0, params=knobs, model=space.model.model_dump(),
        semantics=space.semantics.model_dump(), world_size=1, device="cpu",
        metrics_path=str(Path("unused.jsonl")), workload={"name": "megatron"},
    )  # fmt: skip
    return make_plan(spec, [])


@needs_megatron
@pytest.mark.parametrize(("mbs", "precision"), [(1, "fp32"), (2, "fp32"), (1, "bf16")])
def test_builtin_settings_are_upstreams_for_the_same_space(mbs: int, precision: str) -> None:
    table = effective.upstream_table(_table(mbs, precision))
    eff = effective.effective_settings(_plan(mbs, precision))
    assert set(eff) == set(effective.SETTINGS)
    assert effective.differences(eff, table) == []
    # what the comparison covers, read from upstream's side (not only dse's)
    assert table["attention_softmax_in_fp32"] == "False"
    assert table["hidden_dropout"] == table["attention_dropout"] == "0.0"
    assert table["lr_decay_style"] == "constant"
    assert table["padded_vocab_size"] == "1024"  # NullTokenizer's end-of-document id included
    assert table["micro_batch_size"] == str(mbs)
    # bf16: bf16 parameters, fp32 gradient buffers (Megatron-LM's resolution for bf16)
    wide = precision == "bf16"
    assert table["params_dtype"] == ("torch.bfloat16" if wide else "torch.float32")
    assert table["accumulate_allreduce_grads_in_fp32"] == str(wide)


@needs_megatron
def test_a_difference_planted_on_upstreams_side_fails_naming_it() -> None:
    eff = effective.effective_settings(_plan(1))
    text = _table(1)
    for arg, printed, planted in [
        ("attention_softmax_in_fp32", "False", "True"),  # a dtype of the logits path
        ("ddp_bucket_size", "None", "40000000"),  # a buffer
        ("params_dtype", "torch.float32", "torch.bfloat16"),  # a parameter dtype
    ]:
        line = next(x for x in text.splitlines() if x.startswith(f"  {arg} ."))
        assert line.endswith(f" {printed}")
        table = effective.upstream_table(text.replace(line, line[: -len(printed)] + planted))
        bad = effective.differences(eff, table)
        assert [m.field for m in bad] == [arg], bad
        assert f"resolved '{planted}'" in str(bad[0])


@needs_megatron
def test_a_difference_planted_on_the_builtin_side_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table = effective.upstream_table(_table(1))
    # a buffer: the distributed optimizer's sharded buffers on the built-in side only
    bad = effective.differences(
        effective.effective_settings(_plan(1, use_distributed_optimizer=True)), table
    )
    assert [m.field for m in bad] == ["use_distributed_optimizer"]
    # a gradient dtype: fp32 gradient reduction asked of fp32 parameters
    bad = effective.differences(
        effective.effective_settings(_plan(1, grad_reduce_in_fp32=True)), table
    )
    assert [m.field for m in bad] == ["accumulate_allreduce_grads_in_fp32"]
    # the trainer left at Megatron-Core's dataclass default (fp32 softmax of the scores)
    # (the trainer holds the table by name since its import moved to module level)
    from dse.workloads.megatron import trainer

    monkeypatch.setattr(trainer, "MEGATRON_LM_MODEL_DEFAULTS", {})
    bad = effective.differences(effective.effective_settings(_plan(1)), table)
    assert [str(m) for m in bad] == ["attention_softmax_in_fp32: asked True, resolved 'False'"]


def test_a_log_without_a_complete_table_is_refused() -> None:
    text = _table(1)
    cut = text[: text.index("end of arguments")]
    with pytest.raises(ValueError, match="no complete Megatron-LM argument table"):
        effective.upstream_table(cut)
    assert effective.padded_vocab_of_log(["no such line"]) is None
