"""Calibration of the memory model's free coefficients from measured trials.

Each observation is a configuration with a measured peak (``ok``: the allocator's peak) or
an out-of-memory failure (``oom``: the memory it had reached, a lower bound, and the fact
that it did not fit). Around the current coefficients the prediction is linear:

``allocated = static + a * dynamic + fixed + c``   and
``total = allocated + f * a * dynamic + context``

with ``a`` the activation scale, ``c`` the static offset and ``f`` the fragmentation
fraction. ``(a, c)`` are fitted by a small robust least squares (numpy): Huber-weighted
relative residuals of the ok trials, a weak ridge prior towards the physics defaults, and
the OOM trials as hard one-sided bounds (``total >= capacity`` and
``allocated >= reached``), solved exactly (a two-unknown quadratic programme). The model is
re-linearised at the fitted scale (the moment of the peak can change with it) and
refitted. ``f`` is then moved, only as far as needed, into the interval the observations
allow: OOM trials ask ``total >= capacity``, trials that ran ask ``total <= capacity``.

The fit error is the median relative error on the observed points (an OOM trial counts its
shortfall below capacity). The recommended pre-screen margin is the initial one until three
trials have run, then ``clamp(2 * error * n / (n - 2), 0.03, initial)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dse.model.costmodel.memory import Coefficients, MemoryEstimate

__all__ = ["Calibrator", "Observation", "MIN_MARGIN", "EstimateFn"]

#: The smallest pre-screen margin ever recommended.
MIN_MARGIN = 0.03
#: Huber threshold on relative residuals.
HUBER = 0.05
#: Prior widths: activation scale (relative), static offset (GiB); and their weight
#: relative to one observation's relative residual.
PRIOR_SCALE_SD = 0.5
PRIOR_OFFSET_SD = 4.0
PRIOR_WEIGHT = 1.0e-4
#: Bounds of the fitted coefficients.
SCALE_BOUNDS = (0.3, 3.0)
OFFSET_BOUNDS = (-8.0, 32.0)
FRAG_BOUNDS = (0.0, 1.0)
#: How far past the capacity an OOM trial's predicted total is put (relative).
FRAG_SLACK = 1.0e-4
#: Re-linearisations of the model at the fitted scale.
OUTER_ITERATIONS = 3
#: Without a feasible point, pairs of constraint lines are tried up to this many constraints.
MAX_PAIR_CONSTRAINTS = 64

#: ``estimate(params, coefficients)``: the memory estimate of a configuration.
EstimateFn = Callable[[Mapping[str, Any], Coefficients], MemoryEstimate]


@dataclass(frozen=True)
class Observation:
    """One measured trial: the configuration, its measured peak, and OOM or not."""

    params: dict[str, Any]
    peak_gib: float
    oom: bool


@dataclass(frozen=True)
class _Lin:
    """An observation linearised: ``allocated = static + a * dynamic + fixed + c``."""

    obs: Observation
    static: float
    dynamic: float
    fixed: float
    context: float

    def allocated(self, scale: float, offset: float) -> float:
        return self.static + scale * self.dynamic + self.fixed + offset

    def total(self, scale: float, offset: float, frag: float) -> float:
        return self.allocated(scale, offset) + frag * scale * self.dynamic + self.context


def _linearise(obs: Observation, est: MemoryEstimate, scale: float) -> _Lin:
    """Split an estimate made at activation scale ``scale`` into the linear model's parts."""
    s = scale if scale > 0 else 1.0
    if est.peak_phase == "optimizer_step":
        dynamic = (est.activations_gib + est.attention_scores_gib + est.logits_gib) / s
        fixed = est.transient_gib
    else:
        dynamic = est.activation_dependent_gib / s
        fixed = 0.0
    return _Lin(obs, est.static_gib, dynamic, fixed, est.context_gib)


