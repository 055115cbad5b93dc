"""The noise model: every interval and every tie that dse shows comes from here.

Run to run, one configuration's throughput varies (about +-1 % on an H200, tens of percent
for CPU trials on a shared machine), so two configurations a few percent apart cannot be
ranked from one trial each. Here:

* **Configurations, not trials.** Trials are grouped by the canonical form of their
  configuration (:meth:`dse.space.searchspace.SearchSpace.canonical`: a knob that does nothing
  in that layout is at its baseline), so configurations identical in effect count as one and
  their trials (repeats, re-measures) are pooled.
* **Within a run** (step to step): a trial's interval of its step time comes from its stored
  per-step times (the steps after ``metrics["measurement"]["warmup_steps"]``, else
  ``semantics.warmup_steps``) on the log scale (:func:`log_step_interval`): a step farther
  than :data:`dse.stats.measure.SPIKE_K` normalised MADs from the median is a spike (a late
  compilation, a host stall) and left out, so one slow step does not widen it; then the 95 %
  Student-t interval of the mean log step time. TFLOP/s and tokens/s per GPU follow as one
  over the step time (a step's work is fixed). A trial without per-step times uses the
  interval it recorded when its bounds are above zero.
* **Between runs** (:class:`NoiseModel`): the relative standard deviation of one run's
  figure about its configuration's, learned from the study's re-measures (every
  configuration measured more than once: ``SS = sum m2 / mean**2`` on ``dof = sum (n - 1)``)
  and combined with a stated conservative prior (:data:`PRIOR_REL_SD` of the device, worth
  :data:`PRIOR_DOF` degrees of freedom): ``rel_sd**2 = (PRIOR_DOF * prior**2 + SS) /
  (PRIOR_DOF + dof)``; the prior alone until the study re-measures anything.
* **A configuration's interval** (:func:`_estimate`, the one function behind every view):
  the mean of its runs' figures, ``mean * exp(-+h)`` with ``h = t * sqrt(max(rel_sd**2,
  mean(w_i**2)) / n)`` (``t`` on ``PRIOR_DOF + dof`` degrees of freedom, ``w_i`` the runs'
  own log standard errors): a configuration measured once gets the run-to-run spread, not
  only its steps' spread; no bound of a time or a throughput reaches zero.
* **Deterministic workloads** (the sim's estimates, replayed rows:
  :data:`DETERMINISTIC_SOURCES`) are not re-measured; their interval is the estimate's error
  band (``metrics["error_band"]``, else :data:`ESTIMATE_BAND`), labelled ``estimate``.
* **The best** is the configuration with the best pooled objective; every configuration whose
  interval overlaps the best's is **tied** with it (:func:`_best_of`). The answer is "best",
  or the tied set with the re-measure budget that would split it (:func:`split_budget`); the
  study loop spends ``budget.remeasure`` on the best and what it cannot yet separate
  (:func:`remeasure_plan`).
* **Across studies** (:func:`pooled_best`), runs of the same configuration under the same
  model, semantics, hardware and measurement are one body of evidence, a run found twice by
  its content (an imported copy) counted once.

Pure functions over trial records, plus the readers of a storage (:func:`study_best`,
:func:`study_noise`, :func:`configuration_intervals`, :func:`pooled_best`).
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dse.core.records import (
    METRIC_DIRECTION,
    REPLAY_RUNS,
    ConfigStats,
    Direction,
    Metric,
    StudyRecord,
    TrialRecord,
    finite,
)
from dse.results.reads import StudyReads
from dse.space.searchspace import SearchSpace, params_key
from dse.stats.measure import spikes

__all__ = [
    "INTERVAL_FIGURES",
    "CANDIDATES",
    "STEPS_BELOW",
    "MAX_READ",
    "Figure",
    "ConfigEstimate",
    "NoisyBest",
    "IntervalSource",
    "PRIOR_REL_SD",
    "PRIOR_DOF",
    "ESTIMATE_BAND",
    "SPLIT_MAX_RUNS",
    "DETERMINISTIC_SOURCES",
    "deterministic_run",
    "NoiseModel",
    "t_quantile",
    "log_step_interval",
    "noise_model",
    "prior_rel_sd",
    "study_noise",
    "split_budget",
    "configuration_intervals",
    "estimate_public",
    "content_key",
    "pooled_best",
    "trial_figures",
    "rank_configurations",
    "noisy_best",
    "remeasure_plan",
    "study_best",
    "exclude_changed",
]

#: Figures reported with an interval (peak memory is one number per configuration).
INTERVAL_FIGURES: tuple[Metric, ...] = ("tflops_per_gpu", "step_time_s", "tokens_per_s_per_gpu")
#: Trials by value a best looks at (with every other trial of their configurations): a
#: configuration below the 20 best trials is not within noise of the best.
CANDIDATES = 20
#: Configurations measured this many times take their interval from their run-to-run spread
#: (their trials' per-step figures are not read).
STEPS_BELOW = 3
#: Trials of one configuration read for its figures other than the objective (the objective
#: itself is pooled over all of them, from storage aggregates).
MAX_READ = 50
#: The relative run-to-run standard deviation of one run's figure assumed before a study has
#: re-measured anything, by device (``resources.device``): conservative on purpose. An H200's
#: runs of one configuration spread by about 1 %, so 3 %; CPU trials on a shared machine
#: spread by tens of percent (the CPU demo measured one configuration -27 % to +62 % apart
#: an hour later), so 15 %. Re-measures replace it gradually (:class:`NoiseModel`).
PRIOR_REL_SD: dict[str, float] = {"cuda": 0.03, "cpu": 0.15}
#: How many run-to-run degrees of freedom the prior is worth: one lucky re-measure (two
#: runs that happen to agree) does not shrink every interval to nothing.
PRIOR_DOF = 4
#: The relative error band of an estimate (the sim workload's cost-model figures) that does
#: not state its own (``metrics["error_band"]``), and of a replayed row without an interval.
ESTIMATE_BAND = 0.10
#: Runs of one configuration beyond which a re-measure budget is not offered to split a tie.
SPLIT_MAX_RUNS = 64
#: Trial sources whose figures are deterministic (the same configuration gives the same
#: figure again): never re-measured; their interval is the estimate's error band.
DETERMINISTIC_SOURCES: tuple[str, ...] = ("estimate", "replay")
#: The 97.5 % quantile of the normal distribution (a run's 95 % half-width over it is its
#: standard error).
_Z95 = 1.959963984540054
#: Where a configuration's interval came from, beside the noise model: ``steps`` (its runs'
#: per-step figures), ``measured`` (its runs' recorded intervals), ``repeats`` (its runs'
#: values only), ``prior`` (one run without steps: the noise model alone), ``estimate`` (a
#: deterministic figure's error band), ``none`` (no interval).
IntervalSource = Literal["measured", "steps", "repeats", "prior", "estimate", "none"]
_CI_KEYS: dict[str, str] = {"tflops_per_gpu": "tflops_per_gpu_ci", "step_time_s": "step_time_ci_s"}


@dataclass(frozen=True)
class Figure:
    """A figure and its 95 % interval (None: not known)."""

    value: float
    ci: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "ci": None if self.ci is None else list(self.ci)}

    @property
    def bounds(self) -> tuple[float, float]:
        return self.ci if self.ci is not None else (self.value, self.value)


@dataclass(frozen=True)
class ConfigEstimate:
    """One configuration (trials pooled).

    Attributes:
        key: the canonical configuration's key.
        number: its first trial (the representative).
        params: the representative's knob values; ``params_key`` its stored key.
        n: how many trials are pooled.
        trials: the numbers of the pooled trials read, the representative first (all of them
            unless the configuration ran more than :data:`MAX_READ` times).
        trial: the representative trial, when it was read (always for the best and the
            configurations tied with it).
        figures: pooled figures by name (the objective's among them).
        objective: the pooled objective (over all ``n`` trials).
        source: where the objective's interval came from.
        study: the study of the representative (a cross-study answer), else None.
        evidence: ``(study, trial)`` of every run pooled (a cross-study answer), else empty.
        stored_keys: the stored ``params_key`` values pooled into it.
    """

    key: str
    number: int
    params: dict[str, Any]
    params_key: str
    n: int
    trials: tuple[int, ...]
    trial: TrialRecord | None
    figures: dict[str, Figure]
    objective: Figure
    source: IntervalSource
    study: str | None = None
    evidence: tuple[tuple[str, int], ...] = ()
    stored_keys: tuple[str, ...] = ()

    def overlaps(self, other: ConfigEstimate) -> bool:
        """Whether the objective intervals of the two overlap (a point is a zero-width
        interval)."""
        a, b = self.objective.bounds, other.objective.bounds
        return a[0] <= b[1] and b[0] <= a[1]


@dataclass(frozen=True)
class NoisyBest:
    """The best configuration of a study, with the ones tied with it within noise.

    Attributes:
        best: the configuration with the best pooled objective.
        tied: the other configurations whose interval overlaps the best's, best first.
        ranking: every candidate configuration, best first.
        rel_sd: the relative run-to-run standard deviation the re-measures show (None
            until a configuration ran twice); ``model`` the noise model the intervals use.
        split: the re-measure budget (runs, all told) that would split the tie (None: no
            tie, estimates, or no practical budget); ``inseparable`` the tied configurations
            no practical budget splits from the best (equal within noise).
    """

    best: ConfigEstimate
    tied: tuple[ConfigEstimate, ...] = ()
    ranking: tuple[ConfigEstimate, ...] = ()
    rel_sd: float | None = None
    metric: str = "tflops_per_gpu"
    direction: Direction = "maximize"
    extra: dict[str, Any] = field(default_factory=dict)
    model: NoiseModel = field(default_factory=lambda: NoiseModel(max(PRIOR_REL_SD.values())))
    split: int | None = None
    inseparable: tuple[ConfigEstimate, ...] = ()

    @property
    def deterministic(self) -> bool:
        """The best is an estimate (sim) or a replayed figure: re-measuring changes nothing."""
        return self.best.source == "estimate"

    @property
    def verdict(self) -> Literal["best", "tied"]:
        return "tied" if self.tied else "best"

    def _names(self) -> str:
        names = [_label(c) for c in (self.best, *self.tied)]
        return ", ".join(names[:-1]) + " and " + names[-1]

    @property
    def message(self) -> str:
        """The tie, said, when there is one (else ``""``): ``tied within noise: trial A and
        trial B; a re-measure budget of K would split them`` for measured figures, ``within
        the estimates' error band: ...`` for estimates (never re-measured)."""
        if not self.tied:
            return ""
        if self.deterministic:
            return (
                f"within the estimates' error band: {self._names()} (estimates, not "
                "re-measured: a deterministic workload gives the same figures again)"
            )
        text = f"tied within noise: {self._names()}"
        if self.split is None:
            return text + "; no practical re-measure budget splits them (equal within noise)"
        if not self.inseparable:
            return text + f"; a re-measure budget of {self.split} would split them"
        eq_keys = {c.key for c in self.inseparable}
        off = [_label(c) for c in self.tied if c.key not in eq_keys]
        eq = [_label(c) for c in self.inseparable]
        return (
            text + f"; a re-measure budget of {self.split} would split off {', '.join(off)}; "
            f"{', '.join(eq)} {'is' if len(eq) == 1 else 'are'} equal to the best within noise "
            "(no practical budget splits them)"
        )

    @property
    def answer(self) -> str:
        """The decision in words: ``best: trial N`` or ``tied set of N: ...``."""
        if not self.tied:
            return f"best: {_label(self.best)} (its 95% interval clears every other)"
        return f"tied set of {1 + len(self.tied)}: {self.message}"


def _label(c: ConfigEstimate) -> str:
    return f"trial {c.number}" if c.study is None else f"{c.study} trial {c.number}"


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile (``0.5 < p < 1``) of Student's t with ``dof`` degrees of freedom:
    the exact distribution function of an integer ``dof`` (Abramowitz and Stegun 26.7.3/4, a
    finite sum) inverted by bisection; the normal quantile beyond 1000 degrees."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1 (dof={dof})")
    if not 0.5 < p < 1:
        raise ValueError(f"p must be between 0.5 and 1 (p={p})")
    if dof > 1000:
        return statistics.NormalDist().inv_cdf(p)
    want = 2 * p - 1  # P(|T| <= t)
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, dof) < want:
        hi *= 2
    for _ in range(64):  # to double precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_two_sided(mid, dof) < want else (lo, mid)
    return (lo + hi) / 2


