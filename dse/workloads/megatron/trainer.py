"""The built-in Megatron-Core trial process.

Launched once per trial, one process per GPU (or CPU rank)::

    torchrun --standalone --nproc-per-node W -m dse.workloads.megatron.trainer --spec trial.json

It reads a :class:`dse.core.records.TrialSpec`, builds a GPT model with Megatron-Core
(``parallel_state``, ``TransformerConfig``, ``GPTModel`` from the local or Transformer
Engine layer spec, Megatron ``DistributedDataParallel``, ``get_megatron_optimizer``), trains
with ``get_forward_backward_func()`` and rank 0 writes the metrics JSONL (one ``step`` line
per step, then a ``summary`` line). How many steps: ``semantics.steps`` (``measurement.mode:
fixed``), or until the steady-state step time is known to ``measurement.rel_halfwidth``
(``adaptive``, :mod:`dse.stats.measure`); a trial whose interval lies clearly below the study's
best (``spec.prune``) stops as dominated. Rank 0 decides and broadcasts the decision, so
every rank stops at the same step. An expected failure (invalid
configuration, out of memory, NaN loss, another exception) becomes one ``failure`` line,
written by the rank that met it, and exit status 3; success exits 0.

Model weights are initialised layout-invariantly (see :mod:`._init`), and the data of
step ``i`` does not depend on the layout (:mod:`._data`), so the loss curves of two
configurations agree up to floating-point reduction order. Dropout is the model's
(``hidden_dropout``/``attention_dropout``, off by default; with it on, the masks depend
on the layout).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import signal
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any

from dse.core.records import MetricsWriter, StepMetrics, TrialSpec, finite, summarize_steps
from dse.model.flops import model_flops_per_step, padded_vocab_size, tflops_per_gpu
from dse.space.knobs import KNOBS
from dse.stats.measure import StepSeries, series_for
from dse.workloads.launchers import run_node_steps
from dse.workloads.launchers.megatron_lm import (
    MEGATRON_LM_DDP_DEFAULTS,
    MEGATRON_LM_MODEL_DEFAULTS,
)
from dse.workloads.logs import classify_failure
from dse.workloads.megatron import _autotune_cache, _compat, _cpu_shims, mamba, verify
from dse.workloads.megatron import _mamba_kernels as mk
from dse.workloads.megatron._cpu_shims import seed_model_parallel
from dse.workloads.megatron._lora import apply_lora
from dse.workloads.megatron._plan import (
    EXIT_FAILURE,
    EXIT_OK,
    TrialFailure,
    TrialPlan,
    make_plan,
)
from dse.workloads.megatron._speed import (
    DEFAULT_ADAM_IMPL,
    adam_impl_of,
    clear_trial_caches,
    drop_graph_refs,
    rng_seed_kwargs,
    set_adam_impl,
)
from dse.workloads.megatron.features import detect_features
from dse.workloads.megatron.mamba import build_mamba_model

__all__ = ["main", "run_trial", "run_spec", "release_trial_state", "EXIT_OK", "EXIT_FAILURE"]

_GIB = float(2**30)

#: Warnings that megatron-core and torch emit on every trial of this setup (no TE/apex on
#: the path, CPU gloo); filtered in the trial process only, by message.
_KNOWN_WARNINGS = (
    r"Transformer Engine and Apex are not installed",
    r"Apex is not installed",
    r"The legacy GroupedMLP will be deprecated",
    r"To copy construct from a tensor",
    r"full scope is deprecated",
    r"When using async grad allreduce it is recommended to set the environment variable "
    r"CUDA_DEVICE_MAX_CONNECTIONS",
    r"If you are using transformer_engine as the transformer implementation, the core_attn",
    r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
    r"`torch\.distributed\.reduce_scatter_tensor` is deprecated",
    r"Attempting to run cuBLAS, but there was no current CUDA context",
)

#: OptimizerConfig fields whose knob values are dtype names.
_DTYPE_FIELDS = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")


def _quiet_known_warnings() -> None:
    for msg in _KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=msg)


def _torch_dtype(name: str) -> Any:
    import torch

    return {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8": torch.uint8,  # Megatron's precision-aware optimizer stores fp8 state as uint8
    }[name]


# --- process ------------------------------------------------------------------------------


class _Dist:
    """This process's place in the torchrun job."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))

    def init(self, device: str) -> Any:
        """Initialise torch.distributed (NCCL on CUDA, gloo on CPU); return the device."""
        import torch
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(_free_port())
        timeout = datetime.timedelta(
            seconds=float(os.environ.get("DSE_TRIAL_PG_TIMEOUT_S", "600"))
        )
        if device == "cuda":
            if not torch.cuda.is_available():
                raise TrialFailure("error", "the trial spec asks for CUDA, but none is visible")
            torch.cuda.set_device(self.local_rank)
            dev = torch.device("cuda", self.local_rank)
            backend = "nccl"
        else:
            dev = torch.device("cpu")
            backend = "gloo"
        if not dist.is_initialized():
            dist.init_process_group(
                backend, rank=self.rank, world_size=self.world_size, timeout=timeout
            )
        return dev


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_memory_gib(device: str) -> tuple[float, float]:
    """(peak allocated, peak reserved) in GiB; on CPU both are the process's max RSS."""
    if device == "cuda":
        import torch

        return (torch.cuda.max_memory_allocated() / _GIB, torch.cuda.max_memory_reserved() / _GIB)
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _GIB  # KiB on Linux
    return rss, rss


