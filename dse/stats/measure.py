"""How long a trial measures, and what its step time is: warm-up detection, the steady-state
estimate with its confidence interval, the stopping rule and the dominance test.

Pure Python (no torch, no numpy): the trainer, the launcher parsers, the simulator and the
controller all import it.

* **Spikes**: a step farther than :data:`SPIKE_K` normalised MADs (``1.4826 * MAD``) from
  the median of the reference steps is a spike (the Hampel identifier; Hampel 1974, Davies &
  Gather 1993, Pearson 2002): a late kernel compilation, a host stall, a garbage collection.
  The reference of warm-up detection is the series' second half; that of the recorded count
  is the measured window.
* **Warm-up** ends where the Marginal Standard Error Rule puts it (MSER, White 1997): the
  truncation point ``d`` in the first half of the series that minimises
  ``sum((y[d:] - mean(y[d:]))**2) / (n - d)**2``, less the steps just before it that lie
  within :data:`WARMUP_BAND` standard deviations of the steady mean (MSER alone cuts steady
  steps that happen to be high). ``y`` is the series with every spike after its leading run
  of spikes replaced by the reference median: a slow step at the start is warm-up, one in
  the middle is not (MSER alone would throw away every step before it, or call the series
  unsettled when it lies just before the half). A truncation at the edge of the first half
  means the series is still settling (warm-up not over).
* **Interval** of the steady-state location at ``confidence``: the :data:`TRIM`-trimmed mean
  of the post-warm-up steps (10%: it equals the mean on symmetric noise, and up to one step
  in ten may be a spike of any size without moving it by more than the noise does; light
  trimming did best on historical measurement series in Stigler 1977) with the
  Tukey-McLaughlin standard error in Yuen's form (squared: ``(n - 1) s_w**2 / (h (h - 1))``,
  ``s_w`` the standard deviation of the winsorized steps, ``g = floor(TRIM * n)`` cut from
  each end, ``h = n - 2g`` kept; Student's t on ``h - 1`` degrees of freedom: Tukey &
  McLaughlin 1963, Yuen 1974, Wilcox, *Introduction to Robust Estimation and Hypothesis
  Testing*, sec. 4.4).
  Dependence is handled on the winsorized steps, whose mean the trimmed mean follows
  asymptotically (its influence function is the winsorized deviation over ``1 - 2 * TRIM``,
  so the long-run variance of the winsorized steps is the one that counts):
  the effective sample size of their lag-1 autocorrelation (AR(1)), and when the steps are
  clearly autocorrelated (lag-1 autocorrelation above ``2/sqrt(n)``, with at least
  :data:`BATCH_MEANS_MIN` steps) the wider of that and the batch-means interval (about
  ``sqrt(n)`` batches of ``sqrt(n)`` steps). With ``trim=0`` this is the interval of the
  mean (:func:`mean_interval`).
* **Stop** (``mode: adaptive``): from ``min_steps`` on, once warm-up is over and the relative
  half-width of the interval is at most ``rel_halfwidth`` (``converged``), or at
  ``max_steps``. ``mode: fixed`` runs ``semantics.steps`` and times the steps after
  ``semantics.warmup_steps`` (the value is their median, as before; the interval is that of
  their trimmed mean, widened to contain the median).
* **Dominance** (``prune: true``): a trial whose interval of the objective lies entirely
  beyond the study's best by ``prune_margin`` (TFLOP/s: its upper bound below the best's
  lower bound times ``1 - margin``) stops as ``dominated`` and is recorded ``pruned``.

A trial records (``dse.core.records`` names, the trial summary): ``measurement`` (mode, warm-up
steps, measured steps, stop reason, the trim of the location and the spikes counted in the
measured window), ``step_time_ci_s`` and ``tflops_per_gpu_ci``.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dse.core.records import (
    Direction,
    MeasurementMode,
    Metric,
    StopReason,
    TrialSpec,
    finite,
)

__all__ = [
    "MIN_MEASURED",
    "BATCH_MEANS_MIN",
    "SPIKE_K",
    "TRIM",
    "PRUNABLE_METRICS",
    "MeasurementSpec",
    "PruneTarget",
    "Interval",
    "Measured",
    "StepSeries",
    "t_quantile",
    "mser_truncation",
    "mean_interval",
    "location_interval",
    "spikes",
    "prune_target",
    "metric_interval",
    "series_for",
]

#: Post-warm-up steps before an interval counts (a stop or a dominance decision).
MIN_MEASURED = 4
#: Standard deviations from the steady mean within which an early step is not warm-up.
WARMUP_BAND = 3.0
#: Post-warm-up steps from which autocorrelated series use batch means.
BATCH_MEANS_MIN = 12
#: The fraction trimmed from each end of the measured steps for their location: the 10%
#: trimmed mean has 94% of the mean's asymptotic efficiency on normal noise (20%: 87%), and
#: spikes in up to a tenth of the steps leave it where the steady steps put it. 20% copes
#: with more spikes but, stopped sequentially, covered the steady-state location in under
#: 90% of seeded runs at 2% noise (docs/BENCHMARKS.md section 17).
TRIM = 0.1
#: Normalised MADs from the median beyond which a step is a spike (the Hampel identifier).
#: 5 rather than the textbook 3: a step only counts when it is clearly not steady noise, so
#: that a slow warm-up decaying into the noise stays warm-up.
SPIKE_K = 5.0
#: The MAD of normal noise times this is its standard deviation.
_MAD_SD = 1.4826
#: Objectives whose interval follows from the step time's (the dominance test applies).
PRUNABLE_METRICS: tuple[Metric, ...] = ("tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s")


# --- the space file's section ------------------------------------------------------------------


class MeasurementSpec(BaseModel):
    """The space file's ``measurement:`` section.

    ``mode``, ``min_steps``, ``max_steps``, ``rel_halfwidth`` and ``confidence`` say what a
    trial's figure is (its window and its precision): they belong to the study's identity,
    like ``semantics.steps``, so that every trial of a study is measured the same way and a
    stored answer is reused only for the same question. ``prune`` and ``prune_margin`` only
    decide whether a trial that cannot win is cut short; the figures of the trials that finish
    mean the same either way, so they are run settings (``dse resume`` may change them).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mode: MeasurementMode = Field(
        "fixed",
        description="fixed: time semantics.steps after semantics.warmup_steps; adaptive: "
        "detect warm-up and stop once the step time is known to rel_halfwidth.",
    )
    min_steps: int = Field(
        10,
        ge=MIN_MEASURED + 1,
        le=1_000_000,
        description="Adaptive (and pruning): steps before the first stop decision.",
    )
    max_steps: int = Field(
        100, ge=MIN_MEASURED + 1, le=1_000_000, description="Adaptive: the most steps to run."
    )
    rel_halfwidth: float = Field(
        0.01,
        gt=0,
        le=0.5,
        description="Adaptive: stop when the interval's half-width is at most this fraction "
        "of the mean step time.",
    )
    confidence: float = Field(
        0.95, ge=0.5, lt=1, description="Confidence level of the step-time interval."
    )
    clock: Literal["wall", "cpu"] = Field(
        "wall",
        description="wall: a step's elapsed time; cpu (CPU trials only): the CPU time the "
        "trial's processes spent in the step, which leaves out the time spent waiting for a "
        "core on a shared machine (the step's wall time is kept beside it).",
    )
    prune: bool = Field(
        False,
        description="Stop a trial early when its interval lies clearly beyond the study's "
        "best (recorded 'pruned' with its figures; never the best).",
    )
    prune_margin: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Relative margin beyond the best's interval bound for a trial to count "
        "as dominated.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> MeasurementSpec:
        if self.min_steps > self.max_steps:
            raise ValueError(
                f"min_steps ({self.min_steps}) must not exceed max_steps ({self.max_steps})"
            )
        return self

    #: The fields that are run settings (see the class docstring).
    RUN_FIELDS: ClassVar[tuple[str, ...]] = ("prune", "prune_margin")

    def steps(self, semantics_steps: int) -> int:
        """The most steps a trial runs (adaptive: ``max_steps``; fixed: ``semantics.steps``)."""
        return self.max_steps if self.mode == "adaptive" else semantics_steps

    def identity(self) -> dict[str, Any]:
        """The fields that belong to the study's identity (``clock`` only when not the
        default, so that studies stored before it keep their hash)."""
        out = self.model_dump(mode="json", exclude=set(self.RUN_FIELDS))
        if out["clock"] == "wall":
            del out["clock"]
        return out