def _t_two_sided(t: float, dof: int) -> float:
    """P(|T| <= t) for Student's t with an integer ``dof`` (A&S 26.7.3, 26.7.4)."""
    theta = math.atan(t / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2:  # odd
        if dof == 1:
            return 2 * theta / math.pi
        term = total = math.cos(theta)
        for k in range(3, dof - 1, 2):  # cos^(2j+1) terms up to cos^(dof-2)
            term *= c2 * (k - 1) / k
            total += term
        return 2 / math.pi * (theta + s * total)
    term = total = 1.0
    for k in range(2, dof - 1, 2):  # cos^(2j) terms up to cos^(dof-2)
        term *= c2 * (k - 1) / k
        total += term
    return s * total


def _ci_of(v: Any) -> tuple[float, float] | None:
    if not isinstance(v, list | tuple) or len(v) != 2:
        return None
    lo, hi = finite(v[0]), finite(v[1])
    if lo is None or hi is None or lo > hi:
        return None
    return (lo, hi)


def _warmup(trial: TrialRecord, default: int) -> int:
    meas = trial.metrics.get("measurement")
    w = meas.get("warmup_steps") if isinstance(meas, Mapping) else None
    return w if isinstance(w, int) and not isinstance(w, bool) and w >= 0 else default


def _step_half_width(values: Sequence[float]) -> float | None:
    """The half-width of the 95 % t-interval of the mean of ``values`` (None: < 2 values)."""
    n = len(values)
    if n < 2:
        return None
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1))
    return t_quantile(0.975, n - 1) * sd / math.sqrt(n)