def _synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# --- build --------------------------------------------------------------------------------


def _activation(name: str) -> tuple[Callable[..., Any], bool]:
    """(activation_func, gated_linear_unit) of a ModelSpec activation."""
    import torch.nn.functional as F  # noqa: N812
    from megatron.core.activations import squared_relu

    return {
        "swiglu": (F.silu, True),
        "silu": (F.silu, False),
        "gelu": (F.gelu, False),
        "relu": (F.relu, False),
        "squared_relu": (squared_relu, False),
    }[name]


def transformer_config_kwargs(plan: TrialPlan) -> dict[str, Any]:
    """The ``TransformerConfig`` keyword arguments of a plan (model + knob fields)."""
    import torch
    from megatron.core.transformer.enums import AttnBackend

    m, sem = plan.model, plan.semantics
    act, glu = _activation(m.activation)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[sem.precision]
    kw: dict[str, Any] = {
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.query_groups,
        "ffn_hidden_size": m.ffn_hidden_size,
        "normalization": m.normalization,
        "add_bias_linear": m.add_bias_linear,
        "activation_func": act,
        "gated_linear_unit": glu,
        "hidden_dropout": m.hidden_dropout,
        "attention_dropout": m.attention_dropout,
        "bf16": sem.precision == "bf16",
        "fp16": sem.precision == "fp16",
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "autocast_dtype": dtype,
        # CPU: weights from the CPU generator (no CUDA RNG); GPU: Megatron's GPU init, then
        # both are redrawn layout-invariantly (_init.py).
        "use_cpu_initialization": plan.spec.device == "cpu",
        "perform_initialization": True,
        # Megatron-LM's default; on gloo (CPU) p2p sends read the tensor later on a
        # background thread, and freeing pipeline outputs early corrupted activations.
        "deallocate_pipeline_outputs": plan.spec.device == "cuda",
        "variable_seq_lengths": False,
    }
    if m.kv_channels is not None:
        kw["kv_channels"] = m.kv_channels
    if m.num_moe_experts is not None:
        kw.update(
            num_moe_experts=m.num_moe_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size or m.ffn_hidden_size,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
            moe_layer_freq=m.moe_layer_freq,
        )
    kw.update(_hybrid_and_routing_kwargs(plan))

    kw.update(MEGATRON_LM_MODEL_DEFAULTS)  # Megatron-LM's values where the dataclass differs
    kw.update(plan.fields["model"])
    if plan.layout.vpp is not None:
        # Interleaved schedules send to the previous and the next stage in one exchange;
        # with PP=2 both are the same peer. Unbatched p2p keeps the two directions apart
        # (Megatron uses two process groups for them). GPU: overlapped, as Megatron-LM and
        # Bridge do. CPU/gloo: synchronous, because the overlapped path raced there and the
        # batched path (one group) mixed up the directions: both gave wrong losses.
        kw.setdefault("overlap_p2p_comm", plan.spec.device == "cuda")
        kw.setdefault("batch_p2p_comm", False)
    if plan.local_spec:
        kw["transformer_impl"] = "local"
        kw["attention_backend"] = AttnBackend.local
    else:
        kw["transformer_impl"] = "transformer_engine"
        name = "auto" if plan.attention_backend == "te" else plan.attention_backend
        kw["attention_backend"] = AttnBackend[name]
    return kw


def _hybrid_and_routing_kwargs(plan: TrialPlan) -> dict[str, Any]:
    """TransformerConfig fields of a hybrid model's Mamba mixer and of the MoE routing held
    fixed (``semantics.moe_routing``)."""

    kw: dict[str, Any] = {}
    if plan.hybrid:
        kw.update(mamba.mamba_config_kwargs(plan.model), is_hybrid_model=True)
    if plan.model.num_moe_experts is not None:
        kw.update(mamba.moe_routing_kwargs(plan.semantics.moe_routing))
    return kw


def ddp_config_kwargs(plan: TrialPlan) -> dict[str, Any]:
    """The ``DistributedDataParallelConfig`` keyword arguments of a plan."""

    ddp_kw: dict[str, Any] = dict(MEGATRON_LM_DDP_DEFAULTS)
    ddp_kw.update(plan.fields["ddp"])
    # Megatron-LM (--accumulate-allreduce-grads-in-fp32 for bf16) and Bridge's bf16_mixed
    # keep fp32 main grads: the catalog default, unless the configuration says otherwise.
    # fp32 parameters have fp32 gradients either way, and Megatron-LM resolves the flag off
    # for them (its argument table prints False): the same here
    fp32 = plan.semantics.precision == "fp32"
    ddp_kw.setdefault(
        "grad_reduce_in_fp32", False if fp32 else KNOBS["grad_reduce_in_fp32"].default
    )
    return ddp_kw


