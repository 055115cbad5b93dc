"""The noise-aware best (dse.results.noise): intervals, pooling, configurations equal in effect,
ties and the re-measure plan, on trial records."""

from __future__ import annotations

import statistics
from typing import Any, Literal

import pytest

from dse.core.records import StepMetrics, TrialRecord
from dse.results.noise import (
    noisy_best,
    rank_configurations,
    remeasure_plan,
    t_quantile,
    trial_figures,
)
from dse.space.searchspace import params_key, parse_space

SPACE = parse_space(
    {
        "study": "n",
        "model": {
            "num_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "ffn_hidden_size": 128,
            "vocab_size": 1024,
        },  # fmt: skip
        "semantics": {"global_batch_size": 8, "seq_length": 64, "steps": 6, "warmup_steps": 2},
        "resources": {"world_size": 1, "device": "cuda", "features": []},
        "knobs": {
            "micro_batch_size": {"values": [1, 2, 4]},
            "use_distributed_optimizer": {"type": "bool"},  # inert at DP 1 (world 1)
        },
    },
    "noise.yaml",
)
TOKENS = 8 * 64  # per step and GPU (world 1)


def trial(
    number: int,
    params: dict[str, Any],
    tflops: float,
    times: list[float] | None = None,
    **metrics: Any,
) -> TrialRecord:
    """A complete trial; ``times``: its per-step times (TFLOP/s in proportion)."""
    st = 1.0
    steps = tuple(
        StepMetrics(i, t, tflops * st / t, 10.0, 10.0, 7.0) for i, t in enumerate(times or [])
    )
    m = {"tflops_per_gpu": tflops, "step_time_s": st, "peak_mem_gib": 10.0, **metrics}
    p = {"micro_batch_size": 1, "use_distributed_optimizer": False, **params}
    return TrialRecord(number, 1, number, "complete", p, params_key(p), m, tflops, steps=steps)


def test_t_quantiles_match_the_tables() -> None:
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042}
    for dof, want in table.items():
        assert t_quantile(0.975, dof) == pytest.approx(want, abs=2e-3)


def test_a_trials_interval_comes_from_its_measured_steps() -> None:
    t = trial(0, {}, 100.0, [5.0, 3.0, 1.0, 1.02, 0.98, 1.0])  # 2 warm-up steps, then 4
    figs, src = trial_figures(SPACE, t)
    lo, hi = figs["tflops_per_gpu"].ci  # type: ignore[misc]
    assert src == "steps" and lo < 100.0 < hi and hi - lo < 6.0  # warm-up steps left out
    assert figs["step_time_s"].ci is not None and figs["peak_mem_gib"].ci is None
    tlo, thi = figs["tokens_per_s_per_gpu"].ci  # type: ignore[misc]
    assert tlo == pytest.approx(TOKENS / figs["step_time_s"].ci[1])  # type: ignore[index]
    assert thi == pytest.approx(TOKENS / figs["step_time_s"].ci[0])  # type: ignore[index]


def test_a_measured_interval_without_steps_and_a_detected_warmup_are_used() -> None:
    # no per-step times (a recipe's log gave the summary only): the measured interval
    t = trial(0, {}, 100.0, tflops_per_gpu_ci=[99.0, 101.0])
    figs, src = trial_figures(SPACE, t)
    assert src == "measured" and figs["tflops_per_gpu"].ci == (99.0, 101.0)
    # ... unless it reaches zero (no throughput interval below zero)
    zero = trial(0, {}, 100.0, tflops_per_gpu_ci=[-5.0, 205.0])
    assert trial_figures(SPACE, zero)[0]["tflops_per_gpu"].ci is None
    # measurement.warmup_steps (adaptive measurement) replaces semantics.warmup_steps
    late = trial(1, {}, 100.0, [9.0, 9.0, 9.0, 1.0, 1.01], measurement={"warmup_steps": 3})
    lo, hi = trial_figures(SPACE, late)[0]["step_time_s"].ci  # type: ignore[misc]
    assert 0.9 < lo < 1.0 < hi < 1.1  # the three slow steps are warm-up
    # identical steps (a replayed row without per-step times) give no interval
    flat = trial(2, {}, 100.0, [1.0] * 6)
    assert trial_figures(SPACE, flat)[0]["tflops_per_gpu"].ci is None


