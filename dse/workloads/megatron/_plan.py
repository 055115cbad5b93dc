"""A trial's plan: the parallel layout, batch arithmetic and config fields of a trial spec,
and the checks that reject a configuration before anything is built (no torch here). The
layout is :meth:`dse.space.layout.Layout.resolve`'s and the checks are
:func:`dse.model.rules.check`'s,
the same as before launch.

Expected failures are raised as :class:`TrialFailure` inside the trial process and turned
into one ``{"type": "failure", ...}`` metrics line by the trainer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dse.core.exceptions import UnknownKnobError
from dse.core.records import FailureClass, TrialSpec
from dse.model import rules
from dse.space.knobs import FIELD_SOURCES, KNOBS, assignments, get_knob, knob_value
from dse.space.layout import Layout
from dse.space.searchspace import ModelSpec, Resources, Semantics
from dse.workloads.launchers.megatron_lm import builtin_refusal
from dse.workloads.megatron._lora import lora_refusal
from dse.workloads.megatron.features import has_feature

__all__ = [
    "EXIT_OK",
    "EXIT_FAILURE",
    "TrialFailure",
    "TrialPlan",
    "make_plan",
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
        self, failure_class: FailureClass, reason: str, metrics: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{failure_class}: {reason}")
        self.failure_class = failure_class
        self.reason = reason
        self.metrics = dict(metrics or {})


@dataclass(frozen=True)
class TrialPlan:
    """Everything the trainer derives from a :class:`TrialSpec` before building.

    ``layout`` is the parallel layout (:meth:`Layout.resolve`, the same as before launch;
    :meth:`Layout.as_dict` is what the summary line reports). ``fields`` holds the
    Megatron-Core field assignments of the knobs, by section
    (``model`` = TransformerConfig/ModelParallelConfig, ``ddp``, ``optimizer``, ``train``),
    with the attention fields removed (the trainer picks the layer spec from
    ``attention_backend``).
    """

    spec: TrialSpec
    model: ModelSpec
    semantics: Semantics
    layout: Layout
    attention_backend: str
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def local_spec(self) -> bool:
        """True when the model is built from Megatron-Core's local (non-TE) layer spec."""
        return self.attention_backend in LOCAL_ATTENTION

    @property
    def hybrid(self) -> bool:
        """True for a hybrid (``hybrid_layer_pattern``) model: a ``MambaModel`` of
        :mod:`.mamba`'s local spec instead of a ``GPTModel``."""
        return self.model.is_hybrid

    @property
    def mamba_mem_eff_path(self) -> bool:
        """Megatron's ``use_mamba_mem_eff_path`` of this trial (its default: True)."""
        return bool(self.fields["model"].get("use_mamba_mem_eff_path", True))

    @property
    def sequence_parallel(self) -> bool:
        return bool(self.fields["model"].get("sequence_parallel", False))


def _hybrid_check(model: ModelSpec, attention_backend: str, device: str) -> None:
    """A hybrid model is built from dse's local Mamba spec (:mod:`.mamba`): attention on the
    local spec only, and on a GPU the Mamba layers on mamba-ssm's Triton kernels, probed here
    whatever the spec declares (never substituted; a CPU trial runs the labelled torch
    reference of :mod:`._mamba_kernels`)."""
    if attention_backend not in LOCAL_ATTENTION:
        raise TrialFailure(
            "invalid",
            "the built-in trainer builds hybrid (Mamba) models from its local spec: "
            f"attention_backend must be one of {list(LOCAL_ATTENTION)} "
            f"(attention_backend={attention_backend!r}); the TE spec runs through a recipe "
            "launcher",
        )
    if device == "cuda" and model.layer_counts()["mamba"]:
        if not has_feature("mamba_ssm"):
            raise TrialFailure(
                "invalid",
                "Mamba layers need the mamba-ssm kernels (its Triton SSD scan, "
                "mamba_ssm.ops.triton), which do not import here; the built-in trainer does "
                "not substitute them on a GPU",
            )


def _training_semantics_check(
    model: ModelSpec, semantics: Semantics, params: Mapping[str, Any]
) -> None:
    """What the built-in trainer cannot train of the study's training semantics (class
    ``invalid``, naming it): packed sequences off its one packing path (:func:`packing_refusal`),
    and LoRA where its adapters cannot go (:func:`dse.workloads.megatron._lora.lora_refusal`)."""

    if semantics.packed_sequences:
        why = packing_refusal(model, semantics, params)
        if why:
            raise TrialFailure("invalid", f"semantics.packed_sequences: {why}")
    why = lora_refusal(
        semantics.peft,
        int(knob_value(params, "tensor_model_parallel_size") or 1),
        bool(knob_value(params, "moe_grouped_gemm")) and model.num_moe_experts is not None,
        model.is_hybrid,
    )
    if why:
        raise TrialFailure("invalid", f"semantics.peft: {why}")


def _attention_model_check(model: ModelSpec) -> None:
    """What the built-in trainer cannot build of the model's attention (class ``invalid``,
    naming the field): Multi-Latent Attention (on a CPU Megatron-Core's local
    DotProductAttention takes no separate query/key and value head dims, and its rotary
    embedding asks for a CUDA device) and query/key norms (its layer specs are built
    without them)."""
    if model.multi_latent_attention:
        raise TrialFailure(
            "invalid",
            "model.multi_latent_attention: the built-in trainer does not build Multi-Latent "
            "Attention (Megatron-Core's local attention takes no k_channels); run a "
            "Megatron-LM or Bridge recipe launcher, or the sim workload for estimates",
        )
    if model.qk_layernorm:
        raise TrialFailure(
            "invalid",
            "model.qk_layernorm: the built-in trainer builds no query/key norms; run a "
            "recipe launcher",
        )