def log_step_interval(times: Sequence[float]) -> tuple[float, float] | None:
    """The 95 % interval of a trial's steady step time on the log scale, ``(lo, hi)`` of
    ``log(step time)``, from its measured steps: the steps farther than
    :data:`dse.stats.measure.SPIKE_K` normalised MADs from their median are left out (the Hampel
    identifier: one slow step among 3-4 is a spike, not the configuration), then Student's t
    on the mean of the log times of the others. None with fewer than 2 usable steps, or when
    they are all equal (a replayed row without step times: no interval known)."""
    ys = [math.log(t) for t in times if t > 0 and math.isfinite(t)]
    if len(ys) < 2:
        return None
    out = set(spikes(ys)) if len(ys) >= 3 else set()
    kept = [y for i, y in enumerate(ys) if i not in out]
    h = _step_half_width(kept)
    if not h:
        return None
    m = math.fsum(kept) / len(kept)
    return (m - h, m + h)


def trial_figures(
    space: SearchSpace, trial: TrialRecord
) -> tuple[dict[str, Figure], IntervalSource]:
    """A complete trial's figures with their intervals (see the module docstring), and where
    the intervals came from.

    The interval of the step time is :func:`log_step_interval` of the measured steps, widened
    to contain the trial's reported step time; TFLOP/s and tokens/s follow from it (a step's
    work is fixed, so they scale as one over the step time): every bound is above zero. A
    trial without usable per-step times keeps the interval it measured (``step_time_ci_s``,
    ``tflops_per_gpu_ci``) when its bounds are above zero."""
    m = trial.metrics
    out: dict[str, Figure] = {}
    source: IntervalSource = "none"
    measured = list(trial.steps)[_warmup(trial, space.semantics.warmup_steps) :]
    st_v, tf_v = finite(m.get("step_time_s")), finite(m.get("tflops_per_gpu"))
    times = [x for x in (finite(s.step_time_s) for s in measured) if x is not None]
    log_ci = log_step_interval(times)
    if log_ci is not None and st_v is not None and st_v > 0:
        c = math.log(st_v)
        lo, hi = math.exp(min(log_ci[0], c)), math.exp(max(log_ci[1], c))
        out["step_time_s"] = Figure(st_v, (lo, hi))
        if tf_v is not None:
            work = tf_v * st_v  # TFLOP per step and GPU
            out["tflops_per_gpu"] = Figure(tf_v, (work / hi, work / lo))
        source = "steps"
    else:
        for name, v in (("step_time_s", st_v), ("tflops_per_gpu", tf_v)):
            if v is None:
                continue
            ci = _ci_of(m.get(_CI_KEYS[name]))
            if ci is not None and ci[0] > 0:
                source = "measured"
                out[name] = Figure(v, (min(ci[0], v), max(ci[1], v)))
            else:
                out[name] = Figure(v)
    st = out.get("step_time_s")
    tokens = _tokens_per_gpu_step(space)
    if st is not None and st.value > 0:
        tps = finite(m.get("tokens_per_s_per_gpu")) or tokens / st.value
        ci = None
        if st.ci is not None and st.ci[0] > 0:
            ci = (tokens / st.ci[1], tokens / st.ci[0])
        out["tokens_per_s_per_gpu"] = Figure(tps, ci)
    peak = finite(m.get("peak_mem_gib"))
    if peak is not None:
        out["peak_mem_gib"] = Figure(peak)
    return out, source


