"""The noise-aware best: each figure with its interval, repeats pooled, ties said.

Run to run, one configuration's throughput varies by about +-1 % on an H200, so two
configurations within a percent or two of each other cannot be ranked from one trial each.
Here:

* **Configurations, not trials.** Trials are grouped by the canonical form of their
  configuration (:meth:`dse.space.searchspace.SearchSpace.canonical`: a knob that does nothing in
  that
  layout is at its baseline), so configurations identical in effect count as one and their
  trials (repeats, re-measures) are pooled.
* **A trial's interval** of its step time comes from its stored per-step times (the
  steps after ``metrics["measurement"]["warmup_steps"]``, else ``semantics.warmup_steps``),
  on the log scale (:func:`log_step_interval`): a step farther than
  :data:`dse.core.measure.SPIKE_K` normalised MADs from the median of the measured steps is a
  spike (a late compilation, a host stall) and left out, so that one slow step among 3-4
  does not widen the interval; then the 95 % Student-t interval of the mean log step time,
  widened to contain the trial's reported figure. TFLOP/s and tokens/s per GPU follow from
  it as one over the step time (a step's work is fixed): every bound is above zero. With one
  measured step there is no interval from the steps (two give a wide one). A trial without
  per-step times keeps the interval it measured (``tflops_per_gpu_ci`` /
  ``step_time_ci_s``) when its bounds are above zero.
* **A configuration's estimate** is the mean of its trials' figures; its interval is on the
  log scale too, ``mean * exp(-+h)``: ``h`` the larger of the within-run part
  (``sqrt(sum h_i^2) / k``, ``h_i`` the trials' log half-widths) and the run-to-run part
  (``t * rel_sd / sqrt(k)``), where ``rel_sd`` is the study's relative run-to-run standard
  deviation pooled over every configuration measured more than once (unknown until one is).
  A large spread widens the intervals (a tie may then be the honest answer), but no
  throughput bound reaches zero.
* **The best** is the configuration with the best pooled objective; every configuration whose
  interval overlaps the best's is **tied within noise** with it. The study loop re-measures
  tied configurations (``budget.remeasure`` trials, :func:`remeasure_plan`) before it names a
  best; ``dse best`` and ``GET .../best`` report the figures with their intervals and the
  tie, instead of flipping between the tied configurations.

Pure functions over trial records, plus :func:`study_best`, which reads the candidates from a
storage (any object with ``best_candidates``, like :mod:`dse.results.export`).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dse.core.measure import spikes
from dse.core.records import METRIC_DIRECTION, ConfigStats, Direction, Metric, TrialRecord, finite
from dse.space.searchspace import SearchSpace, params_key

__all__ = [
    "INTERVAL_FIGURES",
    "CANDIDATES",
    "STEPS_BELOW",
    "MAX_READ",
    "Figure",
    "ConfigEstimate",
    "NoisyBest",
    "IntervalSource",
    "t_quantile",
    "log_step_interval",
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
#: Where a configuration's interval came from: ``measured`` (the trials' own intervals),
#: ``steps`` (derived from the stored per-step figures), ``repeats`` (run-to-run spread only),
#: ``none`` (no interval: one number).
IntervalSource = Literal["measured", "steps", "repeats", "none"]
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
        rel_sd: the study's relative run-to-run standard deviation of the objective (None
            until a configuration ran twice).
    """

    best: ConfigEstimate
    tied: tuple[ConfigEstimate, ...] = ()
    ranking: tuple[ConfigEstimate, ...] = ()
    rel_sd: float | None = None
    metric: str = "tflops_per_gpu"
    direction: Direction = "maximize"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        """``tied within noise: trial A and trial B`` when there is a tie, else ``""``."""
        if not self.tied:
            return ""
        names = [f"trial {c.number}" for c in (self.best, *self.tied)]
        return "tied within noise: " + ", ".join(names[:-1]) + " and " + names[-1]


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
    :data:`dse.core.measure.SPIKE_K` normalised MADs from their median are left out (the Hampel
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
    return out


def _groups_of_stats(space: SearchSpace, stats: Sequence[ConfigStats]) -> dict[str, _Group]:
    out: dict[str, _Group] = {}
    for c in sorted(stats, key=lambda c: c.first_number):
        key = params_key(space.canonical(c.params))
        g = out.setdefault(key, _Group(key, c.first_number, dict(c.params), c.params_key, set()))
        g.merge(c.n, c.mean, c.m2, c.first_number, c.params, c.params_key)
    return out


def _rel_sd(groups: Iterable[_Group]) -> tuple[float, int] | None:
    """(relative run-to-run standard deviation of the objective, pooled over the
    configurations measured more than once; its degrees of freedom), or None."""
    ss, dof = 0.0, 0
    for g in groups:
        if g.n < 2 or g.mean == 0:
            continue
        ss += g.m2 / (g.mean * g.mean)
        dof += g.n - 1
    if dof == 0:
        return None
    return math.sqrt(ss / dof), dof


def _pool(values: Sequence[float], cis: Sequence[tuple[float, float]],
          rel: tuple[float, int] | None, n: int | None = None,
          mean: float | None = None) -> Figure:  # fmt: skip
    """A pooled figure: the mean (``mean`` of ``n`` when given, else of ``values``), and its
    interval on the log scale: the half-width (of the log) is the larger of the within-run
    part (``sqrt(sum h_i^2) / k``, ``h_i`` the trials' log half-widths) and the run-to-run
    part (``t * rel_sd / sqrt(n)``); the bounds are ``mean * exp(-+h)``, above zero. A mean
    at or below zero (not a throughput) pools its half-widths on the linear scale."""
    k = n if n is not None else len(values)
    m = mean if mean is not None else statistics.fmean(values)
    between = None
    if rel is not None:
        sd, dof = rel
        between = t_quantile(0.975, dof) * sd / math.sqrt(k)
    if m <= 0 or any(lo <= 0 for lo, _ in cis):  # linear (relative run-to-run part)
        halves = [(hi - lo) / 2 for lo, hi in cis]
        parts = [math.sqrt(sum(h * h for h in halves)) / len(halves)] if halves else []
        if between is not None:
            parts.append(between * abs(m))
        if not parts:
            return Figure(m)
        h = max(parts)
        return Figure(m, (m - h, m + h))
    logs = [(math.log(hi) - math.log(lo)) / 2 for lo, hi in cis]
    parts = [math.sqrt(sum(h * h for h in logs)) / len(logs)] if logs else []
    if between is not None:
        parts.append(between)
    if not parts:
        return Figure(m)
    h = max(parts)
    return Figure(m, (m * math.exp(-h), m * math.exp(h)))


def _estimate(
    space: SearchSpace, g: _Group, metric: str, rel: tuple[float, int] | None
) -> ConfigEstimate:
    per: dict[str, list[Figure]] = {}
    srcs: set[IntervalSource] = set()
    for t in g.trials:
        figs, src = trial_figures(space, t)
        obj = figs.get(metric)
        # the objective is the stored value (tokens/s derived, sim estimates ...)
        figs[metric] = Figure(float(t.value), obj.ci if obj is not None else None)  # type: ignore[arg-type]
        srcs.add(src)
        for name, f in figs.items():
            per.setdefault(name, []).append(f)
    figures: dict[str, Figure] = {}
    for name, fs in per.items():
        cis = [f.ci for f in fs if f.ci is not None]
        figures[name] = (
            Figure(statistics.fmean(f.value for f in fs))
            if name == "peak_mem_gib"
            else _pool([f.value for f in fs], cis, rel)
        )
    # the objective over every trial of the configuration (read or aggregated)
    obj_cis = [f.ci for f in per.get(metric, []) if f.ci is not None]
    objective = _pool([], obj_cis if g.read_all else [], rel, n=g.n, mean=g.mean)
    figures[metric] = objective
    source: IntervalSource = (
        "measured" if "measured" in srcs else "steps" if "steps" in srcs and g.read_all
        else "none"
    )  # fmt: skip
    if source == "none" and objective.ci is not None:
        source = "repeats"
    first = g.trials[0] if g.trials and g.trials[0].number == g.number else None
    return ConfigEstimate(
        key=g.key, number=g.number, params=g.params, params_key=g.params_key, n=g.n,
        trials=tuple(t.number for t in g.trials) or (g.number,), trial=first,
        figures=figures, objective=objective, source=source,
    )  # fmt: skip


def _ranked(
    space: SearchSpace, groups: Iterable[_Group], metric: str, direction: Direction
) -> tuple[list[ConfigEstimate], tuple[float, int] | None]:
    gs = list(groups)
    rel = _rel_sd(gs)
    out = [_estimate(space, g, metric, rel) for g in gs]
    sign = -1.0 if direction == "maximize" else 1.0
    out.sort(key=lambda c: (sign * c.objective.value, c.number))
    return out, rel


def rank_configurations(
    space: SearchSpace, trials: Sequence[TrialRecord], *, metric: str, direction: Direction
) -> tuple[list[ConfigEstimate], float | None]:
    """Every configuration of the complete ``trials`` with a value, pooled and ranked best
    first (ties: the lower trial number), and the study's relative run-to-run standard
    deviation of the objective (None while no configuration ran twice)."""
    ranking, rel = _ranked(space, _groups_of_trials(space, trials).values(), metric, direction)
    return ranking, None if rel is None else rel[0]


def _best_of(ranking: Sequence[ConfigEstimate], rel: tuple[float, int] | None, metric: str,
             direction: Direction) -> NoisyBest | None:  # fmt: skip
    if not ranking:
        return None
    best = ranking[0]
    tied = tuple(c for c in ranking[1:] if c.overlaps(best))
    return NoisyBest(
        best, tied, tuple(ranking), None if rel is None else rel[0], metric, direction
    )


def noisy_best(
    space: SearchSpace, trials: Sequence[TrialRecord], *, metric: str, direction: Direction
) -> NoisyBest | None:
    """The best configuration of ``trials`` and those tied with it within noise (None: no
    complete trial with a value)."""
    ranking, rel = _ranked(space, _groups_of_trials(space, trials).values(), metric, direction)
    return _best_of(ranking, rel, metric, direction)


def remeasure_plan(nb: NoisyBest, n: int) -> list[ConfigEstimate]:
    """Up to ``n`` configurations to run once more each, so a tie resolves: the best and the
    configurations tied with it, those with the fewest trials first (then by rank); a
    configuration may come twice when ``n`` exceeds them. Empty when nothing is tied."""
    if not nb.tied or n <= 0:
        return []
    cands = [nb.best, *nb.tied]
    counts = {c.key: c.n for c in cands}
    rank = {c.key: i for i, c in enumerate(cands)}
    out: list[ConfigEstimate] = []
    for _ in range(n):
        c = min(cands, key=lambda c: (counts[c.key], rank[c.key]))
        out.append(c)
        counts[c.key] += 1
    return out


def study_best(
    storage: Any,
    study: Any,
    space: SearchSpace,
    *,
    value_range: tuple[float, float] | None = None,
) -> NoisyBest | None:
    """The noise-aware best of a stored study (``study``: its record; ``space``: its
    effective space, :func:`dse.results.run_settings.effective_space`). None: no complete trial.

    The candidates are the configurations of the :data:`CANDIDATES` best trials by value
    (numerics-changed trials left out unless the space allows them), each objective pooled
    over all its trials from storage aggregates. Trials are read (with their per-step
    figures) for configurations measured fewer than :data:`STEPS_BELOW` times, and for the
    best (at most :data:`MAX_READ` of its trials, without steps), so a study of 100,000
    trials costs a few index walks.
    """
    excl = exclude_changed(space)
    stats = storage.best_configurations(
        study.id, study.direction, limit=CANDIDATES, value_range=value_range,
        exclude_changed=excl,
    )  # fmt: skip
    groups = _groups_of_stats(space, stats)
    metric = study.metric
    direction: Direction = (
        study.direction if study.direction in ("maximize", "minimize")
        else METRIC_DIRECTION.get(metric, "maximize")
    )  # fmt: skip

    def read(gs: Sequence[_Group], steps: bool) -> None:
        """Read the eligible trials of ``gs`` (the first MAX_READ of each)."""
        keys = sorted({k for g in gs for k in g.stored_keys})
        if not keys:
            return
        got: list[TrialRecord] = []
        for t in storage.trials_of_configurations(
            study.id, keys, state="complete", with_steps=steps
        ):
            if not _eligible(t) or (excl and t.numerics == "changed"):
                continue
            v = float(t.value)  # type: ignore[arg-type]
            if value_range is None or value_range[0] < v <= value_range[1]:
                got.append(t)
        for g in gs:
            g.trials = [t for t in got if t.params_key in g.stored_keys][:MAX_READ]

    # configurations measured once or twice: their trials and per-step figures (intervals)
    read([g for g in groups.values() if g.n < STEPS_BELOW], steps=True)
    ranking, rel = _ranked(space, groups.values(), metric, direction)
    nb = _best_of(ranking, rel, metric, direction)
    if nb is None or groups[nb.best.key].trials:
        return nb
    # the best measured more often: its other figures from up to MAX_READ of its trials (its
    # objective and the ties come from the aggregates)
    read([groups[nb.best.key]], steps=False)
    ranking, rel = _ranked(space, groups.values(), metric, direction)
    return _best_of(ranking, rel, metric, direction)
