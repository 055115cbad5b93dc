"""Speed and memory parts of the built-in trainer that Megatron-Core leaves to its caller
(megatron-core 0.16.1 without Transformer Engine or Apex), kept apart from the trainer's
model and training code.

* **The Adam implementation.** Without TE or Apex, ``megatron.core.optimizer`` falls back to
  ``torch.optim.AdamW`` (its ``Adam`` name) with torch's default implementation: on CUDA the
  multi-tensor ``foreach`` path, a few kernels per parameter group and math op. TE's and
  Apex's ``FusedAdam``, which a full install uses, are one fused kernel per chunk of tensors;
  torch's own ``fused=True`` AdamW is the equivalent without them (the same update; the
  rounding of the last bit may differ). :func:`set_adam_impl` switches a built optimizer
  between the two (the trainer's default is :data:`DEFAULT_ADAM_IMPL`; ``bench/speed_ab.py``
  toggles it between interleaved windows of one model).
* **Caches a finished trial leaves.** ``RotaryEmbedding.forward`` (and the YaRN variant) is
  an ``functools.lru_cache`` method: each trial's model adds an entry that keeps its rotary
  module and its embedding tensor (2 MiB at sequence 4096, and the allocator segment that
  holds it) alive in a warm worker until 32 trials have passed. :func:`clear_trial_caches`
  empties these caches and Megatron-Core's local CUDA graphs of the trial.
* :func:`live_tensors`: the tensors still reachable in this process, by device (what a warm
  worker reports after each release, so a leak shows as a count that grows).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any, Literal

__all__ = [
    "AdamImpl",
    "DEFAULT_ADAM_IMPL",
    "torch_adams",
    "set_adam_impl",
    "adam_impl_of",
    "clear_trial_caches",
    "live_tensors",
    "cudagraphable_rng",
    "rng_seed_kwargs",
    "drop_graph_refs",
]

AdamImpl = Literal["fused", "foreach"]
#: The implementation the trainer asks torch's AdamW for when Megatron-Core fell back to it.
DEFAULT_ADAM_IMPL: AdamImpl = "fused"


def torch_adams(optimizer: Any) -> Iterator[Any]:
    """The ``torch.optim.Adam``/``AdamW`` instances inside a Megatron optimizer (a
    ``ChainedOptimizer``, a mixed-precision or distributed optimizer, or a torch one)."""
    import torch

    seen: set[int] = set()
    todo = [optimizer]
    while todo:
        o = todo.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.optim.Adam | torch.optim.AdamW):
            yield o
            continue
        todo.extend(getattr(o, "chained_optimizers", []) or [])
        todo.append(getattr(o, "optimizer", None))


def set_adam_impl(optimizer: Any, impl: AdamImpl) -> int:
    """Switch every torch Adam(W) inside ``optimizer`` to ``impl`` (``fused``: one fused
    kernel per device and dtype; ``foreach``: torch's multi-tensor path); the state already
    made moves with it (the step counter lives on the parameter's device for ``fused``, on
    the host for a non-capturable ``foreach``). Returns how many optimizers were switched;
    0 when Megatron-Core uses another one (TE's or Apex's FusedAdam). A parameter that the
    fused kernel does not take (not floating point, not on CPU/CUDA) leaves that optimizer
    as it is."""
    import torch

    fused = impl == "fused"
    n = 0
    for opt in torch_adams(optimizer):
        params = [p for g in opt.param_groups for p in g["params"]]
        if fused and not all(
            p.is_floating_point() and p.device.type in ("cuda", "cpu") for p in params
        ):
            continue
        opt.defaults["fused"], opt.defaults["foreach"] = fused, not fused
        for g in opt.param_groups:
            g["fused"], g["foreach"] = fused, not fused
            capturable = bool(g.get("capturable"))
            for p in g["params"]:
                st = opt.state.get(p)
                if not st or "step" not in st:
                    continue
                step = st["step"]
                if fused or capturable:
                    st["step"] = step.to(device=p.device, dtype=torch.float32)
                else:
                    st["step"] = step.to(device="cpu", dtype=torch.float32)
        n += 1
    return n


def adam_impl_of(optimizer: Any) -> str | None:
    """``fused``, ``foreach`` or ``default`` of the first torch Adam(W) inside
    ``optimizer`` (None: there is none)."""
    for opt in torch_adams(optimizer):
        g = opt.param_groups[0]
        return "fused" if g.get("fused") else "foreach" if g.get("foreach") else "default"
    return None


def cudagraphable_rng(model_fields: dict[str, Any]) -> bool:
    """Whether the trial's RNG tracker must be the graph-safe one: Megatron-Core's local
    CUDA graphs (``cuda_graph_impl: local``) assert it (``CudaGraphManager``), and
    Megatron-LM seeds with ``use_cudagraphable_rng`` for them."""
    return model_fields.get("cuda_graph_impl") == "local"


def rng_seed_kwargs(model_fields: dict[str, Any], tensor_parallel: Any) -> dict[str, Any]:
    """Keyword arguments of Megatron-Core's ``model_parallel_cuda_manual_seed`` for a trial:
    the graph-safe tracker where :func:`cudagraphable_rng` asks for it, and a fresh tracker
    every time (``force_reset_rng``). Megatron-Core keeps the first tracker a process made
    (``initialize_rng_tracker`` returns at once once one exists), so without the reset a
    trial with ``cuda_graph_impl: local`` after one without (a warm worker's next trial, a
    bench's second build) seeded the old, graph-unsafe tracker and Megatron's
    ``CudaGraphManager`` refused it ("RNG tracker does not support cudagraphs!").
    ``tensor_parallel``: ``megatron.core.tensor_parallel`` (a megatron-core without
    ``force_reset_rng`` gets no reset)."""
    import inspect

    kw: dict[str, Any] = {"use_cudagraphable_rng": cudagraphable_rng(model_fields)}
    params = inspect.signature(tensor_parallel.model_parallel_cuda_manual_seed).parameters
    if "force_reset_rng" in params:
        kw["force_reset_rng"] = True
    return kw


def drop_graph_refs(chunks: Any) -> int:
    """Drop the tensors that modules of a finished trial keep as plain attributes while they
    still carry an autograd graph (``grad_fn``); return how many. Megatron-Core 0.16.1's MoE
    token dispatchers keep the last micro-batch's routing tensors (``MoEAllGatherTokenDispatcher
    .local_probs``, a ``masked_select`` of the router's probabilities): its graph reaches the
    parameters' gradient accumulators, whose hooks (Megatron DDP's) hold the DDP wrapper and so
    the model, the optimizer and their memory. The edges through autograd's C++ nodes are
    invisible to Python's collector, so that cycle was never freed: a warm worker kept 12.9-24
    GiB after every hybrid Mamba-MoE trial on the H200 and was replaced each time."""
    import torch

    def graph_tensor(value: Any) -> bool:
        return (
            isinstance(value, torch.Tensor)
            and not isinstance(value, torch.nn.Parameter)
            and value.grad_fn is not None
        )

    def drop(obj: Any) -> int:
        names = [k for k, v in vars(obj).items() if graph_tensor(v)]
        for k in names:
            setattr(obj, k, None)
        return len(names)

    n = 0
    for chunk in chunks:
        for mod in chunk.modules():
            n += drop(mod)
            # helpers a module holds that are not modules (the MoE token dispatcher)
            for value in list(vars(mod).values()):
                if (
                    not isinstance(value, torch.nn.Module | torch.Tensor | type)
                    and hasattr(value, "__dict__")
                    and type(value).__module__.startswith("megatron.")
                ):
                    n += drop(value)
    return n


def clear_trial_caches() -> list[str]:
    """Empty the caches of megatron-core that keep a finished trial's modules and tensors
    alive (see the module doc) and delete its local CUDA graphs; the names of those
    cleared."""
    done: list[str] = []
    try:
        from megatron.core.models.common.embeddings import rotary_pos_embedding as rope

        rope.RotaryEmbedding.forward.cache_clear()
        done.append("RotaryEmbedding.forward")
    except (ImportError, AttributeError):
        pass
    try:
        from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as yarn

        yarn.YarnRotaryEmbedding.forward.cache_clear()
        done.append("YarnRotaryEmbedding.forward")
    except (ImportError, AttributeError):
        pass
    try:
        from megatron.core.transformer import cuda_graphs as cg

        rec = cg._CudagraphGlobalRecord
        if rec.cudagraph_created or rec.cudagraph_record or rec.cudagraph_inference_record:
            cg.delete_cuda_graphs()
            done.append("cuda_graphs")
    except (ImportError, AttributeError, AssertionError, RuntimeError):
        pass
    return done


def live_tensors() -> dict[str, float]:
    """Tensors reachable from Python in this process (after a collection) and tracked by the
    collector (a warm worker freezes what its imports made, ``gc.freeze``: those are not
    counted, so the figure is what the trials added): their count and MiB, per device type
    (``cuda_n``, ``cuda_mib``, ``cpu_n``, ``cpu_mib``). Storage shared by views counts
    once."""
    import warnings

    import torch

    gc.collect()
    out: dict[str, float] = {"cpu_n": 0.0, "cpu_mib": 0.0}
    if torch.cuda.is_available():
        out.update(cuda_n=0.0, cuda_mib=0.0)
    seen: set[tuple[str, int]] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on torch's deprecated module aliases
        objs = gc.get_objects()
        tensors = [o for o in objs if isinstance(o, torch.Tensor)]
    del objs
    for obj in tensors:
        try:
            if obj.is_meta:
                continue
            kind = obj.device.type
            st = obj.untyped_storage()
            key = (kind, st.data_ptr())
        except Exception:  # noqa: BLE001 - odd tensor subclasses: not counted
            continue
        out[f"{kind}_n"] = out.get(f"{kind}_n", 0.0) + 1
        if key in seen or key[1] == 0:
            continue
        seen.add(key)
        out[f"{kind}_mib"] = out.get(f"{kind}_mib", 0.0) + st.nbytes() / 2**20
    return out