def _tokens_per_gpu_step(space: SearchSpace) -> float:
    sem = space.semantics
    return sem.global_batch_size * sem.seq_length / space.resources.world_size


def exclude_changed(space: SearchSpace) -> bool:
    """Whether a best leaves out configurations flagged numerics ``changed``."""
    lp = space.loss_parity
    return lp.enabled and not lp.allow_changed_in_best


@dataclass
class _Group:
    """A canonical configuration being pooled: the objective over all its eligible trials
    (count, mean, sum of squared deviations), the trials read of it."""

    key: str
    number: int
    params: dict[str, Any]
    params_key: str
    stored_keys: set[str]
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    trials: list[TrialRecord] = field(default_factory=list)
    study: str | None = None
    evidence: list[tuple[str, int]] = field(default_factory=list)
    deterministic: bool = False
    band: float = ESTIMATE_BAND

    def classify(self) -> None:
        """Whether its runs are deterministic (every one read is an estimate or a replay),
        and their error band."""
        self.deterministic = bool(self.trials) and all(map(deterministic_run, self.trials))
        if self.deterministic:
            self.band = max(_band_of(t) for t in self.trials)

    def merge(self, n: int, mean: float, m2: float, number: int, params: dict[str, Any],
              params_key: str) -> None:  # fmt: skip
        """Add ``n`` values of mean ``mean`` (parallel variance: Chan et al.)."""
        if n <= 0:
            return
        total = self.n + n
        delta = mean - self.mean
        self.m2 += m2 + delta * delta * self.n * n / total
        self.mean += delta * n / total
        self.n = total
        self.stored_keys.add(params_key)
        if number < self.number:
            self.number, self.params, self.params_key = number, dict(params), params_key

    @property
    def read_all(self) -> bool:
        return len(self.trials) >= self.n


def _eligible(t: TrialRecord) -> bool:
    return t.state == "complete" and finite(t.value) is not None


def _groups_of_trials(space: SearchSpace, trials: Sequence[TrialRecord]) -> dict[str, _Group]:
    out: dict[str, _Group] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if not _eligible(t):
            continue
        key = params_key(space.canonical(t.params))
        g = out.setdefault(key, _Group(key, t.number, dict(t.params), t.params_key, set()))
        g.merge(1, float(t.value), 0.0, t.number, t.params, t.params_key)  # type: ignore[arg-type]
        g.trials.append(t)
    for g in out.values():
        g.classify()
    return out


#: Canonical keys of stored configurations per space (``id(space)`` -> the space, kept weakly,
#: and its stored ``params_key`` -> canonical key). A stored space is parsed once and cached
#: (:func:`dse.results.run_settings.effective_space`), and a configuration's canonical form
#: depends on the space alone, so every rebuild of a study's best after a write (10 a second
#: under a writer) reuses them instead of canonicalizing every configuration again.
_CANONICAL: dict[int, tuple[weakref.ref[SearchSpace], dict[str, str]]] = {}
_CANONICAL_LOCK = threading.Lock()
#: The most canonical keys kept per space (a space beyond it starts afresh).
CANONICAL_KEYS_MAX = 200_000


def _forget_space(sid: int, ref: weakref.ref[SearchSpace]) -> None:
    """Drop the keys of a space that was collected (not those of a later one at its id)."""
    hit = _CANONICAL.get(sid)
    if hit is not None and hit[0] is ref:
        _CANONICAL.pop(sid, None)


def canonical_key(space: SearchSpace, stored_key: str, params: Mapping[str, Any]) -> str:
    """``params_key(space.canonical(params))`` of the stored configuration ``stored_key``
    (the ``params_key`` of ``params``), remembered per space."""
    sid = id(space)
    with _CANONICAL_LOCK:
        hit = _CANONICAL.get(sid)
        if hit is None or hit[0]() is not space:
            ref = weakref.ref(space, functools.partial(_forget_space, sid))
            hit = _CANONICAL[sid] = (ref, {})
        memo = hit[1]
        key = memo.get(stored_key)
    if key is None:
        key = params_key(space.canonical(params))
        with _CANONICAL_LOCK:
            if len(memo) >= CANONICAL_KEYS_MAX:
                memo.clear()
            memo[stored_key] = key
    return key


def _groups_of_stats(space: SearchSpace, stats: Sequence[ConfigStats]) -> dict[str, _Group]:
    out: dict[str, _Group] = {}
    for c in sorted(stats, key=lambda c: c.first_number):
        key = canonical_key(space, c.params_key, c.params)
        g = out.setdefault(key, _Group(key, c.first_number, dict(c.params), c.params_key, set()))
        g.merge(c.n, c.mean, c.m2, c.first_number, c.params, c.params_key)
    return out


def _log_half(ci: tuple[float, float], value: float) -> float | None:
    """The half-width on the log scale of an interval around ``value`` (None: not above 0)."""
    lo, hi = ci
    if lo <= 0 or value <= 0:
        return None
    return max(math.log(hi) - math.log(value), math.log(value) - math.log(lo), 0.0)


