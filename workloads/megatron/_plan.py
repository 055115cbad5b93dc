"""A trial's plan: the parallel layout, batch arithmetic and config fields of a trial spec,
and the checks that reject a configuration before anything is built (no torch here).

Expected failures are raised as :class:`TrialFailure` inside the trial process and turned
into one ``{"type": "failure", ...}`` metrics line by the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dse.exceptions import UnknownKnobError
from dse.knobs import assignments, get_knob
from dse.records import TrialSpec
from dse.space import ModelSpec, Semantics

__all__ = [
    "EXIT_OK",
    "EXIT_FAILURE",
    "TrialFailure",
    "TrialPlan",
    "make_plan",
    "check_features",
    "check_local_spec",
]

#: Exit status of a trial process that wrote a summary line.
EXIT_OK = 0
#: Exit status of a trial process (rank) that wrote a failure line. Under torchrun the
#: launcher itself then exits non-zero (1); the metrics file is the record either way.
EXIT_FAILURE = 3

#: attention_backend values served by Megatron-Core's local spec (no Transformer Engine).
LOCAL_ATTENTION = ("unfused", "sdpa")

#: Fields the trainer sets itself from the attention_backend knob (not copied verbatim).
_ATTENTION_FIELDS = ("transformer_impl", "attention_backend")


class TrialFailure(Exception):
    """An expected failure of a trial: becomes a failure line, never a crash."""

    def __init__(
        self, failure_class: str, reason: str, metrics: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{failure_class}: {reason}")
        self.failure_class = failure_class
        self.reason = reason
        self.metrics = dict(metrics or {})


@dataclass(frozen=True)
class TrialPlan:
    """Everything the trainer derives from a :class:`TrialSpec` before building.

    ``fields`` holds the Megatron-Core field assignments of the knobs, by section
    (``model`` = TransformerConfig/ModelParallelConfig, ``ddp``, ``optimizer``, ``train``),
    with the attention fields removed (the trainer picks the layer spec from
    ``attention_backend``).
    """

    spec: TrialSpec
    model: ModelSpec
    semantics: Semantics
    world_size: int
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int | None
    dp: int
    micro_batch_size: int
    num_microbatches: int
    attention_backend: str
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def local_spec(self) -> bool:
        """True when the model is built from Megatron-Core's local (non-TE) layer spec."""
        return self.attention_backend in LOCAL_ATTENTION

    @property
    def sequence_parallel(self) -> bool:
        return bool(self.fields["model"].get("sequence_parallel", False))

    def layout(self) -> dict[str, Any]:
        """The layout fields reported in the summary line."""
        return {
            "world_size": self.world_size,
            "tp": self.tp,
            "pp": self.pp,
            "vpp": self.vpp,
            "cp": self.cp,
            "ep": self.ep,
            "etp": self.etp,
            "dp": self.dp,
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
        }


def _int(value: Any, default: int) -> int:
    return default if value is None else int(value)