def _h200(number: int, mbs: int, tflops: float, steps: list[float]) -> TrialRecord:
    """A trial of the H200 headline study: 2 warm-up steps, then ``steps`` (seconds), the
    reported figures the median of the measured steps (fixed mode)."""
    st = statistics.median(steps)
    work = tflops * st
    s = tuple(StepMetrics(i, t, work / t, 50.0, 50.0, 10.7)
              for i, t in enumerate([3.0, 0.9, *steps]))  # fmt: skip
    p = {"micro_batch_size": mbs, "use_distributed_optimizer": False}
    m = {"tflops_per_gpu": tflops, "step_time_s": st, "peak_mem_gib": 50.0}
    return TrialRecord(number, 1, number, "complete", p, params_key(p), m, tflops, steps=s)


def test_one_slow_step_is_no_tie_and_no_interval_is_below_zero() -> None:
    """The H200 headline study: sdpa MBS 1 at 262 TFLOP/s with one slow step among its 4
    measured ones was called tied with the 431 TFLOP/s best (its interval was [-23,748,
    24,271] TFLOP/s). One slow step is a spike: the trial's interval stays near 262."""
    best = _h200(0, 4, 431.7, [0.421, 0.445, 0.421, 0.445])
    again = _h200(1, 4, 430.6, [0.422, 0.446, 0.421, 0.447])
    slow = _h200(2, 1, 262.0, [0.69, 0.70, 7.9, 0.695])  # one step 11x the others
    figs, src = trial_figures(SPACE, slow)
    lo, hi = figs["tflops_per_gpu"].ci  # type: ignore[misc]
    assert src == "steps" and 0 < lo < 262.0 < hi < 300.0
    nb = noisy_best(SPACE, [best, again, slow], metric="tflops_per_gpu", direction="maximize")
    assert nb is not None and nb.best.trials == (0, 1) and nb.tied == ()
    for c in nb.ranking:
        for f in c.figures.values():
            assert f.ci is None or f.ci[0] > 0, (c.number, f)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_trials_of_one_to_three_measured_steps(n: int) -> None:
    times = [1.0, 1.04, 0.97][:n]
    t = trial(0, {}, 100.0, [2.0, 1.5, *times])  # 2 warm-up steps
    figs, src = trial_figures(SPACE, t)
    ci = figs["tflops_per_gpu"].ci
    if n == 1:  # one step: no interval from it
        assert ci is None and src == "none"
    else:  # wide with few steps, but above zero and around the figure
        assert ci is not None and 0 < ci[0] < 100.0 < ci[1]
    # one slow step among three: left out, not widening the interval
    spiky = trial(1, {}, 100.0, [2.0, 1.5, 1.0, 1.01, 9.0])
    lo, hi = trial_figures(SPACE, spiky)[0]["step_time_s"].ci  # type: ignore[misc]
    assert 0.9 < lo and hi < 1.1 * 1.01


def test_large_run_to_run_spread_widens_but_never_crosses_zero() -> None:
    """The CPU demo: re-measures 47 % below and 85 % above the first runs; the pooled
    intervals are wide (a tie may be right) but every bound stays above zero."""
    a = [trial(0, {"micro_batch_size": 1}, 0.008), trial(3, {"micro_batch_size": 1}, 0.0042)]
    b = [trial(1, {"micro_batch_size": 2}, 0.006), trial(4, {"micro_batch_size": 2}, 0.0111)]
    c = [trial(2, {"micro_batch_size": 4}, 0.002)]
    ranking, rel = rank_configurations(SPACE, [*a, *b, *c], metric="tflops_per_gpu",
                                       direction="maximize")  # fmt: skip
    assert rel is not None and rel > 0.3
    for r in ranking:
        assert r.objective.ci is not None and r.objective.ci[0] > 0, r