def deterministic_run(trial: TrialRecord) -> bool:
    """Whether a run's figure is deterministic: an estimate, or a replay of a table that
    holds one run of its configuration (``metrics["replay_runs"]``, one when not said)."""
    if trial.source == "estimate":
        return True
    if trial.source == "replay":
        runs = trial.metrics.get(REPLAY_RUNS)
        return not isinstance(runs, int) or runs <= 1
    return False


def _band_of(trial: TrialRecord) -> float:
    """A deterministic run's relative error band: ``metrics["error_band"]`` (an estimate's
    own), else a replayed row's recorded interval, else :data:`ESTIMATE_BAND`."""
    b = finite(trial.metrics.get("error_band"))
    if b is not None and 0 < b < 10:
        return b
    v = finite(trial.metrics.get("tflops_per_gpu"))
    ci = _ci_of(trial.metrics.get("tflops_per_gpu_ci"))
    if trial.source == "replay" and v is not None and ci is not None:
        h = _log_half(ci, v)
        if h:
            return math.exp(h) - 1
    return ESTIMATE_BAND


@dataclass(frozen=True)
class NoiseModel:
    """A study's run-to-run noise (see the module docstring): the relative standard deviation
    of one run's figure about its configuration's true figure, the prior for the study's
    device combined with what its re-measures showed (a scaled inverse chi-square: ``rel_sd**2
    = (PRIOR_DOF * prior**2 + SS) / (PRIOR_DOF + dof)``).

    Attributes:
        prior: the prior relative standard deviation (:data:`PRIOR_REL_SD` of the device).
        learned: the relative standard deviation the re-measures alone show (None: none yet).
        dof: the re-measures' degrees of freedom (runs beyond the first of each configuration).
        ss: their sum of squared relative deviations.
    """

    prior: float
    learned: float | None = None
    dof: int = 0
    ss: float = 0.0

    @property
    def rel_sd(self) -> float:
        return math.sqrt((PRIOR_DOF * self.prior**2 + self.ss) / (PRIOR_DOF + self.dof))

    @property
    def t(self) -> float:
        """The 97.5 % Student-t quantile on the model's degrees of freedom."""
        return t_quantile(0.975, PRIOR_DOF + self.dof)

    @property
    def basis(self) -> str:
        """``prior`` (no re-measure yet) or ``re-measures`` (some, combined with the prior)."""
        return "prior" if self.dof == 0 else "re-measures"

    def half_width(self, n: int, within: Sequence[float] = ()) -> float:
        """The log half-width of the 95 % interval of a configuration's mean figure over
        ``n`` runs: ``t * sqrt(max(rel_sd**2, mean(w_i**2)) / n)``, ``w_i`` the runs' own
        standard errors on the log scale (their 95 % half-widths over 1.96): a run whose own
        steps spread more than runs do is judged by its steps."""
        w2 = statistics.fmean((h / _Z95) ** 2 for h in within) if within else 0.0
        return self.t * math.sqrt(max(self.rel_sd**2, w2) / max(n, 1))

    def describe(self) -> str:
        """The model in words: ``run to run 12.9% per run (prior 15%, re-measures 10.9% on 5
        degrees of freedom)``."""
        learned = (
            "no re-measure yet"
            if self.learned is None
            else f"re-measures {100 * self.learned:.3g}% on {self.dof} degrees of freedom"
        )
        return (
            f"run to run {100 * self.rel_sd:.3g}% per run (prior {100 * self.prior:.3g}%, "
            f"{learned})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"rel_sd": self.rel_sd, "prior_rel_sd": self.prior, "learned_rel_sd": self.learned,
                "dof": self.dof, "prior_dof": PRIOR_DOF, "basis": self.basis,
                "text": self.describe()}  # fmt: skip


def prior_rel_sd(space: SearchSpace) -> float:
    """The run-to-run prior of a space's device (:data:`PRIOR_REL_SD`)."""
    return PRIOR_REL_SD.get(space.resources.device, max(PRIOR_REL_SD.values()))


def noise_model(prior: float, stats: Iterable[tuple[int, float, float]]) -> NoiseModel:
    """The noise model from configurations' ``(n, mean, m2)`` of their measured runs (those
    measured more than once count)."""
    ss, dof = 0.0, 0
    for n, mean, m2 in stats:
        if n < 2 or mean == 0:
            continue
        ss += m2 / (mean * mean)
        dof += n - 1
    learned = math.sqrt(ss / dof) if dof else None
    return NoiseModel(prior, learned, dof, ss)


def _model_of_groups(space: SearchSpace, groups: Iterable[_Group]) -> NoiseModel:
    return noise_model(
        prior_rel_sd(space), ((g.n, g.mean, g.m2) for g in groups if not g.deterministic)
    )


def _pool(values: Sequence[float], halves: Sequence[float], model: NoiseModel,
          n: int | None = None, mean: float | None = None) -> Figure:  # fmt: skip
    """A pooled measured figure: the mean (``mean`` of ``n`` runs when given, else of
    ``values``) and its 95 % interval ``mean * exp(-+h)``, ``h`` from
    :meth:`NoiseModel.half_width` (``halves``: the runs' own log half-widths): above zero.
    A mean at or below zero (not a time or a throughput) takes the same relative half-width
    on the linear scale."""
    k = n if n is not None else len(values)
    m = mean if mean is not None else statistics.fmean(values)
    h = model.half_width(k, halves)
    if m <= 0:
        return Figure(m, (m - h * abs(m), m + h * abs(m)))
    return Figure(m, (m * math.exp(-h), m * math.exp(h)))


