"""The statistics of dse.stats.measure on synthetic step-time series with a known mean: the t
quantile, MSER warm-up detection, the coverage of the interval, the stopping rule and the
dominance test. Seeded generators (numpy) and Hypothesis; no timing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dse.stats.measure import (
    MIN_MEASURED,
    TRIM,
    MeasurementSpec,
    PruneTarget,
    StepSeries,
    location_interval,
    mean_interval,
    metric_interval,
    mser_truncation,
    prune_target,
    spikes,
    t_quantile,
)

ADAPTIVE = MeasurementSpec(mode="adaptive", min_steps=10, max_steps=100, rel_halfwidth=0.01)


def series(
    rng: np.random.Generator,
    n: int,
    *,
    mean: float = 1.0,
    cv: float = 0.01,
    phi: float = 0.0,
    head: tuple[float, ...] = (),
) -> list[float]:
    """Step times: ``mean * (1 + head[i]) * (1 + e_i)``, ``e`` AR(1) with lag-1 correlation
    ``phi`` and standard deviation ``cv``."""
    e = np.empty(n)
    e[0] = rng.normal(0, cv)
    inn = rng.normal(0, cv * math.sqrt(1 - phi * phi), n)
    for i in range(1, n):
        e[i] = phi * e[i - 1] + inn[i]
    h = np.zeros(n)
    h[: len(head)] = head[:n]
    return list(mean * (1 + h) * (1 + e))


def spiky(
    rng: np.random.Generator,
    n: int,
    *,
    cv: float,
    head: tuple[float, ...] = (5.0, 1.0, 0.3, 0.1),
    within: int = 20,
    most: int = 3,
) -> tuple[list[float], list[int]]:
    """A series with a slow head, ``cv`` Gaussian jitter and 1 to ``most`` spikes of 5-50x at
    random positions among the ``within`` steps after the head (where a stop is decided);
    (the series, the spikes' positions)."""
    x = series(rng, n, cv=cv, head=head)
    k = int(rng.integers(1, most + 1))
    at = sorted(int(i) for i in rng.choice(np.arange(len(head), len(head) + within), k, False))
    for i in at:
        x[i] *= float(rng.uniform(5.0, 50.0))
    return x, at


def run(spec: MeasurementSpec, xs: list[float], **kw) -> StepSeries:
    s = StepSeries(spec, steps=6, warmup_steps=2, **kw)
    for x in xs:
        if s.add(x) is not None:
            break
    return s


# --- the t quantile --------------------------------------------------------------------------


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95, 0.99, 0.999])
def test_t_quantile_is_students(confidence: float) -> None:
    for df in [*range(1, 61), 100, 999, 1000, 5000, 10_000, 10_001, 50_000]:
        want = stats.t.ppf(0.5 + confidence / 2, df)
        assert t_quantile(confidence, df) == pytest.approx(want, rel=1e-6), df


def test_t_quantile_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="confidence"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.95, 0)


# --- warm-up ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        (9.0,),  # one step 10x slower (allocation)
        (20.0, 1.0),  # JIT compile: steps 0-1 huge
        (4.0, 2.0, 1.0, 0.5, 0.25, 0.12, 0.06),  # a slow head decaying over several steps
    ],
)
def test_mser_finds_the_end_of_a_slow_head(head: tuple[float, ...]) -> None:
    rng = np.random.default_rng(7)
    # the last step of the head that is still slower than the noise (cv 1%)
    slow = max(i for i, h in enumerate(head) if h > 0.03) + 1
    found, unsettled = [], 0
    for _ in range(200):
        d, settled = mser_truncation(series(rng, 30, head=head))
        unsettled += not settled
        found.append(d)
    assert unsettled <= 4
    assert min(found) >= slow - 1  # never keeps more than one slow step
    assert np.median(found) <= slow + 2  # and throws away little of the steady state


def test_mser_on_a_flat_series_truncates_little() -> None:
    rng = np.random.default_rng(8)
    ds = [mser_truncation(series(rng, 30))[0] for _ in range(300)]
    assert np.median(ds) == 0 and np.mean([d <= 3 for d in ds]) >= 0.9