def _feasible_polygon(g: np.ndarray, h: np.ndarray) -> list[np.ndarray]:
    """Vertices of ``{x : g x >= h}`` within a large box (Sutherland-Hodgman clipping by one
    half-plane at a time); empty when no point satisfies every constraint."""
    big = 1.0e6
    poly = [np.array(v, dtype=float) for v in ((-big, -big), (big, -big), (big, big), (-big, big))]
    for gj, hj in zip(g, h, strict=True):
        if not poly:
            break
        out: list[np.ndarray] = []
        n = len(poly)
        for i in range(n):
            p, r = poly[i], poly[(i + 1) % n]
            sp, sr = float(gj @ p - hj), float(gj @ r - hj)
            if sp >= -1e-12:
                out.append(p)
            if (sp >= -1e-12) != (sr >= -1e-12) and sp != sr:
                out.append(p + (r - p) * (sp / (sp - sr)))
        poly = out
    return poly


class Calibrator:
    """Fits :class:`Coefficients` to observed trials; serializable with to_dict/from_dict.

    Args:
        estimate: ``estimate(params, coefficients)`` -> :class:`MemoryEstimate`.
        capacity_gib: GPU memory per device (None: OOM trials only bound from below).
        prior: the coefficients to start from (defaults: :class:`Coefficients`).
    """

    def __init__(
        self,
        estimate: EstimateFn,
        capacity_gib: float | None,
        prior: Coefficients | None = None,
    ) -> None:
        self._estimate = estimate
        self.capacity = capacity_gib
        self.prior = prior or Coefficients()
        self._coefficients = self.prior
        self.observations: list[Observation] = []
        self._error: float | None = None
        self._peak_error: float | None = None
        self._stale = False

    # --- observations --------------------------------------------------------------------------
    def observe(self, params: Mapping[str, Any], peak_gib: float, oom: bool) -> None:
        """Add a measured trial; the fit follows when the coefficients are next needed."""
        self._add(params, peak_gib, oom)
        self._stale = True

    @property
    def coefficients(self) -> Coefficients:
        """The coefficients fitted to every observation so far."""
        if self._stale:
            self.fit()
        return self._coefficients

    @property
    def error(self) -> float | None:
        """Median relative error of the fit on the observations (None before any); an OOM
        observation counts by how far its predicted total falls short of the capacity."""
        if self._stale:
            self.fit()
        return self._error

    @property
    def peak_error(self) -> float | None:
        """Median relative error of the fitted peak on the trials that ran (None before
        one ran): how far a prediction for a configuration that fits may be off."""
        if self._stale:
            self.fit()
        return self._peak_error

    def _add(self, params: Mapping[str, Any], peak_gib: float, oom: bool) -> None:
        if not math.isfinite(peak_gib) or peak_gib < 0:
            raise ValueError(f"peak memory must be a finite number >= 0 ({peak_gib=})")
        self._estimate(params, self.prior)  # fail now on a configuration it cannot estimate
        self.observations.append(Observation(dict(params), float(peak_gib), bool(oom)))

    @property
    def n_ok(self) -> int:
        return sum(not o.oom for o in self.observations)

    @property
    def n_oom(self) -> int:
        return sum(o.oom for o in self.observations)

    # --- fitting -------------------------------------------------------------------------------
    def _linearised(self, co: Coefficients) -> list[_Lin]:
        base = Coefficients(
            activation_scale=co.activation_scale,
            static_offset_gib=0.0,
            fragmentation=self.prior.fragmentation,
            context_gib=self.prior.context_gib,
            elastic_gib=self.prior.elastic_gib,
        )
        return [
            _linearise(o, self._estimate(o.params, base), co.activation_scale)
            for o in self.observations
        ]

    def fit(self) -> Coefficients:
        """Refit the coefficients to every observation; returns (and keeps) them."""
        self._stale = False
        if not self.observations:
            self._coefficients, self._error, self._peak_error = self.prior, None, None
            return self._coefficients
        co = self.prior
        for _ in range(OUTER_ITERATIONS):
            lins = self._linearised(co)
            scale, offset = self._fit_scale_offset(lins)
            frag = self._fit_fragmentation(lins, scale, offset)
            new = Coefficients(scale, offset, frag, self.prior.context_gib, self.prior.elastic_gib)
            done = abs(new.activation_scale - co.activation_scale) < 1e-4
            co = new
            if done:
                break
        self._coefficients = co
        lins = self._linearised(co)
        self._error = self._fit_error(lins, co)
        ok = [
            abs(x.allocated(co.activation_scale, co.static_offset_gib) - x.obs.peak_gib)
            / max(x.obs.peak_gib, 1e-3)
            for x in lins
            if not x.obs.oom
        ]
        self._peak_error = float(np.median(ok)) if ok else None
        return co

    def _system(
        self, lins: list[_Lin], weights: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(A, b, G, h): minimise ||A x - b||^2 subject to G x >= h, x = (scale, offset).

        Rows of A: the ok trials' relative residuals (Huber weights) and the prior; rows of
        G: each OOM trial's ``total >= capacity`` and ``allocated >= reached``, and the
        coefficient bounds.
        """
        p = self.prior
        frag = p.fragmentation
        rows: list[list[float]] = []
        rhs: list[float] = []
        g_rows: list[list[float]] = []
        h_vals: list[float] = []
        for i, x in enumerate(lins):
            o = x.obs
            if not o.oom:
                y = max(o.peak_gib, 1e-3)
                sw = math.sqrt(float(weights[i]))
                rows.append([sw * x.dynamic / y, sw / y])
                rhs.append(sw * (y - x.static - x.fixed) / y)
                continue
            cap = self.capacity
            if cap is not None:
                g_rows.append([(1.0 + frag) * x.dynamic / cap, 1.0 / cap])
                h_vals.append((cap * (1.0 + FRAG_SLACK) - x.static - x.fixed - x.context) / cap)
            y = max(o.peak_gib, 1e-3)
            g_rows.append([x.dynamic / y, 1.0 / y])
            h_vals.append((y - x.static - x.fixed) / y)
        pw = math.sqrt(PRIOR_WEIGHT)
        rows += [[pw / PRIOR_SCALE_SD, 0.0], [0.0, pw / PRIOR_OFFSET_SD]]
        rhs += [
            pw * p.activation_scale / PRIOR_SCALE_SD,
            pw * p.static_offset_gib / PRIOR_OFFSET_SD,
        ]
        g_rows += [[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]
        h_vals += [SCALE_BOUNDS[0], -SCALE_BOUNDS[1], OFFSET_BOUNDS[0], -OFFSET_BOUNDS[1]]
        return (
            np.asarray(rows, dtype=float),
            np.asarray(rhs, dtype=float),
            np.asarray(g_rows, dtype=float),
            np.asarray(h_vals, dtype=float),
        )

    @staticmethod
    def _qp(
        a_mat: np.ndarray,
        b_vec: np.ndarray,
        g: np.ndarray,
        h: np.ndarray,
        polygon: list[np.ndarray] | None = None,
    ) -> np.ndarray:
        """Least squares in two unknowns under linear inequalities ``g x >= h``, solved
        exactly.

        The optimum of a convex quadratic over a convex polygon is its unconstrained
        minimum, the minimum on one edge's line, or a vertex. The feasible polygon is cut
        out of a large box by each constraint in turn (linear in the number of
        constraints), so a study with hundreds of OOM trials fits in milliseconds. With no
        feasible point (inconsistent measurements), the least violating candidate wins;
        there the intersections of pairs of constraint lines are candidates too (for up to
        :data:`MAX_PAIR_CONSTRAINTS` constraints). ``polygon``: the feasible polygon of
        ``(g, h)`` when already known.
        """
        q = a_mat.T @ a_mat
        c = a_mat.T @ b_vec
        x0 = np.linalg.lstsq(a_mat, b_vec, rcond=None)[0]
        cands = [x0]
        if len(h) and abs(np.linalg.det(q)) > 1e-12:
            # the minimum on each line g_j x = h_j: x0 + lambda_j Q^-1 g_j (closed form)
            qg = np.linalg.solve(q, g.T).T
            den = (g * qg).sum(axis=1)
            ok = np.abs(den) > 1e-15
            lam = (h[ok] - g[ok] @ x0) / den[ok]
            cands += list(x0[None, :] + lam[:, None] * qg[ok])
        else:
            for j in range(len(h)):
                kkt = np.zeros((3, 3))
                kkt[:2, :2] = q
                kkt[:2, 2] = -g[j]
                kkt[2, :2] = g[j]
                try:
                    cands.append(np.linalg.solve(kkt, np.array([c[0], c[1], h[j]]))[:2])
                except np.linalg.LinAlgError:
                    continue
        if polygon is None:
            polygon = _feasible_polygon(g, h)
        cands += polygon
        if not polygon and len(h) <= MAX_PAIR_CONSTRAINTS:
            for j in range(len(h)):
                for k in range(j + 1, len(h)):
                    m = np.array([g[j], g[k]])
                    if abs(np.linalg.det(m)) < 1e-12:
                        continue
                    cands.append(np.linalg.solve(m, np.array([h[j], h[k]])))
        xs = np.asarray(cands, dtype=float)
        viol = np.clip(h[None, :] - xs @ g.T, 0.0, None).sum(axis=1)
        viol = np.where(viol > 1e-9, viol, 0.0)
        res = xs @ a_mat.T - b_vec[None, :]
        obj = (res * res).sum(axis=1)
        best = int(np.lexsort((obj, viol))[0])
        return np.asarray(xs[best], dtype=float)

    def _fit_scale_offset(self, lins: list[_Lin]) -> tuple[float, float]:
        p = self.prior
        theta = np.array([p.activation_scale, p.static_offset_gib])
        weights = np.ones(len(lins))
        polygon: list[np.ndarray] | None = None  # the constraints do not depend on weights
        for _ in range(30):
            a_mat, b_vec, g, h = self._system(lins, weights)
            if polygon is None:
                polygon = _feasible_polygon(g, h)
            sol = self._qp(a_mat, b_vec, g, h, polygon)
            new_w = np.ones(len(lins))
            for i, x in enumerate(lins):
                if not x.obs.oom:
                    y = max(x.obs.peak_gib, 1e-3)
                    r = (x.allocated(sol[0], sol[1]) - x.obs.peak_gib) / y
                    new_w[i] = 1.0 if abs(r) <= HUBER else HUBER / abs(r)
            done = np.allclose(sol, theta, rtol=0.0, atol=1e-10) and np.allclose(
                new_w, weights, atol=1e-9
            )
            theta, weights = sol, new_w
            if done:
                break
        return float(theta[0]), float(theta[1])

    def _fit_fragmentation(self, lins: list[_Lin], scale: float, offset: float) -> float:
        f0 = self.prior.fragmentation
        if self.capacity is None:
            return f0
        lo, hi = FRAG_BOUNDS
        for x in lins:
            dyn = scale * x.dynamic
            if dyn <= 0:
                continue
            need = (self.capacity - x.context - x.allocated(scale, offset)) / dyn
            if x.obs.oom:
                lo = max(lo, need + FRAG_SLACK * self.capacity / dyn)
            else:
                hi = min(hi, need)
        if lo <= hi:
            return float(min(max(f0, lo), hi))
        return float(np.clip((lo + hi) / 2.0, *FRAG_BOUNDS))

    def _fit_error(self, lins: list[_Lin], co: Coefficients) -> float:
        errs = []
        for x in lins:
            o = x.obs
            alloc = x.allocated(co.activation_scale, co.static_offset_gib)
            if not o.oom:
                errs.append(abs(alloc - o.peak_gib) / max(o.peak_gib, 1e-3))
            elif self.capacity is not None:
                total = x.total(co.activation_scale, co.static_offset_gib, co.fragmentation)
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
        out = {
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
        return json.loads(json.dumps(out, default=str))

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        estimate: EstimateFn,
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