def test_configurations_equal_in_effect_count_as_one() -> None:
    """At DP 1 the distributed optimizer does nothing: two trials, one configuration."""
    a = trial(0, {"micro_batch_size": 2, "use_distributed_optimizer": False}, 120.0)
    b = trial(1, {"micro_batch_size": 2, "use_distributed_optimizer": True}, 122.0)
    c = trial(2, {"micro_batch_size": 1}, 100.0)
    ranking, rel_sd = rank_configurations(SPACE, [a, b, c], metric="tflops_per_gpu",
                                          direction="maximize")  # fmt: skip
    assert [r.trials for r in ranking] == [(0, 1), (2,)]
    assert ranking[0].objective.value == 121.0 and rel_sd == pytest.approx(0.0117, abs=1e-4)
    # the run-to-run spread of the pair widens the single trial's interval too
    assert ranking[1].objective.ci is not None and ranking[1].source == "repeats"


def test_overlapping_intervals_are_a_tie_and_the_plan_remeasures_them() -> None:
    a = trial(0, {"micro_batch_size": 1}, 100.0, [1, 1, 1.0, 1.01, 0.99, 1.0])
    b = trial(1, {"micro_batch_size": 2}, 100.5, [1, 1, 1.0, 1.01, 0.99, 1.0])
    c = trial(2, {"micro_batch_size": 4}, 80.0, [1, 1, 1.0, 1.01, 0.99, 1.0])
    nb = noisy_best(SPACE, [a, b, c], metric="tflops_per_gpu", direction="maximize")
    assert nb is not None and nb.best.number == 1 and [t.number for t in nb.tied] == [0]
    assert nb.message.startswith("tied within noise: trial 1 and trial 0; ")
    assert [x.number for x in remeasure_plan(nb, 3)] == [1, 0, 1]
    clear = noisy_best(SPACE, [c, trial(3, {}, 100.0)], metric="tflops_per_gpu",
                       direction="maximize")  # fmt: skip
    assert clear is not None and clear.tied == () and remeasure_plan(clear, 2) == []


def test_pooled_estimates_decide_and_minimize_works() -> None:
    """A lucky single run does not win over a configuration measured three times."""
    runs = [trial(i, {"micro_batch_size": 1}, v) for i, v in enumerate([100.0, 99.0, 101.0])]
    lucky = [trial(3, {"micro_batch_size": 2}, 103.0), trial(4, {"micro_batch_size": 2}, 96.0)]
    nb = noisy_best(SPACE, [*runs, *lucky], metric="tflops_per_gpu", direction="maximize")
    assert nb is not None and nb.best.trials == (0, 1, 2) and nb.best.objective.value == 100.0
    assert nb.tied and nb.tied[0].trials == (3, 4)
    low = noisy_best(SPACE, [*runs, *lucky], metric="tflops_per_gpu", direction="minimize")
    assert low is not None and low.best.trials == (3, 4)


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_equal_values_rank_by_the_lower_trial_number(
    direction: Literal["maximize", "minimize"],
) -> None:
    """``rank_configurations``'s docstring: "ranked best first (ties: the lower trial
    number)". Three configurations of one value, given out of order: trial 3, then 5, then 7,
    whichever the direction; and the best is trial 3."""
    ts = [
        trial(7, {"micro_batch_size": 4}, 100.0),
        trial(5, {"micro_batch_size": 1}, 100.0),
        trial(3, {"micro_batch_size": 2}, 100.0),
    ]
    ranking, _ = rank_configurations(SPACE, ts, metric="tflops_per_gpu", direction=direction)
    assert [c.number for c in ranking] == [3, 5, 7]
    nb = noisy_best(SPACE, ts, metric="tflops_per_gpu", direction=direction)
    assert nb is not None and nb.best.number == 3
    assert [c.number for c in nb.tied] == [5, 7]