def _estimate(space: SearchSpace, g: _Group, metric: str, model: NoiseModel) -> ConfigEstimate:
    """A configuration's pooled figures and their intervals: THE interval of every view."""
    per: dict[str, list[Figure]] = {}
    halves: dict[str, list[float]] = {}
    srcs: set[IntervalSource] = set()
    for t in g.trials:
        figs: dict[str, Figure]
        src: IntervalSource
        if g.deterministic:
            figs = {k: Figure(v) for k in (*INTERVAL_FIGURES, "peak_mem_gib")
                    if (v := finite(t.metrics.get(k))) is not None}  # fmt: skip
            src = "estimate"
        else:
            own, src = trial_figures(space, t)
            figs = dict(own)
        obj = figs.get(metric)
        # the objective is the stored value (tokens/s derived, sim estimates ...)
        figs[metric] = Figure(float(t.value), obj.ci if obj is not None else None)  # type: ignore[arg-type]
        srcs.add(src)
        for name, f in figs.items():
            per.setdefault(name, []).append(f)
            if f.ci is not None and (h := _log_half(f.ci, f.value)) is not None:
                halves.setdefault(name, []).append(h)
    figures: dict[str, Figure] = {}
    for name, fs in per.items():
        vals = [f.value for f in fs]
        if name == "peak_mem_gib":
            figures[name] = Figure(statistics.fmean(vals))
        elif g.deterministic:
            figures[name] = _band(statistics.fmean(vals), g.band)
        else:
            figures[name] = _pool(vals, halves.get(name, []), model)
    # the objective over every trial of the configuration (read or aggregated)
    if g.deterministic:
        objective = _band(g.mean, g.band)
    else:
        objective = _pool([], halves.get(metric, []) if g.read_all else [], model, n=g.n,
                          mean=g.mean)  # fmt: skip
    figures[metric] = objective
    source: IntervalSource = (
        "estimate" if g.deterministic
        else "steps" if "steps" in srcs and g.read_all
        else "measured" if "measured" in srcs
        else "repeats" if g.n > 1 or model.dof else "prior"
    )  # fmt: skip
    first = g.trials[0] if g.trials and g.trials[0].number == g.number else None
    return ConfigEstimate(
        key=g.key, number=g.number, params=g.params, params_key=g.params_key, n=g.n,
        trials=tuple(t.number for t in g.trials) or (g.number,), trial=first,
        figures=figures, objective=objective, source=source, study=g.study,
        evidence=tuple(g.evidence), stored_keys=tuple(sorted(g.stored_keys)),
    )  # fmt: skip


def _band(value: float, band: float) -> Figure:
    """An estimate's figure with its error band: ``[v / (1 + band), v * (1 + band)]``."""
    if value <= 0:
        return Figure(value, (value * (1 + band), value / (1 + band)))
    return Figure(value, (value / (1 + band), value * (1 + band)))


def _ranked(
    space: SearchSpace, groups: Iterable[_Group], metric: str, direction: Direction,
    model: NoiseModel | None = None,
) -> tuple[list[ConfigEstimate], NoiseModel]:  # fmt: skip
    gs = list(groups)
    model = model if model is not None else _model_of_groups(space, gs)
    out = [_estimate(space, g, metric, model) for g in gs]
    _rank(out, direction)
    return out, model


def _rank(out: list[ConfigEstimate], direction: Direction) -> None:
    """THE ranking order, in place: best objective first; ties: the study's name, then the
    lower trial number (the configuration that ran first)."""
    sign = -1.0 if direction == "maximize" else 1.0
    out.sort(key=lambda c: (sign * c.objective.value, c.study or "", c.number))


def rank_configurations(
    space: SearchSpace, trials: Sequence[TrialRecord], *, metric: str, direction: Direction
) -> tuple[list[ConfigEstimate], float | None]:
    """Every configuration of the complete ``trials`` with a value, pooled and ranked best
    first (ties: the lower trial number), and the relative run-to-run standard deviation its
    re-measures show (None while no configuration ran twice)."""
    ranking, model = _ranked(space, _groups_of_trials(space, trials).values(), metric, direction)
    return ranking, model.learned


def split_budget(
    best: ConfigEstimate, tied: Sequence[ConfigEstimate], model: NoiseModel
) -> tuple[int | None, tuple[ConfigEstimate, ...]]:
    """How many more runs (all told) would separate the best from the configurations tied
    with it, were their means what they are now and the run-to-run spread what the model
    says, and which of them no practical budget separates.

    A tied configuration is separable when its gap to the best (on the log scale) is above
    ``2 z rel_sd / sqrt(SPLIT_MAX_RUNS)``: run :data:`SPLIT_MAX_RUNS` times each, their
    intervals would no longer overlap. The budget runs the best and every separable one up to
    ``m`` times, ``m`` the fewest at which ``2 t rel_sd / sqrt(m)`` falls below each of
    their gaps (``t`` on the degrees of freedom the added runs bring). ``(None, tied)`` when
    none is separable."""
    if not tied or best.objective.value <= 0 or any(c.objective.value <= 0 for c in tied):
        return None, tuple(tied)
    gap = {c.key: abs(math.log(best.objective.value) - math.log(c.objective.value)) for c in tied}
    floor = 2 * _Z95 * model.rel_sd / math.sqrt(SPLIT_MAX_RUNS)
    sep = [c for c in tied if gap[c.key] > floor]
    rest = tuple(c for c in tied if gap[c.key] <= floor)
    if not sep:
        return None, rest
    need = min(gap[c.key] for c in sep)
    runs = [c.n for c in (best, *sep)]
    for m in range(1, 4 * SPLIT_MAX_RUNS + 1):
        added = sum(max(0, m - n) for n in runs)
        if (
            2 * t_quantile(0.975, PRIOR_DOF + model.dof + added) * model.rel_sd / math.sqrt(m)
            < need
        ):
            return added, rest
    return None, tuple(tied)