def test_mser_says_when_a_series_is_still_settling() -> None:
    # still falling at the end: the minimum lies at the edge of the first half
    d, settled = mser_truncation([10.0 - i for i in range(8)])
    assert (d, settled) == (4, False)
    assert mser_truncation([1.0, 2.0]) == (0, False)  # too short to tell


def test_spikes_are_the_hampel_identifier() -> None:
    x = [1.0, 1.01, 0.99, 1.0, 10.0, 1.02, 0.98, 0.2]
    # median 1.0, MAD 0.01: 5 normalised MADs = 0.074
    assert spikes(x) == [4, 7]
    assert spikes([1.0, 1.1], reference=[1.0, 1.01, 0.99]) == [1]  # another reference
    assert spikes([1.0] * 5) == [] and spikes([]) == []
    assert spikes([1.0, 1.0, 1.0, 1.0001]) == [3]  # identical steps: any other one stands out


def test_mser_does_not_cut_at_a_slow_step_in_the_steady_state() -> None:
    """A 5-50x step in the first half after the warm-up (a late compilation, a host stall):
    MSER on the raw series throws away every step before it (or, just before the half, calls
    the series unsettled); with the spikes after the leading run set aside it does not."""
    rng = np.random.default_rng(9)
    found, unsettled, raw_cut = [], 0, 0
    for _ in range(300):
        x, at = spiky(rng, 40, cv=0.01, head=(9.0,), within=18, most=2)
        d, settled = mser_truncation(x)
        unsettled += not settled
        found.append(d)
        # what the rule did before: MSER on the raw series
        scores = [np.var(x[j:]) * (40 - j) / (40 - j) ** 2 for j in range(21)]
        raw_cut += int(np.argmin(scores)) > at[0]
    assert unsettled == 0
    assert min(found) >= 1 and np.median(found) == 1  # the 10x first step only
    assert raw_cut / 300 > 0.9  # without it nearly every series lost its steps up to a spike


# --- the interval ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phi", "n", "least"),
    [
        (0.0, 8, 0.93),
        (0.0, 20, 0.93),
        (0.0, 64, 0.93),
        (0.3, 16, 0.90),  # autocorrelated: the effective sample size keeps coverage
        (0.3, 64, 0.92),
        (0.5, 64, 0.90),
    ],
)
def test_interval_covers_the_known_mean(phi: float, n: int, least: float) -> None:
    rng = np.random.default_rng(11)
    reps = 1500
    hits = 0
    for _ in range(reps):
        iv = mean_interval(series(rng, n, mean=2.0, cv=0.02, phi=phi), 0.95)
        assert iv is not None
        hits += iv.lo <= 2.0 <= iv.hi
    assert least <= hits / reps <= 0.995


def test_plain_t_interval_would_undercover_autocorrelated_steps() -> None:
    """What the correction is for: the textbook t-interval on AR(1) steps covers far less."""
    rng = np.random.default_rng(12)
    naive = corrected = 0
    for _ in range(1000):
        x = series(rng, 64, phi=0.5)
        m, s = float(np.mean(x)), float(np.std(x, ddof=1))
        hw = t_quantile(0.95, 63) * s / 8
        naive += m - hw <= 1.0 <= m + hw
        iv = mean_interval(x)
        assert iv is not None
        corrected += iv.lo <= 1.0 <= iv.hi
    assert naive / 1000 < 0.85 < corrected / 1000


@pytest.mark.parametrize(
    ("phi", "n", "least"),
    [(0.0, 10, 0.93), (0.0, 20, 0.93), (0.0, 64, 0.93), (0.3, 16, 0.90), (0.5, 64, 0.90)],
)
def test_trimmed_interval_covers_the_known_location(phi: float, n: int, least: float) -> None:
    """The 10% trimmed mean's interval (Tukey-McLaughlin, with the AR(1) and batch-means
    corrections on the winsorized steps) covers the centre of symmetric noise as the mean's
    interval covers the mean."""
    rng = np.random.default_rng(13)
    reps = 1500
    hits = 0
    for _ in range(reps):
        iv = location_interval(series(rng, n, mean=2.0, cv=0.02, phi=phi), 0.95)
        assert iv is not None and iv.trim == (TRIM if n >= 10 else 0.0)
        hits += iv.lo <= 2.0 <= iv.hi
    assert least <= hits / reps <= 0.995


