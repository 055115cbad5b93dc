"""The built-in trainer's effective settings under Megatron-LM's argument names, and their
comparison with the argument table upstream Megatron-LM prints for the same space.

The built-in trainer stands for upstream ``pretrain_gpt.py``: for every setting both have,
it must build and train what upstream builds and trains. :func:`effective_settings` reads the
configuration objects the trainer builds from a plan (``TransformerConfig``,
``DistributedDataParallelConfig``, ``OptimizerConfig``; the same functions :func:`build`
uses, instantiated without a process group) and names each value as Megatron-LM's printed
argument table names it (:data:`SETTINGS`). :func:`differences` compares them with a table
read from upstream's log (:class:`dse.workloads.launchers.resolved.ArgsTableReader`), so a
future change on either side (a dtype, a buffer, a default of a new Megatron-Core) fails a
test instead of silently changing what the instrument measures. The padded vocabulary,
which upstream prints on its own line and not in the table, is read from that line
(:func:`padded_vocab_of_log`).

docs/trainer_vs_upstream.md lists the differences found and what became of each.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from dse.model.flops import padded_vocab_size
from dse.workloads.launchers._compare import Mismatch, compare
from dse.workloads.launchers.resolved import ArgsTableReader
from dse.workloads.megatron._plan import TrialPlan
from dse.workloads.megatron.trainer import (
    _KNOWN_WARNINGS,
    ddp_config_kwargs,
    optimizer_config_kwargs,
    transformer_config_kwargs,
)

__all__ = [
    "SETTINGS",
    "differences",
    "effective_settings",
    "padded_vocab_of_log",
    "upstream_table",
]

#: Megatron-LM argument (as its table prints it) -> (where the built-in trainer keeps the
#: value, attribute). ``model``: its ``TransformerConfig``; ``ddp``: its
#: ``DistributedDataParallelConfig``; ``optimizer``: its ``OptimizerConfig``; ``run``: what
#: the trainer derives from the plan itself (:func:`_run_settings`). An attribute written
#: ``not NAME`` is the negation (Megatron-LM's ``--no-...`` switches print that way).
SETTINGS: dict[str, tuple[str, str]] = {
    # model build and spec
    "num_layers": ("model", "num_layers"),
    "hidden_size": ("model", "hidden_size"),
    "ffn_hidden_size": ("model", "ffn_hidden_size"),
    "num_attention_heads": ("model", "num_attention_heads"),
    "num_query_groups": ("model", "num_query_groups"),
    "normalization": ("model", "normalization"),
    "layernorm_epsilon": ("model", "layernorm_epsilon"),
    "add_bias_linear": ("model", "add_bias_linear"),
    "swiglu": ("model", "gated_linear_unit"),
    "hidden_dropout": ("model", "hidden_dropout"),
    "attention_dropout": ("model", "attention_dropout"),
    "init_method_std": ("model", "init_method_std"),
    "apply_query_key_layer_scaling": ("model", "apply_query_key_layer_scaling"),
    "attention_softmax_in_fp32": ("model", "attention_softmax_in_fp32"),
    "transformer_impl": ("model", "transformer_impl"),
    "position_embedding_type": ("run", "position_embedding_type"),
    "untie_embeddings_and_output_weights": ("run", "untie_embeddings_and_output_weights"),
    # parameter and gradient dtypes
    "bf16": ("model", "bf16"),
    "fp16": ("model", "fp16"),
    "params_dtype": ("model", "params_dtype"),
    "accumulate_allreduce_grads_in_fp32": ("ddp", "grad_reduce_in_fp32"),
    "main_grads_dtype": ("optimizer", "main_grads_dtype"),
    "main_params_dtype": ("optimizer", "main_params_dtype"),
    "use_precision_aware_optimizer": ("optimizer", "use_precision_aware_optimizer"),
    # fusions and the loss path
    "masked_softmax_fusion": ("model", "masked_softmax_fusion"),
    "bias_dropout_fusion": ("model", "bias_dropout_fusion"),
    "apply_rope_fusion": ("model", "apply_rope_fusion"),
    "gradient_accumulation_fusion": ("model", "gradient_accumulation_fusion"),
    "no_persist_layer_norm": ("model", "not persist_layer_norm"),
    "cross_entropy_loss_fusion": ("model", "cross_entropy_loss_fusion"),
    "cross_entropy_fusion_impl": ("model", "cross_entropy_fusion_impl"),
    "calculate_per_token_loss": ("model", "calculate_per_token_loss"),
    # activation recompute
    "recompute_granularity": ("model", "recompute_granularity"),
    "recompute_method": ("model", "recompute_method"),
    "recompute_num_layers": ("model", "recompute_num_layers"),
    # the distributed optimizer and its buckets
    "use_distributed_optimizer": ("ddp", "use_distributed_optimizer"),
    "overlap_grad_reduce": ("ddp", "overlap_grad_reduce"),
    "overlap_param_gather": ("ddp", "overlap_param_gather"),
    "ddp_bucket_size": ("ddp", "bucket_size"),
    "ddp_average_in_collective": ("ddp", "average_in_collective"),
    "check_for_nan_in_loss_and_grad": ("ddp", "check_for_nan_in_grad"),
    # the optimizer and its schedule
    "optimizer": ("optimizer", "optimizer"),
    "lr": ("optimizer", "lr"),
    "weight_decay": ("optimizer", "weight_decay"),
    "clip_grad": ("optimizer", "clip_grad"),
    "adam_beta1": ("optimizer", "adam_beta1"),
    "adam_beta2": ("optimizer", "adam_beta2"),
    "adam_eps": ("optimizer", "adam_eps"),
    "lr_decay_style": ("run", "lr_decay_style"),
    # data and batch arithmetic
    "micro_batch_size": ("run", "micro_batch_size"),
    "global_batch_size": ("run", "global_batch_size"),
    "seq_length": ("run", "seq_length"),
    "seed": ("run", "seed"),
    "tensor_model_parallel_size": ("model", "tensor_model_parallel_size"),
    "pipeline_model_parallel_size": ("model", "pipeline_model_parallel_size"),
    "context_parallel_size": ("model", "context_parallel_size"),
    "sequence_parallel": ("model", "sequence_parallel"),
    # the embedding: upstream prints it on its own line (padded_vocab_of_log)
    "padded_vocab_size": ("run", "padded_vocab_size"),
}

#: ``> padded vocab (size: 1024) with 128 dummy tokens (new size: 1152)``
_PADDED = re.compile(r"padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")


def _run_settings(plan: TrialPlan) -> dict[str, Any]:
    sem, m = plan.semantics, plan.model
    return {
        "position_embedding_type": m.position_embedding_type,
        "untie_embeddings_and_output_weights": m.untie_embeddings_and_output_weights,
        # semantics.lr is one constant rate: the trainer steps no scheduler
        "lr_decay_style": "constant",
        "micro_batch_size": plan.layout.mbs,
        "global_batch_size": sem.global_batch_size,
        "seq_length": sem.seq_length,
        "seed": sem.seed,
        "padded_vocab_size": padded_vocab_size(m.vocab_size, plan.layout.tp),
    }


def effective_settings(plan: TrialPlan) -> dict[str, Any]:
    """What the built-in trainer builds and trains for ``plan``, by Megatron-LM argument
    name (every key of :data:`SETTINGS`). Instantiates the configuration dataclasses only
    (no process group, no model)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    with warnings.catch_warnings():  # the ones every trial process filters too
        for msg in _KNOWN_WARNINGS:
            warnings.filterwarnings("ignore", message=msg)
        config = TransformerConfig(**transformer_config_kwargs(plan))
        ddp = DistributedDataParallelConfig(**ddp_config_kwargs(plan))
        opt = OptimizerConfig(**optimizer_config_kwargs(plan, config, ddp))
    objects = {"model": config, "ddp": ddp, "optimizer": opt, "run": _run_settings(plan)}
    out: dict[str, Any] = {}
    for arg, (where, attr) in SETTINGS.items():
        obj = objects[where]
        negate = attr.startswith("not ")
        name = attr.removeprefix("not ")
        value = obj[name] if isinstance(obj, dict) else getattr(obj, name)
        value = (not value) if negate else value
        # a dtype compares by its printed name (torch.bfloat16), as the table prints it
        out[arg] = str(value) if type(value).__name__ == "dtype" else value
    return out


def padded_vocab_of_log(lines: Iterable[str]) -> int | None:
    """The padded vocabulary upstream's log names (its tokenizer's line), or None."""
    for line in lines:
        m = _PADDED.search(line)
        if m:
            return int(m.group(1))
    return None


def upstream_table(text: str) -> dict[str, str]:
    """Upstream's printed argument table of a log (values as printed), with the padded
    vocabulary of its tokenizer line as ``padded_vocab_size``. Raises ValueError when the
    log holds no complete table."""

    reader = ArgsTableReader()
    lines = text.splitlines()
    for line in lines:
        if reader.feed(line):
            break
    if not reader.done:
        raise ValueError("the log holds no complete Megatron-LM argument table")
    table = dict(reader.values)
    padded = padded_vocab_of_log(lines)
    if padded is not None:
        table["padded_vocab_size"] = str(padded)
    return table


def differences(effective: Mapping[str, Any], table: Mapping[str, Any]) -> list[Mismatch]:
    """Every setting whose built-in value differs from upstream's printed one (or that
    upstream's table lacks): ``asked`` is the built-in trainer's, ``resolved`` upstream's."""
    return compare(effective, table)