def _best_of(ranking: Sequence[ConfigEstimate], model: NoiseModel, metric: str,
             direction: Direction) -> NoisyBest | None:  # fmt: skip
    """THE tie rule: every configuration whose interval overlaps the best's is tied with it."""
    if not ranking:
        return None
    best = ranking[0]
    tied = tuple(c for c in ranking[1:] if c.overlaps(best))
    split, rest = (None, ()) if best.source == "estimate" else split_budget(best, tied, model)
    return NoisyBest(
        best, tied, tuple(ranking), model.learned, metric, direction, model=model,
        split=split, inseparable=rest,
    )  # fmt: skip


def noisy_best(
    space: SearchSpace, trials: Sequence[TrialRecord], *, metric: str, direction: Direction
) -> NoisyBest | None:
    """The best configuration of ``trials`` and those tied with it within noise (None: no
    complete trial with a value)."""
    ranking, model = _ranked(space, _groups_of_trials(space, trials).values(), metric, direction)
    return _best_of(ranking, model, metric, direction)


def remeasure_plan(nb: NoisyBest, n: int) -> list[ConfigEstimate]:
    """Up to ``n`` configurations to run once more each, where a run can change the answer:
    the best and the configurations tied with it that a re-measure budget can split from it
    (all the tied ones when none can), those with the fewest trials first (then by rank); a
    configuration may come twice when ``n`` exceeds them. Empty when nothing is tied, and
    for estimates (a deterministic workload gives the same figure again)."""
    if not nb.tied or n <= 0 or nb.deterministic:
        return []
    eq = {c.key for c in nb.inseparable}
    sep = [c for c in nb.tied if c.key not in eq]
    cands = [nb.best, *(sep or nb.tied)]
    counts = {c.key: c.n for c in cands}
    rank = {c.key: i for i, c in enumerate(cands)}
    out: list[ConfigEstimate] = []
    for _ in range(n):
        c = min(cands, key=lambda c: (counts[c.key], rank[c.key]))
        out.append(c)
        counts[c.key] += 1
    return out


def study_noise(storage: StudyReads, study: StudyRecord, space: SearchSpace,
                value_range: tuple[float, float] | None = None) -> NoiseModel:  # fmt: skip
    """A stored study's noise model: the prior of its device and every configuration it
    measured more than once (re-measures, repeats), one grouped walk of an index (no filter
    by source: a study runs one workload, and a deterministic one's runs carry its error
    band whatever the model says)."""
    stats = storage.configuration_stats(
        study.id, repeated=True, value_range=value_range, exclude_changed=exclude_changed(space)
    )
    merged = _groups_of_stats(space, stats)
    return noise_model(prior_rel_sd(space), ((g.n, g.mean, g.m2) for g in merged.values()))


def _read_groups(
    storage: StudyReads,
    study: StudyRecord,
    groups: Sequence[_Group],
    *,
    steps: bool,
    excl: bool,
    value_range: tuple[float, float] | None,
) -> None:
    """Read the eligible trials of ``groups`` (the first MAX_READ of each)."""
    keys = sorted({k for g in groups for k in g.stored_keys})
    if not keys:
        return
    got: list[TrialRecord] = []
    for t in storage.trials_of_configurations(study.id, keys, state="complete", with_steps=steps):
        if not _eligible(t) or (excl and t.numerics == "changed"):
            continue
        v = float(t.value)  # type: ignore[arg-type]
        if value_range is None or value_range[0] < v <= value_range[1]:
            got.append(t)
    for g in groups:
        g.trials = [t for t in got if t.params_key in g.stored_keys][:MAX_READ]
        g.classify()


def study_best(
    storage: StudyReads,
    study: StudyRecord,
    space: SearchSpace,
    *,
    value_range: tuple[float, float] | None = None,
) -> NoisyBest | None:
    """The noise-aware best of a stored study (``study``: its record; ``space``: its
    effective space, :func:`dse.results.run_settings.effective_space`). None: no complete trial.

    The candidates are the configurations of the :data:`CANDIDATES` best trials by value
    (numerics-changed trials left out unless the space allows them), each objective pooled
    over all its trials from storage aggregates; the noise model is the study's
    (:func:`study_noise`). Trials are read (with their per-step figures) for configurations
    measured fewer than :data:`STEPS_BELOW` times, and for the best (at most :data:`MAX_READ`
    of its trials, without steps), so a study of 100,000 trials costs a few index walks.
    """
    excl = exclude_changed(space)
    stats = storage.best_configurations(
        study.id, study.direction, limit=CANDIDATES, value_range=value_range,
        exclude_changed=excl,
    )  # fmt: skip
    groups = _groups_of_stats(space, stats)
    metric = study.metric
    direction = _direction(study)
    model = study_noise(storage, study, space, value_range)
    small = [g for g in groups.values() if g.n < STEPS_BELOW]
    _read_groups(storage, study, small, steps=True, excl=excl, value_range=value_range)
    ranking, _ = _ranked(space, groups.values(), metric, direction, model)
    nb = _best_of(ranking, model, metric, direction)
    if nb is None or groups[nb.best.key].trials:
        return nb
    # the best measured more often: its other figures from up to MAX_READ of its trials (its
    # objective and the ties come from the aggregates)
    _read_groups(storage, study, [groups[nb.best.key]], steps=False, excl=excl,
                 value_range=value_range)  # fmt: skip
    ranking, _ = _ranked(space, groups.values(), metric, direction, model)
    return _best_of(ranking, model, metric, direction)