@pytest.mark.parametrize("n", [10, 19, 20, 33, 64])
def test_trimmed_interval_is_yuens_as_in_scipy(n: int) -> None:
    """Without autocorrelation (the steps in an order whose lag-1 correlation is negative:
    the effective sample size is n) the location is SciPy's trimmed mean and the half-width
    Student's t on h - 1 degrees of freedom times Yuen's standard error, read off SciPy's
    Yuen test (``ttest_ind(trim=)``) of the steps against themselves less 1: its statistic
    is then 1 / (sqrt(2) x the standard error)."""
    rng = np.random.default_rng(n)
    xs = sorted(1.0 + 0.02 * rng.standard_normal(n))
    alternating = [xs[i // 2] if i % 2 == 0 else xs[-1 - i // 2] for i in range(n)]
    iv = location_interval(alternating, 0.95, TRIM)
    assert iv is not None and iv.method == "t"
    tm = float(stats.trim_mean(alternating, TRIM))
    yuen = stats.ttest_ind(alternating, [v - 1.0 for v in alternating], trim=TRIM)
    h = n - 2 * int(TRIM * n)
    assert iv.mean == pytest.approx(tm, rel=1e-12)
    se = 1.0 / (math.sqrt(2.0) * float(yuen.statistic))
    assert iv.halfwidth == pytest.approx(stats.t.ppf(0.975, h - 1) * se, rel=1e-6)


def test_trimmed_interval_is_not_widened_by_a_few_spikes() -> None:
    rng = np.random.default_rng(14)
    x = series(rng, 30, cv=0.01)
    x[7] *= 20.0
    x[19] *= 8.0
    trimmed, mean = location_interval(x), mean_interval(x)
    assert trimmed is not None and mean is not None
    assert trimmed.rel_halfwidth < 0.01 < 0.1 < mean.rel_halfwidth
    assert trimmed.lo <= 1.0 <= trimmed.hi and mean.mean > 1.5
    assert location_interval(x, trim=0.0) == mean  # no trimming: the mean's interval
    with pytest.raises(ValueError, match="trim"):
        location_interval(x, trim=0.5)


def test_interval_needs_two_points() -> None:
    assert mean_interval([1.0]) is None
    iv = mean_interval([1.0, 1.0, 1.0])
    assert iv is not None and iv.lo == iv.hi == 1.0 and iv.rel_halfwidth == 0


# --- the stopping rule -----------------------------------------------------------------------


@pytest.mark.parametrize(("phi", "least"), [(0.0, 0.90), (0.3, 0.80)])
def test_adaptive_stop_covers_the_steady_state_mean(phi: float, least: float) -> None:
    """Stopping when the interval is first narrow enough (a sequential rule) still covers
    the steady-state mean of series with a slow head (the figures of docs/BENCHMARKS.md)."""
    rng = np.random.default_rng(21)
    hits, lengths = 0, []
    for _ in range(600):
        s = run(ADAPTIVE, series(rng, 100, cv=0.01, phi=phi, head=(5.0, 1.0, 0.3, 0.1)))
        r = s.result()
        assert r.stop_reason == "converged" and r.step_time_ci_s is not None
        assert ADAPTIVE.min_steps <= len(s.times) <= ADAPTIVE.max_steps
        assert r.warmup_steps >= 2  # the 6x and 2x steps never count
        assert (r.step_time_ci_s[1] - r.step_time_ci_s[0]) / 2 <= 0.01 * r.step_time_s
        hits += r.step_time_ci_s[0] <= 1.0 <= r.step_time_ci_s[1]
        lengths.append(len(s.times))
    assert hits / 600 >= least
    assert np.median(lengths) <= 16  # ~1% noise: a handful of steps past the warm-up


@pytest.mark.parametrize(("cv", "longest"), [(0.01, 16), (0.02, 35)])
def test_adaptive_stop_with_rare_spikes(cv: float, longest: float) -> None:
    """1-3 steps of 5-50x at random positions among the 20 steps after a slow head, 1% or
    2% jitter, +-1% asked, at most 50 steps (the H200 run of docs/BENCHMARKS.md 17): the rule
    converges well before 50 steps and its interval still covers the steady-state location
    (the centre of the jitter) in at least 90% of runs. The mean's interval over the same
    steps would be far wider than +-1% whenever a spike is among them."""
    rng = np.random.default_rng(23)
    spec = MeasurementSpec(mode="adaptive", min_steps=10, max_steps=50, rel_halfwidth=0.01)
    reps = 500
    hits, lengths, converged, counted, mean_wide = 0, [], 0, [], []
    for _ in range(reps):
        x, at = spiky(rng, 50, cv=cv)
        s = run(spec, x)
        r = s.result()
        converged += r.stop_reason == "converged"
        assert r.step_time_ci_s is not None
        hits += r.step_time_ci_s[0] <= 1.0 <= r.step_time_ci_s[1]
        lengths.append(len(s.times))
        inside = [i for i in at if r.warmup_steps <= i < len(s.times)]
        counted.append(r.spikes >= len(inside))
        if inside:
            iv = mean_interval(s.times[r.warmup_steps :])
            assert iv is not None
            mean_wide.append(iv.rel_halfwidth > 0.05)
    assert converged / reps >= 0.97
    assert np.median(lengths) <= longest  # far fewer than the 50 of a fixed window
    assert hits / reps >= 0.90
    assert np.mean(counted) >= 0.99  # the spikes measured are counted in the record
    assert len(mean_wide) > reps / 2 and all(mean_wide)


def test_noisy_steps_run_to_max_steps() -> None:
    rng = np.random.default_rng(22)
    spec = MeasurementSpec(mode="adaptive", min_steps=10, max_steps=30, rel_halfwidth=0.01)
    s = run(spec, series(rng, 100, cv=0.2))
    r = s.result()
    assert r.stop_reason == "max_steps" and len(s.times) == 30
    assert r.warmup_steps + r.measured_steps == 30


def test_no_stop_before_min_steps_even_when_flat() -> None:
    spec = MeasurementSpec(mode="adaptive", min_steps=12, max_steps=40)
    s = StepSeries(spec, steps=6, warmup_steps=2)
    reasons = [s.add(1.0) for _ in range(12)]
    assert reasons[:11] == [None] * 11 and reasons[11] == "converged"
    assert s.add(5.0) == "converged" and len(s.times) == 12  # a stopped series takes no more


def test_fixed_mode_times_the_semantics_window() -> None:
    spec = MeasurementSpec()  # fixed
    s = StepSeries(spec, steps=6, warmup_steps=2)
    xs = [5.0, 2.0, 1.0, 1.1, 0.9, 1.2]
    reasons = [s.add(x, 100.0 / x) for x in xs]
    assert reasons == [None] * 5 + ["fixed"]
    r = s.result()
    assert r.mode == "fixed" and r.warmup_steps == 2 and r.measured_steps == 4
    assert r.step_time_s == pytest.approx(1.05)  # the median of the window, as before
    assert r.tflops_per_gpu == pytest.approx(float(np.median([100 / x for x in xs[2:]])))
    assert r.step_time_ci_s is not None and r.tflops_per_gpu_ci is not None
    lo, hi = r.step_time_ci_s
    assert lo <= 1.05 <= hi and lo < 1.05 < hi  # the (trimmed) mean's interval, with the median
    assert r.tflops_per_gpu_ci[0] <= r.tflops_per_gpu <= r.tflops_per_gpu_ci[1]
    f = r.fields()
    # 4 steps: floor(0.1 * 4) = 0 trimmed, the mean's interval
    assert f["measurement"] == {
        "mode": "fixed", "warmup_steps": 2, "measured_steps": 4, "stop_reason": "fixed",
        "confidence": 0.95, "interval": "t", "trim": 0.0, "spikes": 0,
    }  # fmt: skip
    assert f["step_time_ci_s"] == [lo, hi]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.01, 100.0), min_size=1, max_size=60),
    st.sampled_from(["adaptive", "fixed"]),
)
def test_recorded_figures_are_consistent(xs: list[float], mode: str) -> None:
    spec = MeasurementSpec(mode=mode, min_steps=5, max_steps=40)  # type: ignore[arg-type]
    s = StepSeries(spec, steps=8, warmup_steps=2)
    for x in xs:
        if s.add(x, 50.0 / x) is not None:
            break
    r = s.result()
    assert r.warmup_steps + r.measured_steps == len(s.times) or r.warmup_steps == 0
    assert 1 <= r.measured_steps <= len(s.times) <= s.limit
    if r.step_time_ci_s is not None:
        lo, hi = r.step_time_ci_s
        assert 0 <= lo <= r.step_time_s <= hi
    if r.step_time_ci_s is not None and r.step_time_ci_s[0] > 0:  # else TFLOP/s is unbounded
        assert r.tflops_per_gpu_ci is not None and r.tflops_per_gpu is not None
        assert r.tflops_per_gpu_ci[0] <= r.tflops_per_gpu * (1 + 1e-9)
        assert r.tflops_per_gpu * (1 - 1e-9) <= r.tflops_per_gpu_ci[1]
    if mode == "adaptive" and r.stop_reason == "converged":
        assert len(s.times) >= spec.min_steps and r.measured_steps >= MIN_MEASURED


