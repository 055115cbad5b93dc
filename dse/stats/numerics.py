"""The loss-parity guard's arithmetic: drift of a loss curve against the baseline's, the
tolerance derived from run-to-run noise, and the verdict stored with a trial.

Every trial of a study trains on the same seeded global batches from the same initial
weights (the built-in trainer: :mod:`dse.workloads.megatron._data` and ``_init``), so an
execution knob may move the per-step loss only by floating-point reduction order. The
reference is the study's baseline trial (the first complete trial of the space's baseline
configuration). For another complete trial:

* ``drift`` = the largest ``|loss_i - baseline_i| / |baseline_i|`` over the steps ``i`` both
  ran (trials may run different numbers of steps);
* ``tolerance`` = ``max(floor, noise_factor x noise)``, where ``noise`` is the largest drift
  measured between two runs of one configuration (baseline repeats, re-measures: runs that
  must agree) and ``floor`` is ``loss_parity.rel_tolerance`` (default by precision:
  :data:`DEFAULT_REL_TOLERANCE`);
* the trial is ``changed`` when ``drift > tolerance``, else ``ok``.

The verdict is ``metrics["numerics"]``: ``{"status", "drift", "tolerance",
"baseline_trial", "steps_compared"}`` (see :data:`dse.core.records.NumericsStatus`). Pure
functions: the controller (:mod:`dse.loop.loss_guard`) feeds them losses from storage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dse.core.records import NumericsStatus, StepMetrics, TrialRecord

__all__ = [
    "DEFAULT_REL_TOLERANCE",
    "Tolerance",
    "floor_of",
    "losses_of",
    "loss_drift",
    "tolerance_of",
    "verdict",
    "judge",
]

#: The tolerance floor by precision when the space gives none. bf16 (and fp16): the loss on
#: the same seeded batches differs across execution knobs (MBS, layout) by up to ~0.02 at a
#: loss of ~10.7 on an H200 (0.19 %: reduction order), and a 1 % drift must be flagged.
#: fp32: layouts agree to ~1e-6 (CPU and GPU).
DEFAULT_REL_TOLERANCE: dict[str, float] = {"bf16": 0.005, "fp16": 0.005, "fp32": 0.001}


@dataclass(frozen=True)
class Tolerance:
    """The tolerance of a study and where it comes from.

    Attributes:
        value: the relative tolerance, ``max(floor, noise_factor * noise)``.
        floor: the floor (``loss_parity.rel_tolerance`` or the precision's default).
        noise: the largest drift between two runs of one configuration (None: no repeat
            measured yet).
        pairs: how many such pairs were measured.
    """

    value: float
    floor: float
    noise: float | None
    pairs: int

    def as_dict(self) -> dict[str, Any]:
        return {"tolerance": self.value, "floor": self.floor, "noise": self.noise,
                "noise_pairs": self.pairs}  # fmt: skip


def floor_of(rel_tolerance: float | None, precision: str) -> float:
    """The tolerance floor: the space's, or the default of its precision."""
    if rel_tolerance is not None:
        return float(rel_tolerance)
    return DEFAULT_REL_TOLERANCE.get(precision, DEFAULT_REL_TOLERANCE["bf16"])


def losses_of(trial: TrialRecord) -> dict[int, float]:
    """A trial's finite per-step losses by step: its stored steps, else (a trial stored
    without steps) its summary's ``losses`` list (numbered from 0)."""
    steps: Iterable[StepMetrics] = trial.steps
    out = {s.step: float(s.loss) for s in steps if _finite(s.loss)}
    if out or trial.steps:
        return out
    raw = trial.metrics.get("losses")
    if isinstance(raw, list):
        return {i: float(x) for i, x in enumerate(raw) if _finite(x)}
    return {}


def loss_drift(base: Mapping[int, float], other: Mapping[int, float]) -> tuple[float | None, int]:
    """(largest relative difference over the steps both ran, how many steps that is); the
    drift is None when they share no step."""
    common = sorted(set(base) & set(other))
    if not common:
        return None, 0
    drift = 0.0
    for i in common:
        b = base[i]
        scale = abs(b) if abs(b) > 1e-12 else 1.0
        drift = max(drift, abs(other[i] - b) / scale)
    return drift, len(common)


def tolerance_of(floor: float, noise_factor: float, drifts: Sequence[float]) -> Tolerance:
    """The tolerance from a floor and the drifts measured between repeated runs."""
    noise = max(drifts) if drifts else None
    value = floor if noise is None else max(floor, noise_factor * noise)
    return Tolerance(value, floor, noise, len(drifts))


def verdict(
    status: NumericsStatus,
    *,
    drift: float | None = None,
    tolerance: float | None = None,
    baseline_trial: int | None = None,
    steps_compared: int = 0,
) -> dict[str, Any]:
    """The ``metrics["numerics"]`` record (rounded: drifts are relative, 1e-9 is noise)."""
    return {
        "status": status,
        "drift": None if drift is None else round(drift, 9),
        "tolerance": None if tolerance is None else round(tolerance, 9),
        "baseline_trial": baseline_trial,
        "steps_compared": steps_compared,
    }


def judge(
    losses: Mapping[int, float],
    reference: Mapping[int, float] | None,
    *,
    baseline_trial: int | None,
    tol: Tolerance,
) -> dict[str, Any]:
    """The verdict on a trial's losses against the reference (None: no reference yet)."""
    if reference is None or baseline_trial is None:
        return verdict("unchecked", tolerance=tol.value)
    drift, n = loss_drift(reference, losses)
    if drift is None:
        return verdict("unchecked", tolerance=tol.value, baseline_trial=baseline_trial)
    status: NumericsStatus = "changed" if drift > tol.value else "ok"
    return verdict(
        status, drift=drift, tolerance=tol.value, baseline_trial=baseline_trial, steps_compared=n
    )


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