def optimizer_config_kwargs(plan: TrialPlan, config: Any, ddp_config: Any) -> dict[str, Any]:
    """The ``OptimizerConfig`` keyword arguments of a plan (Adam at ``semantics.lr``, one
    constant rate: no scheduler), given its built ``TransformerConfig`` and DDP config."""
    opt_kw: dict[str, Any] = {
        "optimizer": "adam",
        "lr": plan.semantics.lr,
        "bf16": config.bf16,
        "fp16": config.fp16,
        "params_dtype": config.params_dtype,
        "overlap_param_gather": ddp_config.overlap_param_gather,
    }
    opt_kw.update(plan.fields["optimizer"])
    for name in _DTYPE_FIELDS:
        if isinstance(opt_kw.get(name), str):
            opt_kw[name] = _torch_dtype(opt_kw[name])
    return opt_kw


def _known_fields(cls: Any, kw: dict[str, Any], what: str) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(kw) - names)
    if unknown:
        raise TrialFailure("invalid", f"{what} of this megatron-core has no field(s) {unknown}")


def layer_spec(plan: TrialPlan) -> Any:
    """The transformer layer ModuleSpec of a plan (local, local + SDPA, or TE)."""
    import copy

    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    grouped = bool(plan.fields["model"].get("moe_grouped_gemm", False))
    if not plan.local_spec:
        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=plan.model.num_moe_experts, moe_grouped_gemm=grouped
        )
    spec = get_gpt_layer_local_spec(
        num_experts=plan.model.num_moe_experts,
        moe_grouped_gemm=grouped,
        normalization=plan.model.normalization,
    )
    if plan.attention_backend == "sdpa":
        from dse.workloads.megatron._sdpa import SDPAttention

        spec = copy.deepcopy(spec)
        spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def block_spec(plan: TrialPlan, config: Any, spec: Any, vp_stage: int | None) -> Any:
    """What GPTModel builds on this stage: one layer spec for a model whose layers are all
    alike; for a MoE model with dense layers too (``moe_layer_freq``) or a pipeline split
    that is not even, Megatron-Core's decoder block spec of this stage's layers, each dense
    or MoE as ``moe_layer_freq`` says (megatron/core/models/gpt/gpt_layer_specs.py
    ``get_gpt_decoder_block_spec``), with dse's attention where it swaps one in."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if not plan.model.mixed_moe:
        return spec
    block = get_gpt_decoder_block_spec(
        config,
        use_transformer_engine=not plan.local_spec,
        normalization=plan.model.normalization,
        vp_stage=vp_stage,
    )
    if plan.local_spec and plan.attention_backend == "sdpa":
        import copy

        from dse.workloads.megatron._sdpa import SDPAttention

        block = copy.deepcopy(block)
        for layer in block.layer_specs:
            layer.submodules.self_attention.submodules.core_attention = SDPAttention
    return block


def _hybrid_model(plan: TrialPlan, config: Any, vocab: int) -> Any:
    """The MambaModel of a hybrid plan on this pipeline stage (dse's local spec)."""
    from megatron.core import parallel_state, tensor_parallel

    model = build_mamba_model(
        plan,
        config,
        vocab,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )
    for p in model.parameters():
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)
    return model


def prepare_mamba_kernels(plan: TrialPlan) -> dict[str, str] | None:
    """Before anything imports megatron's Mamba mixer: the CPU torch reference (CPU trials)
    or the labelled causal-conv1d stand-in (GPU trials without the compiled extension);
    returns the kernel path the trial's Mamba layers run (None without Mamba layers).
    Raises TrialFailure when the memory-efficient path has no convolution to run."""
    if not plan.model.layer_counts()["mamba"]:
        return None

    if plan.spec.device == "cpu":
        mk.install_cpu_reference()
    else:
        mk.install_conv1d_stand_in()
    path = mk.kernel_path(plan.mamba_mem_eff_path)
    if path["conv1d"] == "absent":
        raise TrialFailure(
            "invalid",
            "use_mamba_mem_eff_path=True needs causal-conv1d (the compiled extension, or its "
            "Python package for dse's torch stand-in), which is not installed here",
        )
    return path


@dataclasses.dataclass
class _Built:
    config: Any
    chunks: list[Any]
    optimizer: Any
    padded_vocab: int
    init: str