# --- dominance -------------------------------------------------------------------------------


def target(best: float, bound: float, margin: float = 0.05) -> PruneTarget:
    return PruneTarget(
        metric="tflops_per_gpu", direction="maximize", best=best, bound=bound, margin=margin,
        best_trial=3,
    )  # fmt: skip


def test_a_clearly_slower_trial_is_dominated_after_min_steps() -> None:
    rng = np.random.default_rng(31)
    # 100 TFLOP/s at step time 1.0 s; the best's lower bound 130: clearly better
    xs = series(rng, 100, cv=0.02, head=(3.0, 0.5))
    s = StepSeries(ADAPTIVE, steps=6, warmup_steps=2, prune=target(135.0, 130.0))
    for x in xs:
        if s.add(x, 100.0 / x) is not None:
            break
    r = s.result()
    assert r.stop_reason == "dominated" and len(s.times) == ADAPTIVE.min_steps
    assert r.dominated_by is not None and r.dominated_by["trial"] == 3
    assert r.fields()["measurement"]["dominated_by"]["threshold"] == pytest.approx(123.5)
    assert r.tflops_per_gpu == pytest.approx(100.0, rel=0.03)  # its figures are kept


def test_a_trial_within_noise_of_the_best_is_never_dominated() -> None:
    """A configuration as fast as the best (its interval overlaps) runs to its own stop,
    whatever the noise: pruning must not cost the search a contender."""
    rng = np.random.default_rng(32)
    for _ in range(300):
        xs = series(rng, 100, cv=0.02, phi=0.3, head=(3.0, 0.5))
        s = StepSeries(ADAPTIVE, steps=6, warmup_steps=2, prune=target(100.0, 99.0))
        for x in xs:
            if s.add(x, 100.0 / x) is not None:
                break
        assert s.stop_reason != "dominated"


