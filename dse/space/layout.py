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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dse.space.knobs import knob_value

__all__ = ["Layout"]


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