def build(plan: TrialPlan, device: Any) -> _Built:
    """Parallel state, model chunks (DDP-wrapped) and optimizer of a plan.

    Megatron-Core's own checks (config ``__post_init__`` assertions, module constructors)
    raise here; the caller reports them as ``invalid``.
    """
    import torch
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dse.workloads.megatron._init import init_layout_invariant

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=plan.layout.tp,
        pipeline_model_parallel_size=plan.layout.pp,
        virtual_pipeline_model_parallel_size=plan.layout.vpp,
        context_parallel_size=plan.layout.cp,
        expert_model_parallel_size=plan.layout.ep,
        expert_tensor_parallel_size=plan.layout.etp,
    )
    seed = plan.semantics.seed
    if plan.spec.device == "cpu":
        seed_model_parallel(seed)
    else:
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(
            seed, **rng_seed_kwargs(plan.fields["model"], tensor_parallel)
        )

    kw = transformer_config_kwargs(plan)
    _known_fields(TransformerConfig, kw, "TransformerConfig")
    config = TransformerConfig(**kw)
    spec = layer_spec(plan)
    vocab = padded_vocab_size(plan.model.vocab_size, plan.layout.tp)

    chunks: list[Any] = []
    n_chunks = plan.layout.vpp or 1
    for vp in range(n_chunks):
        vp_stage = vp if plan.layout.vpp is not None else None
        if plan.hybrid:
            chunks.append(_hybrid_model(plan, config, vocab))
            continue
        model = GPTModel(
            config=config,
            transformer_layer_spec=block_spec(plan, config, spec, vp_stage),
            vocab_size=vocab,
            max_sequence_length=plan.semantics.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(
                ignore_virtual=False, vp_stage=vp_stage
            ),
            post_process=parallel_state.is_pipeline_last_stage(
                ignore_virtual=False, vp_stage=vp_stage
            ),
            share_embeddings_and_output_weights=not plan.model.untie_embeddings_and_output_weights,
            position_embedding_type=plan.model.position_embedding_type,
            vp_stage=vp_stage,
        )
        for p in model.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)
        chunks.append(model)
    init = (
        init_layout_invariant(chunks, config, seed, plan.model.vocab_size)
        if plan.semantics.init == "layout_invariant"
        else "megatron"  # Megatron-Core's own, as built (upstream Megatron-LM's)
    )
    peft = plan.semantics.peft
    if peft is not None:
        counts = [apply_lora(m, peft, seed) for m in chunks]
        init += f"+lora(trained={sum(c[0] for c in counts)},frozen={sum(c[1] for c in counts)})"
    for i, model in enumerate(chunks):
        model.to(device)
        if config.bf16 or config.fp16:
            model = Float16Module(config, model)
        chunks[i] = model
    if plan.spec.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    ddp_kw = ddp_config_kwargs(plan)
    _known_fields(DistributedDataParallelConfig, ddp_kw, "DistributedDataParallelConfig")
    ddp_config = DistributedDataParallelConfig(**ddp_kw)
    chunks = [
        DistributedDataParallel(
            config=config, ddp_config=ddp_config, module=m, disable_bucketing=i > 0
        )
        for i, m in enumerate(chunks)
    ]

    opt_kw = optimizer_config_kwargs(plan, config, ddp_config)
    _known_fields(OptimizerConfig, opt_kw, "OptimizerConfig")
    optimizer = get_megatron_optimizer(OptimizerConfig(**opt_kw), chunks)

    set_adam_impl(optimizer, DEFAULT_ADAM_IMPL)  # where Megatron fell back to torch's AdamW

    # Hooks of the schedule, as Megatron-LM's training loop sets them.
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    no_sync = [c.no_sync for c in chunks]
    config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    if ddp_config.overlap_grad_reduce:
        # Megatron-LM's --align-grad-reduce (default on): the schedule launches each
        # chunk's gradient reduce itself, aligned across pipeline stages.
        sync = [c.start_grad_sync for c in chunks]
        config.grad_sync_func = sync[0] if len(sync) == 1 else sync
    if ddp_config.overlap_param_gather and ddp_config.align_param_gather:
        psync = [c.start_param_sync for c in chunks]
        config.param_sync_func = psync[0] if len(psync) == 1 else psync
    return _Built(config, chunks, optimizer, vocab, init)


# --- train --------------------------------------------------------------------------------


def _loss_func(output_tensor: Any, loss_mask: Any = None) -> tuple[Any, Any, dict[str, Any]]:
    """Sum of per-token losses, token count, and a detached copy for reporting
    (``loss_mask``: packed rows' mask, 0 where the input ends a sequence; counted tokens are
    its ones).

    Everything stays on the device: a count made with ``torch.tensor(n, device=...)`` is a
    copy from host memory, which waits for the GPU to drain at every micro-batch and makes
    configurations of many micro-batches slow and noisy (``bench/host_jitter.py``).
    """
    import torch

    losses = output_tensor.float()
    if loss_mask is None:
        loss_sum = losses.sum()
        num_tokens = torch.full((), losses.numel(), dtype=torch.int, device=losses.device)
    else:
        mask = loss_mask.reshape(losses.shape).float()
        loss_sum = (losses * mask).sum()
        num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss_sum.detach().clone(), num_tokens.detach().float()])
    return loss_sum, num_tokens, {"lm loss": report}


def _forward_step(position_ids: Any, data_iterator: Any, model: Any) -> tuple[Any, Any]:
    micro = next(data_iterator)
    if len(micro) == 5:
        # packed rows: a block-diagonal causal mask, per-sequence positions, masked loss
        tokens, labels, attention_mask, loss_mask, pos = micro
        output = model(tokens, pos, attention_mask, labels=labels)
        return output, partial(_loss_func, loss_mask=loss_mask)
    tokens, labels = micro
    pos = position_ids.expand(tokens.shape[0], -1)
    output = model(tokens, pos, None, labels=labels)
    return output, _loss_func