def test_no_dominance_while_warm_up_is_not_over() -> None:
    # still getting faster (a trend): the estimate is pessimistic, so no verdict yet
    spec = MeasurementSpec(mode="adaptive", min_steps=5, max_steps=12, rel_halfwidth=1e-6)
    s = StepSeries(spec, steps=6, warmup_steps=2, prune=target(1000.0, 1000.0))
    for i in range(12):
        t = 10.0 - 0.8 * i
        assert s.add(t, 100.0 / t) != "dominated" or i >= 11


def test_fixed_mode_prunes_after_warm_up_and_a_few_steps() -> None:
    s = StepSeries(MeasurementSpec(prune=True), steps=20, warmup_steps=2, prune=target(50, 45))
    reasons = [s.add(1.0 + 0.001 * (i % 2), 10.0) for i in range(20)]
    assert reasons.index("dominated") == 2 + MIN_MEASURED - 1


def test_step_time_and_tokens_objectives() -> None:
    slow = PruneTarget(metric="step_time_s", direction="minimize", best=1.0, bound=1.02)
    assert slow.threshold == pytest.approx(1.071)
    assert slow.dominates(1.2, 1.3) and not slow.dominates(1.05, 1.3)
    s = StepSeries(
        MeasurementSpec(mode="adaptive", min_steps=5, max_steps=50),
        steps=6, warmup_steps=2,
        prune=PruneTarget(metric="tokens_per_s_per_gpu", direction="maximize", best=2000,
                          bound=1900),
        tokens_per_step_per_gpu=1000.0,
    )  # fmt: skip
    # 1000 tokens per step at ~1 s: ~1000 tokens/s, far below 1900
    reasons = [s.add(1.0 + 0.002 * (i % 3)) for i in range(5)]
    assert reasons[-1] == "dominated"