# --- statistics --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def t_quantile(confidence: float, df: int) -> float:
    """The two-sided Student-t quantile: ``q`` with ``P(|T| <= q) = confidence``, ``df``
    degrees of freedom.

    Exact for integer ``df`` (the finite trigonometric series of Abramowitz & Stegun 26.7.3
    and 26.7.4, solved by bisection); above 10,000 degrees of freedom the normal quantile
    with its first correction term.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df > 10_000:  # the normal quantile with its first Cornish-Fisher correction
        z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
        return z + (z**3 + z) / (4 * df)

    def inside(theta: float) -> float:  # P(|T| < sqrt(df) tan(theta))
        c, s = math.cos(theta), math.sin(theta)
        c2 = c * c
        if df % 2 == 1:
            total, term = 0.0, 1.0
            for k in range(1, (df - 1) // 2 + 1):
                total += term
                term *= c2 * (2 * k) / (2 * k + 1)
            extra = s * c * total if df > 1 else 0.0
            return 2.0 / math.pi * (theta + extra)
        total, term = 0.0, 1.0
        for k in range(1, df // 2 + 1):
            total += term
            term *= c2 * (2 * k - 1) / (2 * k)
        return s * total

    lo, hi = 0.0, math.pi / 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if inside(mid) < confidence:
            lo = mid
        else:
            hi = mid
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def spikes(
    x: Sequence[float], reference: Sequence[float] | None = None, k: float = SPIKE_K
) -> list[int]:
    """The indices of the spikes of ``x``: steps farther than ``k`` normalised MADs
    (``1.4826 * MAD``, the standard deviation of normal noise) from the median of
    ``reference`` (default: ``x`` itself). The Hampel identifier (Hampel 1974; Davies &
    Gather 1993): its median and MAD are themselves unmoved by up to half the reference
    being spikes. A reference of identical steps (MAD 0) makes every other value a spike."""
    ref = list(x if reference is None else reference)
    if not ref:
        return []
    med = statistics.median(ref)
    scale = k * _MAD_SD * statistics.median(abs(v - med) for v in ref)
    return [i for i, v in enumerate(x) if abs(v - med) > scale]


def _despiked(x: Sequence[float]) -> list[float]:
    """``x`` with its spikes after the leading run replaced by the median of its second half
    (the reference of :func:`spikes`): what MSER looks at."""
    n = len(x)
    ref = x[n // 2 :]
    flagged = spikes(x, ref)
    if not flagged:
        return list(x)
    lead = 0
    while lead < len(flagged) and flagged[lead] == lead:
        lead += 1
    med = statistics.median(ref)
    y = list(x)
    for i in flagged[lead:]:
        y[i] = med
    return y


def mser_truncation(x: Sequence[float], band: float = WARMUP_BAND) -> tuple[int, bool]:
    """MSER warm-up truncation of a series: ``(d, settled)``.

    MSER's ``d*`` minimises ``sum((y[d:] - mean)**2) / (n - d)**2`` over ``0 <= d <= n // 2``
    (the smallest on ties), ``y`` the series with its spikes after the leading run replaced
    by the median of its second half (:func:`spikes`, reference ``x[n // 2:]``): a slow step
    in the middle of the steady state is not warm-up, and MSER would otherwise drop every
    step before it. On steady noise MSER alone often cuts a few steady steps too (a high
    step early on looks like warm-up); so ``d`` walks back from ``d*`` over the steps just
    before it that lie within ``band`` standard deviations of the steady mean (the deviation
    from successive differences, which a trend does not inflate): only steps clearly slower
    (or faster) than the steady state count as warm-up. ``settled`` is False when ``d``
    stays at ``n // 2`` (still settling: MSER's own warning that the run is too short) or
    the series has fewer than 3 points.
    """
    n = len(x)
    if n < 3:
        return 0, False
    y = _despiked(x)
    limit = n // 2
    ref = y[-1]
    s = q = 0.0
    scores = [0.0] * (limit + 1)
    for i in range(n - 1, -1, -1):  # suffix sums, from the end
        v = y[i] - ref
        s += v
        q += v * v
        if i <= limit:
            m = n - i
            scores[i] = max(0.0, q - s * s / m) / (m * m)
    best = min(scores)
    d = scores.index(best)
    tail = y[d:]
    if d and len(tail) >= 2:
        # the steady noise from successive differences (von Neumann), which a trend left in
        # the tail does not inflate
        mean = math.fsum(tail) / len(tail)
        mssd = math.fsum((b - a) ** 2 for a, b in itertools.pairwise(tail)) / (len(tail) - 1)
        spread = band * math.sqrt(mssd / 2)
        while d and abs(y[d - 1] - mean) <= spread:
            d -= 1
    return d, d < limit


@dataclass(frozen=True)
class Interval:
    """The interval of a series' location: ``(lo, hi)`` around ``mean``, its ``trim``-trimmed
    mean (the mean when ``trim`` is 0), over ``n`` points."""

    mean: float
    lo: float
    hi: float
    n: int
    method: Literal["t", "batch_means"]
    trim: float = 0.0

    @property
    def halfwidth(self) -> float:
        return (self.hi - self.lo) / 2

    @property
    def rel_halfwidth(self) -> float:
        """Half-width over the location (inf for a location of 0)."""
        return self.halfwidth / abs(self.mean) if self.mean else math.inf


def _lag1(x: Sequence[float], mean: float) -> float:
    den = math.fsum((v - mean) ** 2 for v in x)
    if den <= 0:
        return 0.0
    return math.fsum((x[i] - mean) * (x[i + 1] - mean) for i in range(len(x) - 1)) / den


def location_interval(
    x: Sequence[float], confidence: float = 0.95, trim: float = TRIM
) -> Interval | None:
    """The ``confidence`` interval of the ``trim``-trimmed mean of ``x`` (None with fewer
    than 2 points).

    ``g = floor(trim * n)`` points are cut from each end (``h = n - 2g`` kept); the squared
    standard error is Yuen's (1974) form of Tukey-McLaughlin's, ``(n - 1) s_w**2 / (h (h -
    1))`` with ``s_w`` the standard deviation of the winsorized series (each of the ``g``
    lowest and highest points set to the nearest kept one), on ``h - 1`` degrees of freedom
    (SciPy's ``ttest_ind(..., trim=)`` uses the same). For dependent steps it is multiplied
    by ``n / n_eff``, ``n_eff`` the effective sample size of the winsorized series as an
    AR(1):
    ``n (1 - r) / (1 + r)``, ``r`` its lag-1 autocorrelation (bias-corrected,
    ``(n r + 1) / (n - 3)``, clipped to ``[0, 0.9]``; independent steps keep ``n``), the
    degrees of freedom scaled alike. With at least :data:`BATCH_MEANS_MIN` points whose lag-1
    autocorrelation exceeds ``2 / sqrt(n)`` (correlated at about the 5% level), the wider of
    that and the batch-means interval of the winsorized series over ``h / n`` (``b = n // m``
    batches of ``m = floor(sqrt(n))`` steps, the latest ``b * m`` points).
    """
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    n = len(x)
    if n < 2:
        return None
    g = math.floor(trim * n + 1e-9)
    h = n - 2 * g
    if h < 2:  # too few points to trim: the mean's interval
        g, h = 0, n
    xs = sorted(x)
    loc = math.fsum(xs[g : n - g]) / h
    w = [min(max(v, xs[g]), xs[n - g - 1]) for v in x] if g else list(x)
    wmean = math.fsum(w) / n
    sd = statistics.stdev(w, wmean)
    kept = h / n
    r1 = _lag1(w, wmean)
    r = (n * r1 + 1) / (n - 3) if n > 3 else r1
    r = min(max(r, 0.0), 0.9)
    n_eff = max(2.0, n * (1 - r) / (1 + r))
    df = max(1, round(n_eff * kept) - 1)
    # Yuen's squared standard error (n - 1) s_w^2 / (h (h - 1)), times n / n_eff
    se = sd * math.sqrt((n - 1) / (h * (h - 1)) * n / n_eff)
    hw = t_quantile(confidence, df) * se
    method: Literal["t", "batch_means"] = "t"
    if n >= BATCH_MEANS_MIN and r1 > 2 / math.sqrt(n):
        m = max(2, math.isqrt(n))
        b = n // m
        tail = w[n - b * m :]
        means = [math.fsum(tail[i * m : (i + 1) * m]) / m for i in range(b)]
        hw_b = t_quantile(confidence, b - 1) * statistics.stdev(means) / (kept * math.sqrt(b))
        if hw_b > hw:
            hw, method = hw_b, "batch_means"
    return Interval(loc, loc - hw, loc + hw, n, method, trim if g else 0.0)


def mean_interval(x: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """The ``confidence`` interval of the mean of ``x``: :func:`location_interval` with no
    trimming (Student's t with the AR(1) effective sample size, batch means when clearly
    autocorrelated)."""
    return location_interval(x, confidence, trim=0.0)


# --- the dominance test ------------------------------------------------------------------------


class PruneTarget(BaseModel):
    """The study's best when a trial starts (``TrialSpec.prune``): a trial whose objective
    interval lies beyond ``threshold`` stops as dominated."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    metric: Metric
    direction: Direction
    best: float = Field(description="The best trial's value.")
    bound: float = Field(
        description="The best's interval bound on the losing side (maximize: its lower "
        "bound; minimize: its upper bound); its value when it has no interval."
    )
    margin: float = Field(0.05, ge=0, lt=1)
    best_trial: int | None = Field(None, description="The best trial's number.")

    @property
    def threshold(self) -> float:
        """The value a trial's interval must lie entirely beyond to be dominated."""
        if self.direction == "maximize":
            return self.bound * (1 - self.margin)
        return self.bound * (1 + self.margin)

    def dominates(self, lo: float, hi: float) -> bool:
        """Whether an objective interval ``[lo, hi]`` lies clearly beyond the best."""
        if self.direction == "maximize":
            return hi < self.threshold
        return lo > self.threshold


def metric_interval(metric: str, metrics: Mapping[str, Any]) -> tuple[float, float] | None:
    """A trial's interval of ``metric`` from its recorded figures (``step_time_ci_s``,
    ``tflops_per_gpu_ci``; tokens/s scale like TFLOP/s), or None when it has none."""

    def pair(key: str) -> tuple[float, float] | None:
        v = metrics.get(key)
        if isinstance(v, list | tuple) and len(v) == 2:
            lo, hi = finite(v[0]), finite(v[1])
            if lo is not None and hi is not None and 0 < lo <= hi:
                return lo, hi
        return None

    if metric == "step_time_s":
        return pair("step_time_ci_s")
    if metric == "tflops_per_gpu":
        return pair("tflops_per_gpu_ci")
    if metric == "tokens_per_s_per_gpu":
        t, ci, v = (
            finite(metrics.get("step_time_s")),
            pair("step_time_ci_s"),
            finite(metrics.get(metric)),
        )
        if t is None or ci is None or v is None:
            return None
        return v * t / ci[1], v * t / ci[0]
    return None


def prune_target(
    metric: str,
    direction: Direction,
    *,
    best_value: float | None,
    best_metrics: Mapping[str, Any],
    margin: float,
    best_trial: int | None = None,
) -> PruneTarget | None:
    """The target a trial is pruned against, from the study's best trial (None: nothing to
    prune against, or an objective the test does not apply to)."""
    value = finite(best_value)
    if value is None or value <= 0 or metric not in PRUNABLE_METRICS:
        return None
    ci = metric_interval(metric, best_metrics)
    if ci is None:
        bound = value
    else:
        bound = min(ci[0], value) if direction == "maximize" else max(ci[1], value)
    return PruneTarget(
        metric=metric,  # type: ignore[arg-type]
        direction=direction,
        best=value,
        bound=bound,
        margin=margin,
        best_trial=best_trial,
    )


# --- a trial's series --------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """What a trial records of its step-time series."""

    mode: MeasurementMode
    warmup_steps: int
    measured_steps: int
    stop_reason: StopReason
    step_time_s: float
    step_time_ci_s: tuple[float, float] | None
    tflops_per_gpu: float | None
    tflops_per_gpu_ci: tuple[float, float] | None
    confidence: float
    method: str | None
    dominated_by: dict[str, Any] | None = None
    trim: float = 0.0
    spikes: int = 0

    def fields(self) -> dict[str, Any]:
        """The trial summary's fields (``measurement``, ``step_time_s``, ``tflops_per_gpu``
        and, when known, ``step_time_ci_s`` and ``tflops_per_gpu_ci``)."""
        m: dict[str, Any] = {
            "mode": self.mode,
            "warmup_steps": self.warmup_steps,
            "measured_steps": self.measured_steps,
            "stop_reason": self.stop_reason,
            "confidence": self.confidence,
            "interval": self.method,
            "trim": self.trim,
            "spikes": self.spikes,
        }
        if self.dominated_by is not None:
            m["dominated_by"] = self.dominated_by
        out: dict[str, Any] = {"measurement": m, "step_time_s": self.step_time_s}
        if self.tflops_per_gpu is not None:
            out["tflops_per_gpu"] = self.tflops_per_gpu
        if self.step_time_ci_s is not None:
            out["step_time_ci_s"] = list(self.step_time_ci_s)
        if self.tflops_per_gpu_ci is not None:
            out["tflops_per_gpu_ci"] = list(self.tflops_per_gpu_ci)
        return out


class StepSeries:
    """The step times of one trial as they come, and when to stop.

    Feed each step with :meth:`add`; it returns the stop reason once the trial should stop
    (and keeps returning it). ``tflops_per_gpu`` of each step (optional) gives the TFLOP/s
    figures: a step's TFLOP/s times its step time is its model FLOPs per GPU, so the
    TFLOP/s interval follows from the step time's.

    Args:
        spec: the space's measurement section.
        steps, warmup_steps: ``semantics.steps`` and ``semantics.warmup_steps`` (fixed mode).
        prune: the study's best to stop against (None: no dominance test).
        tokens_per_step_per_gpu: tokens of a step per GPU (a ``tokens_per_s_per_gpu``
            objective's dominance test).
        trim: the trimmed fraction of the location (:data:`TRIM`; another value only to
            study the rule offline, e.g. ``bench/adaptive_window.py --from-json``).
    """

    def __init__(
        self,
        spec: MeasurementSpec,
        *,
        steps: int,
        warmup_steps: int,
        prune: PruneTarget | None = None,
        tokens_per_step_per_gpu: float | None = None,
        trim: float = TRIM,
    ) -> None:
        if not 0.0 <= trim < 0.5:
            raise ValueError(f"trim must be in [0, 0.5), got {trim}")
        self.spec = spec
        self.trim = trim
        self.fixed_steps = steps
        self.fixed_warmup = warmup_steps
        self.prune = prune
        self.tokens_per_step_per_gpu = tokens_per_step_per_gpu
        self.times: list[float] = []
        #: each step's wall time where ``times`` are of another clock (``spec.clock`` cpu)
        self.wall_times: list[float] = []
        self.tflops: list[float | None] = []
        self.stop_reason: StopReason | None = None
        self._dominated: dict[str, Any] | None = None

    @property
    def adaptive(self) -> bool:
        return self.spec.mode == "adaptive"

    @property
    def limit(self) -> int:
        """The most steps this trial runs."""
        return self.spec.steps(self.fixed_steps)

    def window(self) -> tuple[int, bool]:
        """(warm-up steps, whether warm-up is over) of the series so far."""
        if not self.adaptive:
            return self.fixed_warmup, len(self.times) > self.fixed_warmup
        return mser_truncation(self.times)

    def _measured(self) -> tuple[int, list[float]]:
        d, _ = self.window()
        tail = self.times[d:]
        return (d, tail) if tail else (0, list(self.times))

    def interval(self) -> Interval | None:
        """The interval of the steady-state step time (its trimmed mean) so far."""
        _, tail = self._measured()
        return location_interval(tail, self.spec.confidence, self.trim)

    def add(self, step_time_s: float, tflops_per_gpu: float | None = None) -> StopReason | None:
        """One step's time (and TFLOP/s); the stop reason once the trial should stop."""
        if self.stop_reason is not None:
            return self.stop_reason
        self.times.append(float(step_time_s))
        self.tflops.append(finite(tflops_per_gpu))
        self.stop_reason = self._decide()
        return self.stop_reason

    def _decide(self) -> StopReason | None:
        n = len(self.times)
        spec = self.spec
        if self.adaptive and n < spec.min_steps:
            return None
        d, settled = self.window()
        measured = n - d
        iv = None
        if settled and measured >= MIN_MEASURED:
            iv = location_interval(self.times[d:], spec.confidence, self.trim)
        prune_from = spec.min_steps if self.adaptive else self.fixed_warmup + MIN_MEASURED
        if self.prune is not None and iv is not None and n >= min(prune_from, self.limit):
            lo, hi = self._objective(iv)
            if self.prune.dominates(lo, hi):
                self._dominated = {
                    "trial": self.prune.best_trial,
                    "metric": self.prune.metric,
                    "best": self.prune.best,
                    "threshold": self.prune.threshold,
                    "interval": [lo, hi],
                }
                return "dominated"
        if self.adaptive:
            if iv is not None and iv.rel_halfwidth <= spec.rel_halfwidth:
                return "converged"
            return "max_steps" if n >= spec.max_steps else None
        return "fixed" if n >= self.fixed_steps else None

    def _flops_per_gpu(self, first: int) -> float | None:
        """Median TFLOP/s x step time of the steps from ``first`` (TFLOP per step per GPU)."""
        pairs = [
            tf * t for t, tf in zip(self.times[first:], self.tflops[first:], strict=True) if tf
        ]
        return statistics.median(pairs) if pairs else None

    def _objective(self, iv: Interval) -> tuple[float, float]:
        """The objective's interval from the step time's."""
        assert self.prune is not None
        metric = self.prune.metric
        if metric == "step_time_s":
            return iv.lo, iv.hi
        d, _ = self.window()
        scale = (
            self._flops_per_gpu(d) if metric == "tflops_per_gpu" else self.tokens_per_step_per_gpu
        )
        if not scale or iv.lo <= 0:
            # no figure to scale by: never dominated (an interval from 0 to infinity)
            return (0.0, math.inf) if self.prune.direction == "maximize" else (0.0, 0.0)
        return scale / iv.hi, scale / iv.lo

    def result(
        self, step_time_s: float | None = None, tflops_per_gpu: float | None = None
    ) -> Measured:
        """What the trial records.

        Adaptive: the steady-state step time, the :data:`TRIM`-trimmed mean of the steps
        after the detected warm-up, its interval, and TFLOP/s from them. Fixed: the median of
        the window (or the given ``step_time_s`` / ``tflops_per_gpu``, the caller's own
        figures of that window) with the interval of the window's trimmed mean, widened to
        contain them. Both count the window's spikes (:func:`spikes`, the window its own
        reference): they stay in the window, where the trimming bounds their weight.
        """
        if not self.times:
            raise ValueError("no step was measured")
        d, tail = self._measured()
        iv = location_interval(tail, self.spec.confidence, self.trim)
        scale = self._flops_per_gpu(d)
        reason = self.stop_reason or ("max_steps" if self.adaptive else "fixed")
        if self.adaptive:
            st = iv.mean if iv is not None else statistics.fmean(tail)
            tf = scale / st if scale else None
            ci = _above_zero(st, iv.lo, iv.hi) if iv is not None else None
        else:
            st = step_time_s if step_time_s is not None else statistics.median(tail)
            tfs = [x for x in self.tflops[d:] if x is not None]
            tf = tflops_per_gpu if tflops_per_gpu is not None else (
                statistics.median(tfs) if tfs else None
            )  # fmt: skip
            ci = _above_zero(st, min(iv.lo, st), max(iv.hi, st)) if iv is not None else None
        tf_ci: tuple[float, float] | None = None
        if ci is not None and scale and ci[0] > 0:
            tf_ci = (scale / ci[1], scale / ci[0])
            if tf is not None:
                tf_ci = (min(tf_ci[0], tf), max(tf_ci[1], tf))
        return Measured(
            mode=self.spec.mode,
            warmup_steps=d,
            measured_steps=len(tail),
            stop_reason=reason,
            step_time_s=st,
            step_time_ci_s=ci,
            tflops_per_gpu=tf,
            tflops_per_gpu_ci=tf_ci,
            confidence=self.spec.confidence,
            method=None if iv is None else iv.method,
            dominated_by=self._dominated if reason == "dominated" else None,
            trim=0.0 if iv is None else iv.trim,
            spikes=len(spikes(tail)),
        )


def _above_zero(value: float, lo: float, hi: float) -> tuple[float, float]:
    """A step-time interval that stays above zero: as measured when its lower bound is above
    zero, else the same relative half-widths on the log scale (``value * exp(-+h / value)``):
    a time is never 0, however few or noisy the steps."""
    if lo > 0 or value <= 0:
        return (lo, hi)
    # the exponent capped below float overflow (e^709): an interval that wide says nothing
    # more at e^700 than at infinity
    up = min((hi - value) / value, 700.0)
    return (value * math.exp(-(value - lo) / value), value * math.exp(up))


def series_for(spec: TrialSpec, *, tokens_per_step_per_gpu: float | None = None) -> StepSeries:
    """The :class:`StepSeries` of a trial: its ``measurement`` (None: fixed), ``semantics``
    and ``prune`` target."""
    ms = MeasurementSpec.model_validate(spec.measurement or {})
    target = None if spec.prune is None else PruneTarget.model_validate(spec.prune)
    return StepSeries(
        ms,
        steps=int(spec.semantics.get("steps", 6)),
        warmup_steps=int(spec.semantics.get("warmup_steps", 2)),
        prune=target,
        tokens_per_step_per_gpu=tokens_per_step_per_gpu,
    )