def train(
    plan: TrialPlan,
    built: _Built,
    device: Any,
    dist: _Dist,
    writer: MetricsWriter | None,
    *,
    first_step: int = 0,
) -> tuple[list[StepMetrics], StepSeries]:
    """Train the built model until the trial's measurement rule says stop; (steps, their
    series). ``writer`` (rank 0's) gets a step line per step. ``first_step``: the data's
    step of the first step (a run continued from a checkpoint, ``dse verify``). The trial
    process calls it after :func:`build`; a bench that times configurations in its own
    process calls the same pair (``bench/adaptive_window.py``)."""
    import torch
    import torch.distributed as tdist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from dse.workloads.megatron._data import GlobalBatches

    sem, dev_kind = plan.semantics, plan.spec.device
    data = GlobalBatches(
        sem.data,
        global_batch_size=sem.global_batch_size,
        seq_length=sem.seq_length,
        vocab_size=plan.model.vocab_size,
        packed=sem.packed_sequences,
    )
    flops = model_flops_per_step(plan.model, sem, tensor_model_parallel_size=plan.layout.tp)
    dp_rank = parallel_state.get_data_parallel_rank()
    # The global loss is summed over the ranks that hold one copy of each micro-batch loss:
    # the last pipeline stage, TP rank 0 (every DP and CP rank holds different tokens).
    reports_loss = (
        parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        and parallel_state.get_tensor_model_parallel_rank() == 0
    )
    position_ids = torch.arange(sem.seq_length, device=device).unsqueeze(0)
    fwd_bwd = get_forward_backward_func()
    step_fn = partial(_forward_step, position_ids)
    chunks, optimizer = built.chunks, built.optimizer
    for c in chunks:
        c.train()
    tokens = sem.global_batch_size * sem.seq_length
    series = series_for(plan.spec, tokens_per_step_per_gpu=tokens / plan.layout.world)
    # a decision that can end the run early is rank 0's, broadcast to every rank
    decides = series.adaptive or series.prune is not None
    stop_flag = torch.zeros(1, dtype=torch.int32, device=device)

    def run_step(micro: list[tuple[Any, ...]]) -> tuple[list[dict[str, Any]], Any]:
        iters = [iter(micro) for _ in chunks]
        for c in chunks:
            c.zero_grad_buffer()
        optimizer.zero_grad()
        reports = fwd_bwd(
            forward_step_func=step_fn,
            data_iterator=iters,
            model=chunks,
            num_microbatches=plan.layout.num_microbatches,
            seq_length=sem.seq_length,
            micro_batch_size=plan.layout.mbs,
            decoder_seq_length=sem.seq_length,
            forward_only=False,
        )
        _ok, grad_norm, _zeros = optimizer.step()
        return reports, grad_norm

    # measurement.clock cpu: a step's figure is the CPU time this process spent in it (the
    # slowest rank's, as for wall time), its wall time kept in ``wall_times``
    cpu_clock = series.spec.clock == "cpu"
    series.wall_times = []
    steps: list[StepMetrics] = []
    for step in range(series.limit):
        try:
            batch = data.global_batch(first_step + step)
        except ValueError as e:
            raise TrialFailure("invalid", f"training data: {e}") from e
        micro = [
            tuple(x.to(device, non_blocking=True) for x in mb)
            for mb in data.microbatches(
                batch, dp_rank=dp_rank, dp_size=plan.layout.dp, micro_batch_size=plan.layout.mbs
            )
        ]
        _synchronize(dev_kind)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            reports, grad_norm = run_step(micro)
        except (AssertionError, ValueError, NotImplementedError) as e:
            # Megatron-Core checks some settings only when a module first runs (e.g. MoE
            # with TP but without sequence parallelism): a refusal at the first step is a
            # configuration Megatron does not accept.
            if step == 0 and _raised_in_megatron(e):
                raise _invalid_from(e) from e
            raise
        except RuntimeError as e:
            # Megatron's NaN/Inf check of the gradient buckets (check_for_nan_in_grad, on as
            # in Megatron-LM) raises through its rerun state machine: a diverged step
            diverged = _nan_reason(e)
            if diverged is None:
                raise
            alloc, reserved = _peak_memory_gib(dev_kind)
            raise TrialFailure(
                "nan",
                f"NaN or Inf in the gradients at step {step} (Megatron's check: {diverged})",
                {"peak_mem_gib": alloc, "peak_reserved_gib": reserved, "step": step},
            ) from e
        _synchronize(dev_kind)
        wall = time.perf_counter() - t0
        dt = time.process_time() - c0 if cpu_clock else wall

        loss_acc = torch.zeros(2, dtype=torch.float64, device=device)
        if reports_loss:
            for r in reports:
                loss_acc += r["lm loss"].to(torch.float64)
        tdist.all_reduce(loss_acc)
        alloc, reserved = _peak_memory_gib(dev_kind)
        peaks = torch.tensor([alloc, reserved, dt, wall], dtype=torch.float64, device=device)
        tdist.all_reduce(peaks, op=tdist.ReduceOp.MAX)
        loss = float(loss_acc[0] / loss_acc[1])
        alloc, reserved, dt, wall = (float(x) for x in peaks.tolist())
        series.wall_times.append(wall)
        if not math.isfinite(loss):
            raise TrialFailure(
                "nan",
                f"loss is {loss} at step {step}",
                {"peak_mem_gib": alloc, "peak_reserved_gib": reserved, "step": step},
            )
        m = StepMetrics(
            step=step,
            step_time_s=dt,
            tflops_per_gpu=tflops_per_gpu(flops, dt, plan.layout.world),
            peak_mem_gib=alloc,
            peak_reserved_gib=reserved,
            loss=loss,
            grad_norm=finite(grad_norm),
        )
        steps.append(m)
        if writer is not None:
            writer.step(m)
        stop = series.add(dt, m.tflops_per_gpu)  # dt is the same on every rank (MAX)
        if decides:
            stop_flag.fill_(1 if (stop is not None and dist.rank == 0) else 0)
            tdist.broadcast(stop_flag, src=0)
            if int(stop_flag.item()):
                break
    return steps, series


