"""The cost model the study loop uses: memory pre-screen, calibration, throughput estimate."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from dse.model.costmodel.basis import Trust, assess
from dse.model.costmodel.calibration import Calibrator
from dse.model.costmodel.memory import Coefficients, MemoryEstimate, estimate_memory
from dse.model.costmodel.throughput import estimate_throughput
from dse.space.searchspace import ModelSpec, Resources, Semantics

__all__ = ["CostModel", "HEADROOM_GIB", "headroom_from_oom_messages"]

#: Device memory a configuration cannot count on (GiB): the "fits" verdict is
#: ``predicted total <= capacity - headroom``. Derived from measured OOM boundaries: at every
#: out-of-memory failure of the committed H200 tables (examples/tables/, the 1- and 2-GPU
#: unfused tables) PyTorch's message reports the device with 1.88-3.09 GiB still free while
#: the allocation failed, so a prediction within the smallest of those of the capacity is not
#: "fits" (:func:`headroom_from_oom_messages`; a 4.5B table's rows predicted at 139.78 GiB
#: of 139.8 ran out of memory). A study's own OOM messages refine it (:meth:`CostModel.observe`).
HEADROOM_GIB = 1.88

_OOM_FREE = re.compile(
    r"total capacity of ([0-9.]+) GiB of which ([0-9.]+) (GiB|MiB|KiB|bytes) is free"
)
_UNITS = {"GiB": 1.0, "MiB": 1.0 / 1024, "KiB": 1.0 / (1024 * 1024), "bytes": 1.0 / (1 << 30)}


def headroom_from_oom_messages(messages: Iterable[str]) -> float | None:
    """The smallest free memory (GiB) PyTorch reported at an out-of-memory failure among
    ``messages`` ("GPU 0 has a total capacity of C GiB of which F GiB is free"); None when
    no message says."""
    seen: list[float] = []
    for msg in messages:
        for m in _OOM_FREE.finditer(msg or ""):
            seen.append(float(m.group(2)) * _UNITS[m.group(3)])
    return min(seen) if seen else None


class CostModel:
    """Predicts a configuration's per-GPU memory and speed before a GPU is spent.

    The study loop calls :meth:`fits` before launching a configuration (rejecting it only
    when the prediction exceeds ``capacity * (1 + margin)``), :meth:`observe` after each
    measured trial (refitting the free coefficients), :meth:`margin` for the margin to use
    next and :meth:`calibration` for the state to store with the study.

    Args:
        model: the architecture.
        semantics: the fixed training semantics (sequence length, global batch, precision).
        resources: GPUs per trial; ``gpu_memory_gib`` is the capacity (None: all fits).
        coefficients: starting coefficients (defaults: physics-based).
    """

    def __init__(
        self,
        model: ModelSpec,
        semantics: Semantics,
        resources: Resources,
        coefficients: Coefficients | None = None,
    ) -> None:
        self.model = model
        self.semantics = semantics
        self.resources = resources
        self._prior = coefficients or Coefficients()
        self._calibrator = Calibrator(self._estimate, resources.gpu_memory_gib, self._prior)
        self._floor: float | None = None
        self._floor_key: tuple[int, Coefficients] | None = None
        self.headroom_gib = HEADROOM_GIB

    # --- memory ----------------------------------------------------------------------------
    @property
    def capacity_gib(self) -> float | None:
        """GPU memory per device from the resources (None when not declared)."""
        return self.resources.gpu_memory_gib

    @property
    def usable_gib(self) -> float | None:
        """What a configuration may count on: the capacity less :attr:`headroom_gib` (the
        same figure for the pre-screen, the sim and ``dse estimate``)."""
        cap = self.capacity_gib
        return None if cap is None else max(0.0, cap - self.headroom_gib)

    @property
    def coefficients(self) -> Coefficients:
        """The current (calibrated) coefficients."""
        return self._calibrator.coefficients

    def _estimate(self, params: Mapping[str, Any], coefficients: Coefficients) -> MemoryEstimate:
        return estimate_memory(self.model, self.semantics, self.resources, params, coefficients)

    def predict_memory(self, params: Mapping[str, Any]) -> MemoryEstimate:
        """Per-GPU peak memory of ``params`` with the calibrated coefficients."""
        return estimate_memory(
            self.model, self.semantics, self.resources, params, self.coefficients
        )

    def fits(self, params: Mapping[str, Any], margin: float) -> tuple[bool, float]:
        """(fits, predicted total GiB).

        Rejected if predicted > usable capacity (:attr:`usable_gib`) * (1 + margin), or, once
        an OOM was measured, if the prediction is at least that of a configuration measured
        to run out of memory: the model's order of configurations by memory is trusted even
        where its absolute level is not calibrated yet.
        """
        pred = self.predict_memory(params).total_gib
        cap = self.usable_gib
        if cap is None:
            return True, pred
        oom_floor = self._oom_floor()
        if oom_floor is not None and pred >= oom_floor:
            return False, pred
        return pred <= cap * (1.0 + margin), pred

    def _oom_floor(self) -> float | None:
        """The smallest current prediction among configurations measured to OOM."""
        key = (len(self._calibrator.observations), self.coefficients)
        if self._floor_key != key:
            ooms = [o.params for o in self._calibrator.observations if o.oom]
            self._floor = min((self.predict_memory(p).total_gib for p in ooms), default=None)
            self._floor_key = key
        return self._floor

    # --- calibration -------------------------------------------------------------------------
    def observe(
        self, params: Mapping[str, Any], peak_mem_gib: float, oom: bool, message: str = ""
    ) -> None:
        """Record a measured trial (peak of an ok run, or memory reached by an OOM) and refit;
        an OOM's message lowers the headroom to the free memory it reports, if smaller."""
        self._calibrator.observe(params, float(peak_mem_gib), bool(oom))
        free = headroom_from_oom_messages([message]) if oom else None
        if free is not None:
            self.headroom_gib = min(self.headroom_gib, free)

    def calibration(self) -> dict[str, Any]:
        """JSON-ready calibration state (coefficients, fit error, margin, observations)."""
        out = self._calibrator.to_dict()
        out["recommended_margin"] = self._calibrator.margin(1.0)
        return out

    def load_calibration(self, data: Mapping[str, Any]) -> None:
        """Restore a state returned by :meth:`calibration` (its observations are refitted)."""
        self._calibrator = Calibrator.from_dict(data, self._estimate, self.capacity_gib)

    def margin(self, initial: float) -> float:
        """The pre-screen margin to use now: ``initial`` until calibrated, then smaller."""
        return self._calibrator.margin(initial)

    @property
    def calibration_error(self) -> float | None:
        """Median relative error of the fit on the observed trials (None before any)."""
        return self._calibrator.error

    @property
    def peak_error(self) -> float | None:
        """Median relative error of the fitted peak on the trials that ran (None before)."""
        return self._calibrator.peak_error

    # --- trust -------------------------------------------------------------------------------
    def trust(
        self, params: Mapping[str, Any], measured: Iterable[Mapping[str, Any]] = ()
    ) -> Trust:
        """How far this model's estimate of ``params`` is to be trusted: its label
        (calibrated / interpolated / extrapolated), error bands and basis
        (:mod:`dse.model.costmodel.basis`); ``measured``: the study's measured configurations."""
        return assess(self.model, self.semantics, self.resources, params, measured)

    # --- speed -------------------------------------------------------------------------------
    def estimate_throughput(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``{"tflops_per_gpu", "step_time_s", "source": "estimate", ...}`` of ``params``."""
        return estimate_throughput(self.model, self.semantics, self.resources, params)
