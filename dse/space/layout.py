"""The parallel layout of a configuration, derived once.

Every part of dse that needs DP, the micro-batch count or the effective expert sizes
(validity rules, cost model, space constraints, exporters, the trial process) takes them
from :meth:`Layout.resolve`; it holds the one default policy:

* a knob that is absent, or set to None, takes its catalog default
  (:data:`dse.space.knobs.KNOBS`): TP = PP = CP = EP = MBS = 1, no virtual pipeline;
* ``expert_tensor_parallel_size`` None means ETP = TP (Megatron-Core
  ``initialize_model_parallel``);
* ``dp = world / (TP*PP*CP)`` and ``edp = world / (ETP*EP*PP)``, 0 when the world does not
  divide (the rules report that; nothing here raises);
* ``num_microbatches = GBS // (MBS*DP)`` (0 when DP is 0).

Like Megatron-Core's config objects, this only derives; whether the layout is legal is
:mod:`dse.model.rules`' job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dse.space.knobs import knob_value

__all__ = [
    "Layout",
    "PipelineSplit",
    "PipelineSplitError",
    "PIPELINE_SPLIT_KNOBS",
    "pipeline_chunks",
    "pipeline_stage_layers",
    "parse_pipeline_layout",
]

#: The Megatron-Core TransformerConfig fields that move layers between pipeline stages
#: (megatron/core/transformer/transformer_config.py): uneven first / last stages, the
#: embedding and the loss counted as a layer, and an explicit layout.
PIPELINE_SPLIT_KNOBS = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
)


class PipelineSplitError(ValueError):
    """A pipeline split Megatron-Core refuses; the message names the check."""


@dataclass(frozen=True)
class PipelineSplit:
    """How the decoder layers are placed on pipeline stages (Megatron-Core field names).

    All unset: the even split (``num_layers / PP`` per rank, ``/ VPP`` per chunk)."""

    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    pipeline_model_parallel_layout: str | None = None

    @property
    def uneven(self) -> bool:
        return (
            self.num_layers_in_first_pipeline_stage is not None
            or self.num_layers_in_last_pipeline_stage is not None
        )

    @property
    def accounts(self) -> bool:
        return self.account_for_embedding_in_pipeline_split or (
            self.account_for_loss_in_pipeline_split
        )

    @property
    def is_even(self) -> bool:
        return not (self.uneven or self.accounts or self.pipeline_model_parallel_layout)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> PipelineSplit:
        def opt_int(name: str) -> int | None:
            v = params.get(name)
            return None if v is None else int(v)

        layout = params.get("pipeline_model_parallel_layout")
        return cls(
            num_layers_in_first_pipeline_stage=opt_int("num_layers_in_first_pipeline_stage"),
            num_layers_in_last_pipeline_stage=opt_int("num_layers_in_last_pipeline_stage"),
            account_for_embedding_in_pipeline_split=bool(
                params.get("account_for_embedding_in_pipeline_split") or False
            ),
            account_for_loss_in_pipeline_split=bool(
                params.get("account_for_loss_in_pipeline_split") or False
            ),
            pipeline_model_parallel_layout=None if layout in (None, "") else str(layout),
        )


#: Symbols of a pipeline layout string (megatron/core/transformer/
#: pipeline_parallel_layer_layout.py ``parse_str_to_list``): embedding, loss, decoder layer
#: ("t", transformer), multi-token-prediction layer.
_LAYOUT_SYMBOLS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_REPEAT = re.compile(r"(.)\*(\d+)")


def parse_pipeline_layout(text: str) -> list[str]:
    """The virtual stages of a layout string in order (stage ``i`` is pipeline rank
    ``i % PP``, chunk ``i // PP``), each a string of ``E``/``L``/``t``/``m``.

    The grammar Megatron-Core reads: ``|`` ends a stage, ``,`` is cosmetic, ``(...)*n`` and
    ``x*n`` repeat. Raises :class:`PipelineSplitError` naming an unknown symbol."""
    flat = text.replace(",", "")
    flat = _GROUP.sub(lambda m: m.group(1) * int(m.group(2)), flat)
    flat = _REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    for st in stages:
        bad = sorted({ch for ch in st if ch not in _LAYOUT_SYMBOLS})
        if bad:
            raise PipelineSplitError(
                f"pipeline_model_parallel_layout has unknown symbols {bad} (known: "
                + ", ".join(f"{k} {v}" for k, v in _LAYOUT_SYMBOLS.items())
                + ")"
            )
    return stages


def _layout_chunks(num_layers: int, pp: int, vpp: int | None, text: str) -> list[list[list[int]]]:
    stages = parse_pipeline_layout(text)
    if len(stages) % pp:
        raise PipelineSplitError(
            "pipeline_model_parallel_layout's stages must be a multiple of PP "
            f"(PipelineParallelLayerLayout) (stages={len(stages)}, pp={pp})"
        )
    detected = len(stages) // pp
    if vpp is not None and vpp != detected:
        raise PipelineSplitError(
            "virtual_pipeline_model_parallel_size conflicts with "
            f"pipeline_model_parallel_layout (vpp={vpp}, layout's={detected})"
        )
    flat = "".join(stages)
    if not flat.startswith("E") or flat.count("E") != 1:
        raise PipelineSplitError(
            "pipeline_model_parallel_layout must start with the embedding E, once "
            "(validate_layer_layout)"
        )
    if not flat.endswith("L") or flat.count("L") != 1:
        raise PipelineSplitError(
            "pipeline_model_parallel_layout must end with the loss L, once (validate_layer_layout)"
        )
    if flat.count("m"):
        raise PipelineSplitError(
            "pipeline_model_parallel_layout has MTP layers (m); dse's models have none "
            "(mtp_num_layers unset: validate_layer_layout refuses them)"
        )
    if flat.count("t") != num_layers:
        raise PipelineSplitError(
            "pipeline_model_parallel_layout's decoder layers (t) must equal num_layers "
            f"(validate_layer_layout) (t={flat.count('t')}, num_layers={num_layers})"
        )
    out: list[list[list[int]]] = [[[] for _ in range(detected)] for _ in range(pp)]
    layer = 0
    for i, st in enumerate(stages):
        n = st.count("t")
        out[i % pp][i // pp] = list(range(layer, layer + n))
        layer += n
    return out


def _uneven_chunks(
    num_layers: int, pp: int, vpp: int | None, split: PipelineSplit
) -> list[list[list[int]]]:
    first = split.num_layers_in_first_pipeline_stage
    last = split.num_layers_in_last_pipeline_stage
    if split.accounts:
        raise PipelineSplitError(
            "num_layers_in_first/last_pipeline_stage cannot be set with "
            "account_for_embedding/loss_in_pipeline_split (TransformerConfig)"
        )
    v = vpp or 1
    middle, stages = num_layers, pp
    for name, n in (("first", first), ("last", last)):
        if n is None:
            continue
        if n <= 0:
            raise PipelineSplitError(f"num_layers_in_{name}_pipeline_stage must be > 0 ({n})")
        if n % v:
            raise PipelineSplitError(
                f"num_layers_in_{name}_pipeline_stage must be divisible by VPP "
                f"(TransformerConfig) (num_layers_in_{name}_pipeline_stage={n}, vpp={v})"
            )
        middle -= n
        stages -= 1
    if stages < 0:
        raise PipelineSplitError(
            "num_layers_in_first_pipeline_stage and num_layers_in_last_pipeline_stage "
            f"together need PP >= 2 (TransformerConfig) (pp={pp})"
        )
    if bool(middle) != bool(stages) or middle < 0:
        raise PipelineSplitError(
            "the layers left for the middle pipeline stages must match them "
            f"(TransformerConfig) (middle layers={middle}, middle stages={stages})"
        )
    if stages and middle % stages:
        raise PipelineSplitError(
            "the middle layers must be divisible by the middle pipeline stages "
            f"(TransformerConfig) (middle layers={middle}, middle stages={stages})"
        )
    per_mid = middle // stages if stages else 0
    if stages and per_mid % v:
        raise PipelineSplitError(
            "the layers of each middle pipeline rank must be divisible by VPP "
            f"(TransformerConfig) (layers per middle rank={per_mid}, vpp={v})"
        )
    sizes = [per_mid] * pp
    if first is not None:
        sizes[0] = first
    if last is not None:
        sizes[-1] = last
    out: list[list[list[int]]] = [[[] for _ in range(v)] for _ in range(pp)]
    layer = 0
    for chunk in range(v):
        for rank in range(pp):
            n = sizes[rank] // v
            out[rank][chunk] = list(range(layer, layer + n))
            layer += n
    return out


def _accounted_chunks(
    num_layers: int, pp: int, vpp: int | None, split: PipelineSplit
) -> list[list[list[int]]]:
    total = (
        num_layers
        + int(split.account_for_embedding_in_pipeline_split)
        + int(split.account_for_loss_in_pipeline_split)
    )
    if total % pp:
        raise PipelineSplitError(
            "num_layers plus the embedding / loss counted as layers must be divisible by PP "
            f"(TransformerConfig) (counted layers={total}, pp={pp})"
        )
    v = vpp or 1
    if (total // pp) % v:
        raise PipelineSplitError(
            "the counted layers of each pipeline rank must be divisible by VPP "
            f"(TransformerConfig) (per rank={total // pp}, vpp={v})"
        )
    per = total // pp // v
    out: list[list[list[int]]] = [[[] for _ in range(v)] for _ in range(pp)]
    slot = 0  # slots in order; slot 0 the embedding, the last the loss
    emb, loss = (
        split.account_for_embedding_in_pipeline_split,
        split.account_for_loss_in_pipeline_split,
    )
    for chunk in range(v):
        for rank in range(pp):
            ids = []
            for k in range(slot, slot + per):
                layer = k - int(emb)
                if (emb and k == 0) or (loss and k == total - 1):
                    continue
                ids.append(layer)
            out[rank][chunk] = ids
            slot += per
    return out


def pipeline_chunks(
    num_layers: int, pp: int, vpp: int | None = None, split: PipelineSplit | None = None
) -> list[list[list[int]]]:
    """The decoder layers (0-based) of every pipeline rank and virtual chunk,
    ``[rank][chunk] -> layer ids``, as Megatron-Core places them
    (megatron/core/transformer/transformer_layer.py ``get_transformer_layer_offset``,
    transformer_block.py ``get_num_layers_to_build``): the even split, uneven first / last
    stages, the embedding / loss counted as layers, or an explicit layout. Raises
    :class:`PipelineSplitError` naming the TransformerConfig check a split breaks."""
    split = split or PipelineSplit()
    if split.pipeline_model_parallel_layout:
        if split.uneven or split.accounts:
            raise PipelineSplitError(
                "pipeline_model_parallel_layout cannot be set with the other pipeline split "
                "fields (num_layers_in_first/last_pipeline_stage, "
                "account_for_embedding/loss_in_pipeline_split) (TransformerConfig)"
            )
        return _layout_chunks(num_layers, pp, vpp, split.pipeline_model_parallel_layout)
    # Megatron-Core checks the uneven and accounted splits whatever PP is
    # (TransformerConfig.__post_init__), so PP 1 is no exception for them
    if split.uneven:
        return _uneven_chunks(num_layers, pp, vpp, split)
    if split.accounts:
        return _accounted_chunks(num_layers, pp, vpp, split)
    if pp == 1:
        return [[list(range(num_layers))]]
    v = vpp or 1
    if num_layers % (pp * v):
        raise PipelineSplitError(
            "num_layers must be divisible by PP (x VPP) for the even split "
            f"(num_layers={num_layers}, pp={pp}, vpp={vpp})"
        )
    per = num_layers // (pp * v)
    return [
        [list(range((c * pp + r) * per, (c * pp + r + 1) * per)) for c in range(v)]
        for r in range(pp)
    ]


def pipeline_stage_layers(
    num_layers: int, pp: int, vpp: int | None = None, split: PipelineSplit | None = None
) -> list[list[int]]:
    """The layers of every pipeline rank over all its chunks (:func:`pipeline_chunks`).
    A split Megatron-Core refuses (which the rules refuse, naming the check) falls back to
    pieces of ceil(L/PP), the last taking the rest, so that an estimate of it still has a
    shape."""
    try:
        chunks = pipeline_chunks(num_layers, pp, vpp, split)
    except PipelineSplitError:
        n = -(-num_layers // pp)
        return [
            list(
                range(
                    min(r * n, num_layers),
                    num_layers if r == pp - 1 else min((r + 1) * n, num_layers),
                )
            )
            for r in range(pp)
        ]
    return [sorted(i for c in rank for i in c) for rank in chunks]


class _Batch(Protocol):
    """What the layout reads of a space's semantics (:class:`dse.space.searchspace.Semantics`)."""

    @property
    def global_batch_size(self) -> int: ...


class _World(Protocol):
    """What the layout reads of a space's resources (:class:`dse.space.searchspace.Resources`)."""

    @property
    def world_size(self) -> int: ...


def _int(params: Mapping[str, Any], name: str, fallback: int) -> int:
    value = knob_value(params, name)
    return fallback if value is None else int(value)


@dataclass(frozen=True)
class Layout:
    """The derived parallel layout of one configuration on ``world`` ranks.

    Attributes:
        world: ranks of the trial (GPUs, or CPU processes).
        tp, pp, cp, ep: tensor, pipeline, context and expert parallel sizes.
        vpp: virtual pipeline stages per PP rank (None: no interleaving).
        etp: expert tensor parallel size (TP when the knob is unset).
        dp: data-parallel size, 0 when TP*PP*CP does not divide the world.
        edp: expert data-parallel size, 0 when ETP*EP*PP does not divide the world.
        mbs: micro-batch size; gbs: global batch size.
        sequence_parallel: the knob as set (the rules reject it with TP 1).
        split: how the layers are placed on the pipeline stages (even unless a pipeline
            split field is set; :func:`pipeline_chunks`).
    """

    world: int
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int
    dp: int
    edp: int
    mbs: int
    gbs: int
    sequence_parallel: bool = False
    split: PipelineSplit = PipelineSplit()

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step and DP rank (0 when DP or MBS is 0)."""
        return self.gbs // (self.mbs * self.dp) if self.dp and self.mbs else 0

    @property
    def model_chunks(self) -> int:
        """Model chunks per pipeline rank: VPP with interleaving, else 1."""
        return self.vpp if self.vpp is not None and self.pp > 1 else 1

    @classmethod
    def resolve(
        cls,
        model: object,
        semantics: _Batch,
        resources: _World | int,
        params: Mapping[str, Any],
    ) -> Layout:
        """The layout of ``params`` (every knob the trial sets: explored and fixed).

        ``resources`` may be the world size itself. ``model`` is part of the signature so
        that model-dependent defaults have one home; none applies today.
        """
        del model  # no model-dependent default yet
        world = resources if isinstance(resources, int) else resources.world_size
        tp = _int(params, "tensor_model_parallel_size", 1)
        pp = _int(params, "pipeline_model_parallel_size", 1)
        cp = _int(params, "context_parallel_size", 1)
        ep = _int(params, "expert_model_parallel_size", 1)
        etp = _int(params, "expert_tensor_parallel_size", tp)
        vpp = knob_value(params, "virtual_pipeline_model_parallel_size")
        split = PipelineSplit.from_params(params)
        if vpp is None and split.pipeline_model_parallel_layout and pp > 1:
            # Megatron-Core takes VPP from the layout when it is unset (TransformerConfig)
            try:
                n = len(parse_pipeline_layout(split.pipeline_model_parallel_layout))
            except PipelineSplitError:
                n = pp
            vpp = n // pp if n % pp == 0 and n // pp > 1 else None
        grid, egrid = tp * pp * cp, etp * ep * pp
        return cls(
            world=world,
            tp=tp,
            pp=pp,
            vpp=None if vpp is None else int(vpp),
            cp=cp,
            ep=ep,
            etp=etp,
            dp=world // grid if grid > 0 and world % grid == 0 else 0,
            edp=world // egrid if egrid > 0 and world % egrid == 0 else 0,
            mbs=_int(params, "micro_batch_size", 1),
            gbs=semantics.global_batch_size,
            sequence_parallel=bool(knob_value(params, "sequence_parallel")),
            split=split,
        )

    def as_dict(self) -> dict[str, Any]:
        """The layout as reported in a trial's summary and in estimates."""
        return {
            "world_size": self.world,
            "tp": self.tp,
            "pp": self.pp,
            "vpp": self.vpp,
            "cp": self.cp,
            "ep": self.ep,
            "etp": self.etp,
            "dp": self.dp,
            "edp": self.edp,
            "micro_batch_size": self.mbs,
            "num_microbatches": self.num_microbatches,
        }