#: The former private name of :func:`train` (kept for scripts that still use it).
_train = train

# --- trial --------------------------------------------------------------------------------


def _location(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    if not tb:
        return ""
    last = tb[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno}: {last.line or ''}".strip()


def _nan_reason(exc: BaseException) -> str | None:
    """The reason of an exception that reports a NaN or Inf (Megatron's own checks: the
    messages dse's log classification reads as ``nan``), or None."""

    found = classify_failure(str(exc))
    return found[1] if found is not None and found[0] == "nan" else None


def _raised_in_megatron(exc: BaseException) -> bool:
    """True when the innermost frame of ``exc`` is megatron-core code."""
    tb = traceback.extract_tb(exc.__traceback__)
    return bool(tb) and f"{os.sep}megatron{os.sep}core{os.sep}" in tb[-1].filename


def _invalid_from(exc: BaseException) -> TrialFailure:
    msg = str(exc).strip()
    where = _location(exc)
    reason = msg if msg else f"{type(exc).__name__} at {where}"
    return TrialFailure("invalid", reason)


class TrialInterrupted(BaseException):
    """The trial process was told to stop before its final line: SIGTERM (the runner's stop,
    a cluster scheduler's preemption, cancellation or time limit) or SIGINT (Ctrl-C). Like
    KeyboardInterrupt it passes ``except Exception``; :func:`run_spec` turns it into an
    ``interrupted`` failure line."""


def stop_on_signals() -> None:
    """Make SIGTERM and SIGINT raise :class:`TrialInterrupted` in this (the main) thread."""

    def stop(signum: int, _frame: Any) -> None:
        raise TrialInterrupted(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)


def run_trial(spec: TrialSpec, dist: _Dist, writer: MetricsWriter) -> dict[str, Any]:
    """Run one trial; return the summary record (rank 0 writes it). Raises TrialFailure."""
    t_entry = time.perf_counter()
    if dist.world_size != spec.world_size:
        raise TrialFailure(
            "error",
            f"launched with {dist.world_size} ranks but the trial spec says "
            f"world_size={spec.world_size}",
        )
    features = spec.features if spec.features is not None else detect_features()
    plan = make_plan(spec, features)

    notes: list[str] = []
    if spec.workload.get("node_steps") and dist.local_rank == 0:
        notes = run_node_steps(list(spec.workload["node_steps"]))
    if spec.device == "cpu":
        _cpu_shims.install()
    else:
        os.environ.update(cuda_environment(os.environ))
    device = dist.init(spec.device)

    _compat.apply()
    autotune0 = _autotune_counters(spec.device)
    mamba_kernels = prepare_mamba_kernels(plan)
    t_build = time.perf_counter()
    try:
        built = build(plan, device)
    except (AssertionError, ValueError, NotImplementedError) as e:
        if not _raised_in_megatron(e):
            raise  # dse's own build code failed: a bug (``error``), not an infeasible region
        raise _invalid_from(e) from e
    build_s = time.perf_counter() - t_build
    long_steps = verify.verify_steps(spec)
    if long_steps is not None:  # ``dse verify``: the long run with a checkpoint reloaded
        result = verify.run_verify(
            train, spec, long_steps, list(features), built, device, dist,
            writer if dist.rank == 0 else None,
        )  # fmt: skip
        return {
            "step_time_s": result["final_step_time_s"],
            "tflops_per_gpu": result["final_tflops_per_gpu"],
            "peak_mem_gib": result["peak_mem_gib"],
            "verify": result,
        }
    t_train = time.perf_counter()
    try:
        steps, series = train(plan, built, device, dist, writer if dist.rank == 0 else None)
    finally:  # a graph left on a module keeps the whole model alive (_speed.drop_graph_refs)
        graph_refs = drop_graph_refs(built.chunks)
    train_s = time.perf_counter() - t_train

    import megatron.core
    import torch

    summary = summarize_steps(steps, plan.semantics.warmup_steps)
    # adaptive: the steady-state estimate after the detected warm-up; fixed: the window's
    # medians (as before) with their interval
    measured = (
        series.result()
        if series.adaptive
        else series.result(summary["step_time_s"], summary["tflops_per_gpu"])
    )
    summary.update(measured.fields())
    if series.spec.clock == "cpu":  # what the figures are, and the wall time beside them
        measured_walls = series.wall_times[plan.semantics.warmup_steps :] or series.wall_times
        summary.update(step_clock="cpu", step_wall_time_s=statistics.median(measured_walls))
    tokens = plan.semantics.global_batch_size * plan.semantics.seq_length
    summary.update(plan.layout.as_dict())
    summary.update(
        device=spec.device,
        attention_backend=plan.attention_backend,
        precision=plan.semantics.precision,
        model_flops_per_step=model_flops_per_step(
            plan.model, plan.semantics, tensor_model_parallel_size=plan.layout.tp
        ),
        tokens_per_s_per_gpu=tokens / (summary["step_time_s"] * plan.layout.world),
        padded_vocab_size=built.padded_vocab,
        init=built.init,
        features=sorted(features),
        megatron_core=getattr(megatron.core, "__version__", "unknown"),
        torch=torch.__version__,
    )
    summary.update(_phases(build_s, steps, measured.warmup_steps))
    # the rest of the trial's own time: before the build (features, plan, process group,
    # kernel set-up) and between its steps (data, loss reduction, metrics lines)
    summary["setup_s"] = t_build - t_entry
    summary["graph_refs_dropped"] = graph_refs
    summary["step_gaps_s"] = max(0.0, train_s - math.fsum(s.step_time_s for s in steps))

    summary["adam_impl"] = adam_impl_of(built.optimizer)
    summary["training_state_bytes"] = training_state_bytes(built)
    if plan.semantics.packed_sequences:
        summary["packing"] = packing_summary(plan, len(steps))
    if mamba_kernels is not None:
        summary["mamba_kernels"] = mamba_kernels
    if autotune0 is not None:
        now = _autotune_cache.counters()
        summary["triton_autotune"] = {k: now[k] - autotune0.get(k, 0) for k in now}
    if notes:
        summary["notes"] = notes
    return summary


def packing_summary(plan: TrialPlan, n_steps: int) -> dict[str, Any]:
    """What a packed trial trained: the rows and sequences of its ``n_steps`` global batches
    (the same on every layout) and the attention path that kept the sequences apart."""
    from dse.workloads.megatron._data import GlobalBatches, packed_rows_stats

    sem = plan.semantics
    data = GlobalBatches(
        sem.data,
        global_batch_size=sem.global_batch_size,
        seq_length=sem.seq_length,
        vocab_size=plan.model.vocab_size,
        packed=True,
    )
    rows = seqs = 0
    for step in range(n_steps):
        r, n = packed_rows_stats(data.global_batch(step), plan.model.vocab_size)
        rows, seqs = rows + r, seqs + n
    return {
        "rows": rows,
        "sequences": seqs,
        "path": "block-diagonal causal attention_mask + per-sequence position_ids "
        f"({plan.attention_backend}, local spec); no PackedSeqParams/THD",
    }


def training_state_bytes(built: _Built) -> dict[str, int]:
    """The bytes of the training state this rank holds, counted from the live tensors (call
    it after the first optimizer step, when Adam's state exists): ``weights_trained`` and
    ``weights_frozen`` (the model's parameters, by ``requires_grad``), ``grads`` (the DDP
    gradient buffers, padding included, and any ``.grad`` outside them), ``optimizer``
    (Adam's state tensors and master weights that are not the model's own storage), with
    ``optimizer_params`` and ``frozen_in_optimizer`` (elements the optimizer updates, and
    how many of them are frozen weights: 0 when the frozen base has no optimizer state).
    Activations are not here: they live only inside a step."""
    seen: set[int] = set()
    weights = {True: 0, False: 0}
    frozen_ptrs: set[int] = set()
    model_storages: set[int] = set()
    params = []
    for chunk in built.chunks:
        for p in chunk.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            params.append(p)
            weights[bool(p.requires_grad)] += p.numel() * p.element_size()
            model_storages.add(p.untyped_storage().data_ptr())
            if not p.requires_grad:
                frozen_ptrs.add(p.data_ptr())
    grads = 0
    buffer_storages: set[int] = set()
    for chunk in built.chunks:
        for buf in [
            *getattr(chunk, "buffers", []),
            *getattr(chunk, "expert_parallel_buffers", []),
        ]:
            grads += buf.grad_data.numel() * buf.grad_data.element_size()
            buffer_storages.add(buf.grad_data.untyped_storage().data_ptr())
    for p in params:
        g = p.grad
        if g is not None and g.untyped_storage().data_ptr() not in buffer_storages:
            grads += g.numel() * g.element_size()
    optimizer = opt_params = frozen_in_opt = 0
    counted: set[int] = set()
    inner = getattr(built.optimizer, "chained_optimizers", None) or [built.optimizer]
    for opt in inner:
        torch_opt = getattr(opt, "optimizer", None)
        if torch_opt is None:
            continue
        for group in torch_opt.param_groups:
            for p in group["params"]:
                opt_params += p.numel()
                if p.data_ptr() in frozen_ptrs:
                    frozen_in_opt += p.numel()
                ptr = p.untyped_storage().data_ptr()
                if ptr not in model_storages and ptr not in counted:
                    counted.add(ptr)
                    optimizer += p.untyped_storage().nbytes()
        for state in torch_opt.state.values():
            for t in state.values():
                if hasattr(t, "untyped_storage") and t.untyped_storage().data_ptr() not in counted:
                    counted.add(t.untyped_storage().data_ptr())
                    optimizer += t.numel() * t.element_size()
    return {
        "weights_trained": weights[True],
        "weights_frozen": weights[False],
        "grads": grads,
        "optimizer": optimizer,
        "optimizer_params": opt_params,
        "frozen_in_optimizer": frozen_in_opt,
    }


def _autotune_counters(device: str) -> dict[str, int] | None:
    """On CUDA: Triton's autotune choices kept on disk for every kernel
    (:mod:`._autotune_cache`, installed once per process) and its counters now (None: no
    Triton here, or a CPU trial)."""
    if device != "cuda":
        return None

    return _autotune_cache.counters() if _autotune_cache.install() else None


def _phases(build_s: float, steps: Sequence[StepMetrics], warmup: int) -> dict[str, float]:
    """Where a trial's time on the device went, apart from its measured steps: the model
    build (parallel state, model, DDP, optimizer), the first step (kernel compilation and
    the allocator's first growth) and the warm-up steps (the first included)."""
    times = [s.step_time_s for s in steps]
    return {
        "build_s": build_s,
        "first_step_s": times[0] if times else 0.0,
        "warmup_steps_s": math.fsum(times[:warmup]),
        "measured_steps_s": math.fsum(times[warmup:]),
    }


def release_trial_state(device: str, keep_groups: Collection[Any] = ()) -> dict[str, float]:
    """Free what a trial left in this process, for the next trial of a warm worker:
    the caches of megatron-core that keep its modules alive (the rotary embeddings'
    ``lru_cache``, local CUDA graphs: :func:`._speed.clear_trial_caches`), Megatron's
    parallel state (its groups and global buffers), every process group but the
    default one and ``keep_groups``, unreachable objects (the model and optimizer of a
    finished trial), and the device caches. The default process group and compiled kernels
    stay. Returns the seconds each part took."""
    import gc

    import torch
    import torch.distributed as tdist
    from megatron.core import parallel_state

    took: dict[str, float] = {}
    t = time.perf_counter()
    took["caches_cleared"] = float(len(clear_trial_caches()))
    parallel_state.destroy_model_parallel()
    groups = 0
    if tdist.is_initialized():
        from torch.distributed import distributed_c10d as c10d

        world = c10d.GroupMember.WORLD
        keep = {id(g) for g in keep_groups}
        for pg in list(c10d._world.pg_map):
            if pg is not world and id(pg) not in keep:
                tdist.destroy_process_group(pg)
                groups += 1
    took["groups_s"], t = time.perf_counter() - t, time.perf_counter()
    took["groups"] = float(groups)
    gc.collect()
    took["gc_s"], t = time.perf_counter() - t, time.perf_counter()
    if device == "cuda":
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
    else:
        _trim_heap()
    took["cache_s"] = time.perf_counter() - t
    return took


def _trim_heap() -> None:
    """Give freed heap memory back to the OS (glibc), so that the resident set shows it."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def cuda_environment(environ: Any) -> dict[str, str]:
    """What the trainer adds to a CUDA trial's environment: Megatron-LM's
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (needed to overlap TP communication), only when the
    trial's environment (the space's ``env`` section, an ``env.`` knob) does not set it."""
    if "CUDA_DEVICE_MAX_CONNECTIONS" in environ:
        return {}
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def _failure_metrics(spec_device: str | None) -> dict[str, Any]:
    if spec_device is None:
        return {}
    try:
        alloc, reserved = _peak_memory_gib(spec_device)
    except Exception:  # noqa: BLE001 - best effort: the failure line matters more
        return {}
    return {"peak_mem_gib": alloc, "peak_reserved_gib": reserved}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the trial process; returns (and exits with) 0 or 3."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", required=True, help="trial spec JSON (dse.core.records.TrialSpec)"
    )
    args = parser.parse_args(argv)
    _quiet_known_warnings()
    with open(args.spec) as f:
        spec = TrialSpec.model_validate_json(f.read())
    stop_on_signals()
    return _exit(run_spec(spec, _Dist()))


def run_spec(spec: TrialSpec, dist: _Dist) -> int:
    """Run one trial and write its final metrics line (a summary, or one failure line for
    every failure); returns ``EXIT_OK`` or ``EXIT_FAILURE`` without exiting (the trial
    process exits with it, a warm worker goes on or is recycled)."""
    writer = MetricsWriter(spec.metrics_path)
    try:
        summary = run_trial(spec, dist, writer)
    except (TrialInterrupted, KeyboardInterrupt) as e:
        signame = str(e) if isinstance(e, TrialInterrupted) else "SIGINT"
        writer.failure(
            "interrupted",
            f"stopped by {signame} before the trial ended (a runner's stop, a scheduler's "
            "preemption or time limit, or Ctrl-C); the steps before it are kept",
        )
        return EXIT_FAILURE
    except TrialFailure as e:
        metrics = {
            **_failure_metrics(spec.device if e.failure_class == "oom" else None),
            **e.metrics,
        }
        writer.failure(e.failure_class, e.reason, metrics)
        return EXIT_FAILURE
    except Exception as e:  # noqa: BLE001 - every failure becomes a failure line
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            writer.failure(
                "oom",
                str(e).splitlines()[0] if str(e) else "out of memory",
                _failure_metrics(spec.device),
            )
        else:
            traceback.print_exc()
            writer.failure("error", f"{type(e).__name__}: {e} [{_location(e)}]")
        return EXIT_FAILURE
    if dist.rank == 0:
        writer.summary(summary)
    return EXIT_OK


def _exit(code: int) -> int:
    """Leave the process group and exit. A failed rank exits at once: its peers may be
    blocked in a collective, and torchrun ends them when this rank exits non-zero."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code != EXIT_OK:
        os._exit(code)
    try:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            if tdist.get_backend() == "nccl":
                tdist.barrier(device_ids=[int(os.environ.get("LOCAL_RANK", "0"))])
            else:
                tdist.barrier()
            tdist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the metrics are written; teardown is best effort
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