def _direction(study: StudyRecord) -> Direction:
    return (
        study.direction if study.direction in ("maximize", "minimize")
        else METRIC_DIRECTION.get(study.metric, "maximize")
    )  # fmt: skip


def configuration_intervals(
    storage: StudyReads, study: StudyRecord, space: SearchSpace, trials: Sequence[TrialRecord],
    best: NoisyBest | None = None,
) -> dict[int, ConfigEstimate]:  # fmt: skip
    """The configuration estimate (its pooled figures and THE intervals) of each complete
    ``trials`` (a page of a study's trials), by trial number: the same :func:`_estimate`
    under the same :func:`study_noise` as :func:`study_best`, whose candidates it reuses
    (``best``: found already), so that a trial's interval is the same in every view."""
    nb = best if best is not None else study_best(storage, study, space)
    if nb is None:
        return {}
    known: dict[str, ConfigEstimate] = {c.params_key: c for c in nb.ranking}
    for c in nb.ranking:  # the stored keys pooled into a candidate
        for k in c.stored_keys:
            known.setdefault(k, c)
    want = sorted({t.params_key for t in trials if _eligible(t) and t.params_key not in known})
    if want:
        stats = storage.configuration_stats(study.id, params_keys=want)
        groups = _groups_of_stats(space, stats)
        _read_groups(storage, study, [g for g in groups.values() if g.n < STEPS_BELOW],
                     steps=True, excl=False, value_range=None)  # fmt: skip
        ranked, _ = _ranked(space, groups.values(), study.metric, _direction(study), nb.model)
        for c in ranked:
            for k in c.stored_keys:
                known.setdefault(k, c)
    return {
        t.number: known[t.params_key] for t in trials if _eligible(t) and t.params_key in known
    }


def estimate_public(c: ConfigEstimate) -> dict[str, Any]:
    """A configuration's estimate as the API and the dashboard show it (one shape)."""
    return {
        "trial": c.number,
        "n": c.n,
        "trials": list(c.trials),
        "kind": "estimate" if c.source == "estimate" else "measured",
        "source": c.source,
        "figures": {k: f.as_dict() for k, f in c.figures.items()},
    }


# --- the cross-study answer -------------------------------------------------------------------


def content_key(trial: TrialRecord) -> str:
    """What identifies a run by its content: its knob values, its figure and its per-step
    metrics (an imported copy of a study holds the same; a second run never does)."""
    import json

    steps = [(s.step, s.step_time_s, s.tflops_per_gpu, s.loss) for s in trial.steps]
    m = trial.metrics
    figs = [m.get(k) for k in ("step_time_s", "tflops_per_gpu", "peak_mem_gib")]
    return json.dumps([trial.params_key, trial.value, figs, steps], default=repr)


def pooled_best(
    storage: StudyReads,
    studies: Sequence[tuple[Any, SearchSpace, tuple[float, float] | None]],
    *,
    metric: str,
    direction: Direction,
) -> NoisyBest | None:
    """The best configuration over several studies, their evidence pooled (``studies``:
    each study's record, effective space and plausible value range).

    Runs of the same configuration (canonical form) under the same model, semantics and
    hardware are one body of evidence, whatever study holds them; a run found twice by its
    content (:func:`content_key`: an imported copy of a study) counts once. The
    configurations are ranked, their intervals made and the ties found by the same functions
    as in one study (:func:`_estimate`, :func:`_best_of`); the noise model pools the
    re-measures of every study (each run once)."""
    pooled: dict[str, _Group] = {}
    seen: set[str] = set()
    spaces: dict[str, SearchSpace] = {}
    prior = 0.0
    for study, space, vr in studies:
        excl = exclude_changed(space)
        prior = max(prior, prior_rel_sd(space))
        stats = storage.best_configurations(
            study.id, study.direction, limit=CANDIDATES, value_range=vr, exclude_changed=excl
        )
        groups = _groups_of_stats(space, stats)
        _read_groups(storage, study, list(groups.values()), steps=True, excl=excl,
                     value_range=vr)  # fmt: skip
        sig = _evidence_signature(study, space)
        for g in groups.values():
            key = sig + "|" + g.key
            spaces.setdefault(key, space)
            for t in g.trials:
                ck = sig + "|" + content_key(t)
                if ck in seen:
                    continue
                seen.add(ck)
                p = pooled.get(key)
                if p is None:
                    p = pooled[key] = _Group(key, t.number, dict(t.params), t.params_key, set(),
                                             study=study.name)  # fmt: skip
                # the representative stays the first run found (the first study's first)
                p.merge(1, float(t.value), 0.0, p.number, p.params, t.params_key)  # type: ignore[arg-type]
                p.trials.append(t)
                p.evidence.append((study.name, t.number))
    if not pooled:
        return None
    for p in pooled.values():
        p.classify()
    model = noise_model(prior, ((g.n, g.mean, g.m2) for g in pooled.values()
                                if not g.deterministic))  # fmt: skip
    out: list[ConfigEstimate] = []
    for key, g in pooled.items():
        out.append(_estimate(spaces[key], g, metric, model))
    _rank(out, direction)
    return _best_of(out, model, metric, direction)


def _evidence_signature(study: StudyRecord, space: SearchSpace) -> str:
    """What makes runs of one configuration comparable across studies: the model, the
    training semantics, the hardware, the measurement and the objective."""
    import json

    return json.dumps(
        [study.metric, study.model, space.semantics.model_dump(mode="json"), study.hardware,
         space.measurement.identity() if hasattr(space, "measurement") else None],
        sort_keys=True, default=repr,
    )  # fmt: skip