def packing_refusal(
    model: ModelSpec, semantics: Semantics, params: Mapping[str, Any]
) -> str | None:
    """Why the built-in trainer cannot train this packed-sequence study (None: it can).

    Its one packing path: each packed row's sequences end at an end-of-document token (id
    ``vocab_size - 1``, Megatron's ``NullTokenizer`` convention), and every sequence attends
    only within itself through a block-diagonal causal ``attention_mask`` with per-sequence
    position ids, on Megatron-Core's local spec (``unfused`` DotProductAttention, or dse's
    ``sdpa``), the loss masked where the input is the end-of-document token (Megatron's
    ``reset_attention_mask`` / ``reset_position_ids`` / ``eod_mask_loss``). Not the THD
    layout: the local DotProductAttention asserts ``packed_seq_params is None``, so no
    ``PackedSeqParams`` / ``cu_seqlens`` batch runs on a CPU, and a Transformer Engine
    attention (THD on a GPU) runs through a Bridge or NeMo launcher instead."""
    backend = str(knob_value(params, "attention_backend"))
    if backend not in LOCAL_ATTENTION:
        return (
            f"the built-in trainer packs sequences through a block-diagonal attention mask "
            f"on the local spec (attention_backend {list(LOCAL_ATTENTION)}), not "
            f"attention_backend={backend!r} (Transformer Engine's THD layout with "
            "cu_seqlens runs through a Bridge or NeMo packed-SFT recipe launcher)"
        )
    fusion = bool(knob_value(params, "masked_softmax_fusion"))
    if backend == "unfused" and semantics.precision != "fp32" and fusion:
        return (
            f"attention_backend unfused at {semantics.precision} with masked_softmax_fusion "
            "on: Megatron-Core's fused causal softmax (ScaledUpperTriangMaskedSoftmax) "
            "ignores a given attention_mask, so the sequences of a packed row would see "
            "each other; set masked_softmax_fusion false or use attention_backend sdpa"
        )
    if model.is_hybrid:
        return (
            "Mamba layers take no attention mask, so a state would carry across the "
            "sequences of a packed row; run a Bridge or NeMo packed-SFT recipe launcher"
        )
    cp = int(knob_value(params, "context_parallel_size") or 1)
    if cp > 1:
        return (
            f"context_parallel_size={cp}: the built-in trainer's block-diagonal mask is not "
            "split over context-parallel ranks (Megatron's CP with packing is THD on "
            "Transformer Engine)"
        )
    if semantics.data.kind == "path":
        return (
            "data.kind path: a token file's end-of-document id is its tokenizer's, which "
            "the space does not name; use data.kind synthetic or mock"
        )
    return None


def make_plan(spec: TrialSpec, features: Iterable[str] | None = None) -> TrialPlan:
    """Validate the spec and derive its layout, as the pre-launch check does.

    Raises :class:`TrialFailure` (class ``invalid``) when the configuration cannot run: a
    spec that does not parse, an unknown knob or value, or the first of
    :func:`dse.model.rules.check`'s violations, with the same rule name and text as before launch
    (``features``: the software present where the trial runs; None skips the feature rules).
    """
    try:
        model = ModelSpec.model_validate(spec.model)
        semantics = Semantics.model_validate(spec.semantics)
        resources = Resources(
            world_size=spec.world_size,
            device=spec.device,
            gpu=spec.gpu,
            gpu_memory_gib=spec.gpu_memory_gib,
            features=sorted(features) if features is not None else "detect",
        )
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
    violation = rules.first_violation(
        rules.Problem(model, semantics, resources), spec.params, features
    )
    if violation is not None:
        raise TrialFailure("invalid", str(violation))
    if model.is_hybrid:
        _hybrid_check(model, str(knob_value(spec.params, "attention_backend")), spec.device)

    for name, value in spec.params.items():
        refused = builtin_refusal(name, value)
        if refused:
            raise TrialFailure("invalid", f"{name}={value!r}: {refused}")
        if name in FIELD_SOURCES and value not in (None, KNOBS[name].default):
            raise TrialFailure(
                "invalid",
                f"{name}={value!r} sets a field of {FIELD_SOURCES[name]}, which the built-in "
                "trainer's Megatron-Core does not have; run it through a recipe launcher",
            )

    _training_semantics_check(model, semantics, spec.params)
    _attention_model_check(model)

    fields: dict[str, dict[str, Any]] = {
        "model": {}, "ddp": {}, "optimizer": {}, "train": {}, "env": {},
    }  # fmt: skip
    for a in fas:
        if a.section == "model" and a.field in _ATTENTION_FIELDS:
            continue
        if a.section == "checkpoint" or (
            a.section in ("model", "ddp", "optimizer") and a.field in FIELD_SOURCES
        ):
            continue  # at their defaults (refused above otherwise); the trainer saves nothing
        fields[a.section][a.field] = a.value
    return TrialPlan(
        spec=spec,
        model=model,
        semantics=semantics,
        layout=Layout.resolve(model, semantics, resources, spec.params),
        attention_backend=str(knob_value(spec.params, "attention_backend")),
        fields=fields,
    )
