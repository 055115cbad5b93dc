"""Decisions that reproduce (issue 35): one noise model, from a step to the answer.

A configuration measured once carries the run-to-run spread (the prior until the study
re-measures), so a lucky run makes no tie-breaker; one slow step is a spike, so it neither
creates nor breaks a tie; one lucky run widens the study's run-to-run spread instead of
shrinking an interval; deterministic runs (the sim's estimates) carry an error band and are
never re-measured; a tie names the re-measure budget that would split it."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from dse.core.records import StepMetrics, TrialRecord
from dse.results.noise import (
    ESTIMATE_BAND,
    PRIOR_DOF,
    PRIOR_REL_SD,
    NoisyBest,
    noisy_best,
    remeasure_plan,
    t_quantile,
)
from dse.space.searchspace import params_key
from tests.results.test_noise import SPACE

WORK = 50.0  # TFLOP per step and GPU


def run(number: int, mbs: int, step_s: float, *, slow: float | None = None, seed: int = 0,
        source: str = "measured", **metrics: Any) -> TrialRecord:  # fmt: skip
    """A run of MBS ``mbs``: 2 warm-up steps, then 8 steps of about ``step_s`` (+-0.3 %), the
    fourth ``slow`` s when given; its figures are the median step's (as a fixed-mode trial
    records them)."""
    rng = random.Random(seed * 1000 + number)
    times = [step_s * (1 + rng.gauss(0, 0.003)) for _ in range(8)]
    if slow is not None:
        times[3] = slow
    st = sorted(times)[4]
    steps = tuple(StepMetrics(i, t, WORK / t, 20.0, 22.0, 7.0)
                  for i, t in enumerate([3 * step_s, 2 * step_s, *times]))  # fmt: skip
    p = {"micro_batch_size": mbs, "use_distributed_optimizer": False}
    m = {"tflops_per_gpu": WORK / st, "step_time_s": st, "peak_mem_gib": 20.0, **metrics}
    return TrialRecord(number, 1, number, "complete", p, params_key(p), m, WORK / st,
                       steps=steps, source=source)  # type: ignore[arg-type]  # fmt: skip


def best_of(trials: list[TrialRecord]) -> NoisyBest:
    nb = noisy_best(SPACE, trials, metric="tflops_per_gpu", direction="maximize")
    assert nb is not None
    return nb


def tie(nb: NoisyBest) -> tuple[int, set[int]]:
    return nb.best.number, {c.number for c in nb.tied}


def test_a_configuration_measured_once_carries_the_run_to_run_prior() -> None:
    """Two runs 4 % apart, each with tight steps (+-0.3 %): their steps alone say 'not tied';
    run to run an H200 may spread that much, so they are tied until re-measured."""
    a, b = run(0, 1, 0.500), run(1, 2, 0.520)
    nb = best_of([a, b])
    assert tie(nb) == (0, {1})
    lo, hi = nb.best.objective.ci  # type: ignore[misc]
    h = t_quantile(0.975, PRIOR_DOF) * PRIOR_REL_SD["cuda"]  # the prior's half-width
    assert math.log(hi / nb.best.objective.value) == pytest.approx(h)
    assert math.log(nb.best.objective.value / lo) == pytest.approx(h)
    assert nb.model.basis == "prior" and nb.best.source == "steps"
    # ... and the answer says the re-measure budget that would split them
    assert nb.split is not None and nb.split > 0
    assert nb.message.endswith(f"a re-measure budget of {nb.split} would split them")
    assert nb.answer.startswith("tied set of 2: tied within noise: trial 0 and trial 1")
    # a configuration 30 % slower is not tied, measured once or not
    assert tie(best_of([a, b, run(2, 4, 0.650)])) == (0, {1})


@pytest.mark.parametrize("where", [0, 1, 2])
def test_one_slow_step_neither_creates_nor_breaks_a_tie(where: int) -> None:
    """The tie of a study (A and B within noise, C clearly slower, A re-measured) is the
    same whichever run has one step 10x slower than the others."""

    def study(slow_in: int | None) -> list[TrialRecord]:
        spec = [(0, 1, 0.500), (1, 2, 0.508), (2, 4, 0.640), (3, 1, 0.497), (4, 2, 0.505)]
        return [run(n, mbs, s, slow=5.0 if i == slow_in else None)
                for i, (n, mbs, s) in enumerate(spec)]  # fmt: skip

    clean = best_of(study(None))
    assert tie(clean) == (3 if clean.best.number == 3 else 0, {1})
    spiky = best_of(study(where))
    assert tie(spiky) == tie(clean)
    # the spike is left out of the run's own interval: it stays about as narrow
    for c, d in zip(clean.ranking, spiky.ranking, strict=True):
        assert c.objective.ci is not None and d.objective.ci is not None
        assert d.objective.ci[1] / d.objective.ci[0] < 1.02 * c.objective.ci[1] / c.objective.ci[0]


def test_one_lucky_run_neither_creates_nor_breaks_a_tie() -> None:
    """A (best) and B within noise, C 20 % slower; each re-measured. One lucky run of C (15 %
    faster than its others) does not tie it with A; one lucky run of A (10 % faster) does not
    separate A from B: a run far from its configuration's others widens the study's
    run-to-run spread, and with it every interval."""
    base = [run(0, 1, 0.500), run(1, 2, 0.505), run(2, 4, 0.625), run(3, 1, 0.498),
            run(4, 2, 0.503), run(5, 4, 0.620)]  # fmt: skip
    before = best_of(base)
    assert tie(before)[1] == {1} and before.model.dof == 3
    lucky_c = best_of([*base, run(6, 4, 0.625 / 1.15)])
    assert 2 not in tie(lucky_c)[1] and tie(lucky_c)[1] == {1}
    assert lucky_c.model.rel_sd > before.model.rel_sd  # the lucky run is evidence of noise
    lucky_a = best_of([*base, run(6, 1, 0.500 / 1.10)])
    assert tie(lucky_a) == (0, {1})


def test_the_prior_gives_way_to_re_measures_but_one_agreeing_pair_does_not_erase_it() -> None:
    """Two runs that happen to agree to 0.01 % are one degree of freedom against the prior's
    four: the intervals narrow a little, not to nothing."""
    a, b = run(0, 1, 0.500), run(1, 2, 0.510)
    twin = TrialRecord(2, 1, 2, "complete", a.params, a.params_key, dict(a.metrics),
                       a.value * 1.0001, steps=a.steps)  # fmt: skip
    nb = best_of([a, b, twin])
    assert nb.model.dof == 1 and nb.model.learned is not None and nb.model.learned < 1e-3
    assert nb.model.rel_sd > 0.8 * PRIOR_REL_SD["cuda"]


def test_estimates_carry_an_error_band_and_are_never_re_measured() -> None:
    """The sim: identical 249.4 estimates are not 'tied within noise ... re-measure to
    split' with an interval 249.4-249.4; their interval is the error band, labelled so."""
    a = run(0, 1, WORK / 249.4, source="estimate")
    b = run(1, 2, WORK / 249.4, source="estimate")
    for t in (a, b):  # the estimate's own figure, no step spread
        object.__setattr__(t, "value", 249.4)
        t.metrics["tflops_per_gpu"] = 249.4
    nb = best_of([a, b])
    lo, hi = nb.best.objective.ci  # type: ignore[misc]
    assert (lo, hi) == pytest.approx((249.4 / (1 + ESTIMATE_BAND), 249.4 * (1 + ESTIMATE_BAND)))
    assert nb.best.source == "estimate" and nb.deterministic and nb.split is None
    assert "error band" in nb.message and "tied within noise" not in nb.message
    assert remeasure_plan(nb, 5) == []
    # an estimate that states its own band is shown with it
    own = run(2, 4, WORK / 200.0, source="estimate", error_band=0.3)
    c = next(c for c in best_of([a, own]).ranking if c.number == 2)
    assert c.objective.ci == pytest.approx((c.objective.value / 1.3, c.objective.value * 1.3))


