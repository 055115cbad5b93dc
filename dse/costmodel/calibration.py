"""Calibration of the memory model's free coefficients from measured trials.

Each observation is a configuration with a measured peak (``ok``: the allocator's peak) or
an out-of-memory failure (``oom``: the memory reached before failing, a lower bound, and
the fact that it did not fit). Around the default coefficients the prediction is linear:

``allocated = static + a * dynamic + fixed + c``   and
``total = allocated + f * a * dynamic + context``

with ``a`` the activation scale, ``c`` the static offset and ``f`` the fragmentation
fraction. ``(a, c)`` are fitted by a small robust least squares (numpy, Huber-weighted
relative residuals, a weak ridge prior towards the physics defaults) with the OOM trials
as one-sided constraints (active set: an OOM trial whose prediction would fit, or fall
under the memory it reached, adds a row). ``f`` is then moved, only as far as needed,
into the interval the observations allow: OOM trials ask ``total >= capacity``, trials
that ran ask ``total <= capacity``.

The fit error is the median relative error on the observed points (an OOM trial counts
its shortfall below capacity); the recommended pre-screen margin is
``clamp(2 * error * n / (n - 2), 0.03, initial)``, and the initial margin until three
trials have run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dse.costmodel.memory import Coefficients, MemoryEstimate

__all__ = ["Calibrator", "Observation", "MIN_MARGIN"]

#: The smallest pre-screen margin ever recommended.
MIN_MARGIN = 0.03
#: Huber threshold on relative residuals.
HUBER = 0.05
#: Prior widths: activation scale (relative), static offset (GiB).
PRIOR_SCALE_SD = 0.5
PRIOR_OFFSET_SD = 4.0
#: Weight of the prior rows relative to one observation.
PRIOR_WEIGHT = 0.05
#: Bounds of the fitted coefficients.
SCALE_BOUNDS = (0.3, 3.0)
OFFSET_BOUNDS = (-8.0, 32.0)
FRAG_BOUNDS = (0.0, 1.0)


@dataclass(frozen=True)
class Observation:
    """One measured trial, with the base estimate's decomposition at default coefficients.

    Attributes:
        params: the configuration (knob values).
        peak_gib: measured peak (ok) or memory reached before failing (oom).
        oom: True for an out-of-memory failure.
        static: weights + gradients + optimizer state (GiB).
        dynamic: activation-dependent memory at the peak (GiB, activation scale 1).
        fixed: non-scaled temporaries at the peak (optimizer step), GiB.
        context: memory outside the allocator (GiB).
    """

    params: dict[str, Any]
    peak_gib: float
    oom: bool
    static: float
    dynamic: float
    fixed: float
    context: float

    def allocated(self, scale: float, offset: float) -> float:
        return self.static + scale * self.dynamic + self.fixed + offset

    def total(self, scale: float, offset: float, frag: float) -> float:
        return self.allocated(scale, offset) + frag * scale * self.dynamic + self.context


def _decompose(est: MemoryEstimate) -> tuple[float, float, float, float]:
    """(static, dynamic, fixed, context) of an estimate made at default coefficients."""
    if est.peak_phase == "optimizer_step":
        dynamic = est.activations_gib + est.attention_scores_gib + est.logits_gib
        fixed = est.transient_gib
    else:
        dynamic = est.activation_dependent_gib
        fixed = 0.0
    return est.static_gib, dynamic, fixed, est.context_gib


class Calibrator:
    """Fits :class:`Coefficients` to observed trials; serializable with to_dict/from_dict.

    Args:
        estimate: the base estimate of a configuration at the *default* coefficients
            (anything with the right memory terms; the cost model passes its own).
        capacity_gib: GPU memory per device (None: OOM trials only bound from below).
        prior: the coefficients to start from (defaults: :class:`Coefficients`).
    """

    def __init__(
        self,
        estimate: Callable[[Mapping[str, Any]], MemoryEstimate],
        capacity_gib: float | None,
        prior: Coefficients | None = None,
    ) -> None:
        self._estimate = estimate
        self.capacity = capacity_gib
        self.prior = prior or Coefficients()
        self.coefficients = self.prior
        self.observations: list[Observation] = []
        self.error: float | None = None

    # --- observations --------------------------------------------------------------------------
    def observe(self, params: Mapping[str, Any], peak_gib: float, oom: bool) -> None:
        """Add a measured trial and refit."""
        self._add(params, peak_gib, oom)
        self.fit()

    def _add(self, params: Mapping[str, Any], peak_gib: float, oom: bool) -> None:
        if not math.isfinite(peak_gib) or peak_gib < 0:
            raise ValueError(f"peak memory must be a finite number >= 0 ({peak_gib=})")
        est = self._estimate(params)
        static, dynamic, fixed, context = _decompose(est)
        self.observations.append(
            Observation(dict(params), float(peak_gib), bool(oom), static, dynamic, fixed, context)
        )

    @property
    def n_ok(self) -> int:
        return sum(not o.oom for o in self.observations)

    @property
    def n_oom(self) -> int:
        return sum(o.oom for o in self.observations)

    # --- fitting -------------------------------------------------------------------------------
    def fit(self) -> Coefficients:
        """Refit the coefficients to every observation; returns (and keeps) them."""
        obs = self.observations
        if not obs:
            self.coefficients, self.error = self.prior, None
            return self.coefficients
        scale, offset = self._fit_scale_offset(obs)
        frag = self._fit_fragmentation(obs, scale, offset)
        self.coefficients = Coefficients(
            activation_scale=scale,
            static_offset_gib=offset,
            fragmentation=frag,
            context_gib=self.prior.context_gib,
        )
        self.error = self._error(obs, self.coefficients)
        return self.coefficients

    def _fit_scale_offset(self, obs: list[Observation]) -> tuple[float, float]:
        p = self.prior
        theta = np.array([p.activation_scale, p.static_offset_gib])
        frag = p.fragmentation
        active: set[tuple[int, str]] = set()
        weights = np.ones(len(obs))
        for _ in range(30):
            rows, rhs, w = [], [], []
            for i, o in enumerate(obs):
                if not o.oom:
                    y = max(o.peak_gib, 1e-3)
                    rows.append([o.dynamic / y, 1.0 / y])
                    rhs.append((y - o.static - o.fixed) / y)
                    w.append(weights[i])
            for i, kind in sorted(active):
                o = obs[i]
                if kind == "capacity" and self.capacity is not None:
                    # total = static + fixed + context + (1 + f) a D + c >= capacity
                    y = self.capacity
                    rows.append([(1.0 + frag) * o.dynamic / y, 1.0 / y])
                    rhs.append((y - o.static - o.fixed - o.context) / y)
                else:
                    # allocated >= the memory the failed trial had reached
                    y = max(o.peak_gib, 1e-3)
                    rows.append([o.dynamic / y, 1.0 / y])
                    rhs.append((y - o.static - o.fixed) / y)
                w.append(1.0)
            # weak ridge prior towards the defaults keeps few observations well posed
            rows += [[1.0 / PRIOR_SCALE_SD, 0.0], [0.0, 1.0 / PRIOR_OFFSET_SD]]
            rhs += [p.activation_scale / PRIOR_SCALE_SD, p.static_offset_gib / PRIOR_OFFSET_SD]
            w += [PRIOR_WEIGHT, PRIOR_WEIGHT]
            sw = np.sqrt(np.asarray(w, dtype=float))
            a_mat = np.asarray(rows, dtype=float) * sw[:, None]
            b_vec = np.asarray(rhs, dtype=float) * sw
            sol, *_ = np.linalg.lstsq(a_mat, b_vec, rcond=None)
            sol[0] = float(np.clip(sol[0], *SCALE_BOUNDS))
            sol[1] = float(np.clip(sol[1], *OFFSET_BOUNDS))
            # Huber weights on the ok residuals, active set on the OOM bounds
            new_w = np.ones(len(obs))
            new_active = set(active)
            for i, o in enumerate(obs):
                if not o.oom:
                    r = (o.allocated(sol[0], sol[1]) - o.peak_gib) / max(o.peak_gib, 1e-3)
                    new_w[i] = 1.0 if abs(r) <= HUBER else HUBER / abs(r)
                    continue
                cap = self.capacity
                if cap is not None and o.total(sol[0], sol[1], frag) < cap - 1e-9:
                    new_active.add((i, "capacity"))
                if o.allocated(sol[0], sol[1]) < o.peak_gib - 1e-9:
                    new_active.add((i, "reached"))
            converged = (
                new_active == active
                and np.allclose(new_w, weights, atol=1e-6)
                and np.allclose(sol, theta, atol=1e-9)
            )
            theta, weights, active = sol, new_w, new_active
            if converged:
                break
        return float(theta[0]), float(theta[1])

    def _fit_fragmentation(self, obs: list[Observation], scale: float, offset: float) -> float:
        f0 = self.prior.fragmentation
        if self.capacity is None:
            return f0
        lo, hi = FRAG_BOUNDS
        for o in obs:
            dyn = scale * o.dynamic
            if dyn <= 0:
                continue
            need = (self.capacity - o.context - o.allocated(scale, offset)) / dyn
            if o.oom:
                lo = max(lo, need)
            else:
                hi = min(hi, need)
        if lo <= hi:
            return float(min(max(f0, lo), hi))
        return float(np.clip((lo + hi) / 2.0, *FRAG_BOUNDS))

    def _error(self, obs: list[Observation], co: Coefficients) -> float:
        errs = []
        for o in obs:
            alloc = o.allocated(co.activation_scale, co.static_offset_gib)
            if not o.oom:
                errs.append(abs(alloc - o.peak_gib) / max(o.peak_gib, 1e-3))
            elif self.capacity is not None:
                total = o.total(co.activation_scale, co.static_offset_gib, co.fragmentation)
                errs.append(max(0.0, self.capacity - total) / self.capacity)
            else:
                errs.append(max(0.0, o.peak_gib - alloc) / max(o.peak_gib, 1e-3))
        return float(np.median(errs))

    # --- reporting -----------------------------------------------------------------------------
    def margin(self, initial: float) -> float:
        """Recommended pre-screen margin: shrinks with the fit error, never above ``initial``.

        Until three trials have run the initial margin is kept; after that
        ``clamp(2 * error * n / (n - 2), 0.03, initial)`` (the factor corrects the in-sample
        error for the two fitted coefficients).
        """
        n = len(self.observations)
        if n < 3 or self.error is None:
            return float(initial)
        err = self.error * n / (n - 2)
        return float(min(max(2.0 * err, MIN_MARGIN), initial))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state: coefficients, fit error and the observations."""
        return {
            "version": 1,
            "coefficients": self.coefficients.to_dict(),
            "prior": self.prior.to_dict(),
            "capacity_gib": self.capacity,
            "error": self.error,
            "n_ok": self.n_ok,
            "n_oom": self.n_oom,
            "observations": [
                {"params": o.params, "peak_gib": o.peak_gib, "oom": o.oom}
                for o in self.observations
            ],
        }

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        estimate: Callable[[Mapping[str, Any]], MemoryEstimate],
        capacity_gib: float | None = None,
    ) -> Calibrator:
        """Rebuild a calibrator from :meth:`to_dict` output (refits the observations)."""
        prior = Coefficients.from_dict(data.get("prior") or {})
        cap = capacity_gib if capacity_gib is not None else data.get("capacity_gib")
        cal = cls(estimate, cap, prior)
        for o in data.get("observations") or []:
            cal._add(o["params"], float(o["peak_gib"]), bool(o["oom"]))
        cal.fit()
        return cal