def test_prune_target_takes_the_bests_interval_bound() -> None:
    m = {
        "tflops_per_gpu": 400.0,
        "tflops_per_gpu_ci": [390.0, 410.0],
        "step_time_s": 0.5,
        "step_time_ci_s": [0.49, 0.51],
        "tokens_per_s_per_gpu": 8000.0,
    }
    t = prune_target("tflops_per_gpu", "maximize", best_value=400.0, best_metrics=m, margin=0.1)
    assert t is not None and t.bound == 390.0 and t.threshold == pytest.approx(351.0)
    t = prune_target("step_time_s", "minimize", best_value=0.5, best_metrics=m, margin=0.0)
    assert t is not None and t.bound == 0.51
    lo, hi = metric_interval("tokens_per_s_per_gpu", m) or (0, 0)
    assert lo == pytest.approx(8000 * 0.5 / 0.51) and hi == pytest.approx(8000 * 0.5 / 0.49)
    # no interval recorded (an older trial): its value is the bound
    t = prune_target("tflops_per_gpu", "maximize", best_value=400.0, best_metrics={}, margin=0)
    assert t is not None and t.bound == 400.0
    mem = prune_target("peak_mem_gib", "minimize", best_value=40, best_metrics={}, margin=0)
    assert mem is None  # not a throughput figure
    no_best = prune_target("tflops_per_gpu", "maximize", best_value=None, best_metrics=m, margin=0)
    assert no_best is None


def test_measurement_section_checks_its_bounds() -> None:
    with pytest.raises(ValueError, match=r"min_steps \(50\) must not exceed max_steps \(20\)"):
        MeasurementSpec(mode="adaptive", min_steps=50, max_steps=20)
    assert MeasurementSpec(mode="adaptive").steps(6) == 100 and MeasurementSpec().steps(6) == 6
    assert set(MeasurementSpec().identity()) == {
        "mode", "min_steps", "max_steps", "rel_halfwidth", "confidence",
    }  # fmt: skip


def test_the_cpu_clock_is_identity_only_when_set_and_only_on_cpu() -> None:
    from dse.core.exceptions import SpaceError
    from dse.space.searchspace import load_space, parse_space
    from tests.conftest import EXAMPLES

    assert MeasurementSpec(clock="cpu").identity()["clock"] == "cpu"
    space = load_space(EXAMPLES / "tiny_gpt_cpu.yaml")
    data = space.model_dump(mode="json", exclude_none=True)
    adaptive = parse_space({**data, "measurement": {"mode": "adaptive"}})
    # a stored adaptive study keeps its hash: the wall clock (the default) is not counted
    assert "clock" not in adaptive.identity()["measurement"]
    assert '"clock"' not in adaptive.model_dump_json(exclude={"measurement": {"clock"}})
    cpu = parse_space({**data, "measurement": {"clock": "cpu"}})
    assert cpu.identity()["measurement"]["clock"] == "cpu"
    assert cpu.identity_digest() != space.identity_digest() and cpu.digest() != space.digest()
    gpu = {**data, "resources": {**data["resources"], "device": "cuda"}}
    with pytest.raises(SpaceError, match=r"measurement.clock cpu .* on device cuda"):
        parse_space({**gpu, "measurement": {"clock": "cpu"}})