def test_no_practical_budget_splits_equal_configurations() -> None:
    a, b = run(0, 1, 0.500), run(1, 2, 0.5001)
    nb = best_of([a, b])
    assert nb.tied and nb.split is None
    assert nb.message.endswith("no practical re-measure budget splits them (equal within noise)")
    # beside one that a budget separates, the answer names both
    nb = best_of([a, b, run(2, 4, 0.520)])
    assert nb.split is not None and [c.number for c in nb.inseparable] == [1]
    assert nb.message.endswith(
        f"a re-measure budget of {nb.split} would split off trial 2; trial 1 is equal to the "
        "best within noise (no practical budget splits them)"
    )


def test_a_trials_recorded_step_interval_never_starts_at_zero() -> None:
    """Two measured steps of 0.82 and 1.28 s: Student's t on one degree of freedom reaches
    below zero; the recorded interval stays above it (it said '0-2.343 s')."""
    from dse.stats.measure import MeasurementSpec, StepSeries

    s = StepSeries(MeasurementSpec(), steps=3, warmup_steps=1)
    for t in (3.0, 0.82, 1.28):
        s.add(t, tflops_per_gpu=50.0 / t)
    got = s.result()
    assert got.step_time_ci_s is not None and got.tflops_per_gpu_ci is not None
    lo, hi = got.step_time_ci_s
    assert 0 < lo < 0.82 and hi > 1.28
    assert got.tflops_per_gpu_ci[0] > 0


def test_re_measures_go_where_they_can_change_the_answer() -> None:
    """The best and what a budget can split from it first; a configuration equal to the best
    within noise only when nothing else can be split."""
    a, eq, far = run(0, 1, 0.500), run(1, 2, 0.5001), run(2, 4, 0.520)
    nb = best_of([a, eq, far])
    assert [c.number for c in nb.inseparable] == [1]
    assert [c.number for c in remeasure_plan(nb, 3)] == [0, 2, 0]
    only_eq = best_of([a, eq])
    assert [c.number for c in remeasure_plan(only_eq, 2)] == [0, 1]