def make_plan(spec: TrialSpec) -> TrialPlan:
    """Validate the spec's model, semantics and knobs and derive the layout.

    Raises :class:`TrialFailure` (class ``invalid``) when the configuration cannot run:
    unknown knobs, a world size that the parallel sizes do not divide, a global batch that
    micro-batches times data-parallel ranks do not divide.
    """
    try:
        model = ModelSpec.model_validate(spec.model)
        semantics = Semantics.model_validate(spec.semantics)
    except ValidationError as e:
        raise TrialFailure("invalid", f"bad model/semantics in the trial spec: {e}") from None
    try:
        fas = assignments(spec.params)
    except UnknownKnobError as e:
        raise TrialFailure("invalid", str(e)) from None
    for name, value in spec.params.items():
        why = get_knob(name).check_value(value)
        if why:
            raise TrialFailure("invalid", f"knob {name}: {why}")
    if model.seq_length is not None and model.seq_length != semantics.seq_length:
        raise TrialFailure(
            "invalid",
            f"model.seq_length must equal semantics.seq_length "
            f"(model.seq_length={model.seq_length}, semantics.seq_length={semantics.seq_length})",
        )

    fields: dict[str, dict[str, Any]] = {"model": {}, "ddp": {}, "optimizer": {}, "train": {}}
    for a in fas:
        if a.section == "model" and a.field in _ATTENTION_FIELDS:
            continue
        fields[a.section][a.field] = a.value
    mf = fields["model"]
    tp = _int(mf.get("tensor_model_parallel_size"), 1)
    pp = _int(mf.get("pipeline_model_parallel_size"), 1)
    vpp = mf.get("virtual_pipeline_model_parallel_size")
    cp = _int(mf.get("context_parallel_size"), 1)
    ep = _int(mf.get("expert_model_parallel_size"), 1)
    etp = mf.get("expert_tensor_parallel_size")
    mbs = _int(fields["train"].get("micro_batch_size"), 1)
    world = spec.world_size
    gbs = semantics.global_batch_size

    if world % (tp * pp * cp):
        raise TrialFailure(
            "invalid",
            "world size must be a multiple of TP x PP x CP "
            f"(world_size={world}, tp={tp}, pp={pp}, cp={cp})",
        )
    dp = world // (tp * pp * cp)
    if gbs % (mbs * dp):
        raise TrialFailure(
            "invalid",
            "global batch size must be a multiple of micro-batch size x data-parallel size "
            f"(global_batch_size={gbs}, micro_batch_size={mbs}, dp={dp})",
        )
    if vpp is not None and pp < 2:
        raise TrialFailure(
            "invalid",
            "virtual pipeline stages need pipeline parallelism "
            f"(virtual_pipeline_model_parallel_size={vpp}, pipeline_model_parallel_size={pp})",
        )
    if model.num_moe_experts is None and (ep > 1 or (etp is not None and etp > 1)):
        raise TrialFailure(
            "invalid",
            f"expert parallelism needs an MoE model (expert_model_parallel_size={ep}, "
            f"expert_tensor_parallel_size={etp}, num_moe_experts=None)",
        )
    expert_grid = (etp if etp is not None else tp) * ep * pp
    if world % expert_grid:
        raise TrialFailure(
            "invalid",
            "world size must be a multiple of ETP x EP x PP "
            f"(world_size={world}, etp={etp if etp is not None else tp}, ep={ep}, pp={pp})",
        )
    if semantics.seq_length % (2 * cp) and cp > 1:
        raise TrialFailure(
            "invalid",
            "sequence length must be a multiple of 2 x CP "
            f"(seq_length={semantics.seq_length}, cp={cp})",
        )
    if (
        model.num_moe_experts is not None
        and tp > 1
        and not fields["model"].get("sequence_parallel", False)
    ):
        raise TrialFailure(
            "invalid",
            "MoE with tensor parallelism needs sequence_parallel in training "
            f"(megatron-core raises at the first MoE forward; tensor_model_parallel_size={tp}, "
            "sequence_parallel=False)",
        )
    if semantics.precision == "fp16" and spec.device == "cpu":
        raise TrialFailure("invalid", "fp16 training is not supported on CPU")
    return TrialPlan(
        spec=spec,
        model=model,
        semantics=semantics,
        world_size=world,
        tp=tp,
        pp=pp,
        vpp=None if vpp is None else int(vpp),
        cp=cp,
        ep=ep,
        etp=None if etp is None else int(etp),
        dp=dp,
        micro_batch_size=mbs,
        num_microbatches=gbs // (mbs * dp),
        attention_backend=str(spec.params.get("attention_backend", "unfused")),
        fields=fields,
    )


_FEATURE_NAMES = {
    "transformer_engine": "Transformer Engine",
    "apex": "NVIDIA apex",
    "deepep": "DeepEP",
    "hybridep": "DeepEP HybridEP (hybrid-ep branch)",
    "flash_attn": "flash-attn",
}


#: Knobs whose value has no effect (so needs nothing) unless another knob enables them.
_EFFECTIVE_WHEN: dict[str, Callable[[dict[str, Any]], bool]] = {
    "moe_flex_dispatcher_backend": lambda p: p.get("moe_token_dispatcher_type") == "flex",
    "cross_entropy_fusion_impl": lambda p: bool(p.get("cross_entropy_loss_fusion", False)),
}


def check_features(params: dict[str, Any], features: Iterable[str]) -> None:
    """Raise an ``invalid`` :class:`TrialFailure` naming the first knob value whose required
    feature (:meth:`dse.knobs.Knob.requires`) is not among ``features``.

    A knob that only matters when another knob enables it (the flex dispatcher's backend,
    the fused cross-entropy implementation) needs nothing while it is disabled.
    """
    have = set(features)
    for name, value in params.items():
        effective = _EFFECTIVE_WHEN.get(name)
        if effective is not None and not effective(params):
            continue
        missing = [f for f in get_knob(name).requires(value) if f not in have]
        if missing:
            what = ", ".join(_FEATURE_NAMES.get(f, f) for f in missing)
            raise TrialFailure(
                "invalid",
                f"{name}={value!r} needs {what} ({', '.join(missing)}), "
                "which is not available where the trial runs",
            )


def check_local_spec(plan: TrialPlan, features: Iterable[str]) -> None:
    """Known limits of Megatron-Core 0.16.1's local layer spec, as ``invalid`` failures."""
    if not plan.local_spec:
        return
    have = set(features)
    if plan.sequence_parallel and (plan.model.normalization == "RMSNorm" or "apex" not in have):
        raise TrialFailure(
            "invalid",
            "sequence_parallel is not supported by the local spec's torch norms "
            f"(attention_backend={plan.attention_backend}, "
            f"normalization={plan.model.normalization}); it needs Transformer Engine "
            "(or apex for LayerNorm)",
        )
    if plan.cp > 1:
        raise TrialFailure(
            "invalid",
            "context parallelism needs Transformer Engine attention; the local spec's "
            f"core attention does not support it (context_parallel_size={plan.cp}, "
            f"attention_backend={plan.attention_backend})",
        )
