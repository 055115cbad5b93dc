"""The start of the model-based agents without the knob-semantics prior, from the cost
model's speed estimate (``dse.agents._estimate``): it follows the estimate, corrects it with
what was measured, respects the memory evidence and the rules, hands over to the sampler,
and is off with ``agent.estimate: false``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from dse.agents import Feedback, create_agent
from dse.cli.bench import bench
from dse.loop.proposer import cost_model_speed_hint
from dse.model.costmodel import CostModel
from dse.model.rules import check
from dse.space.searchspace import SearchSpace, load_space, params_key
from tests.conftest import small_space

REPO = Path(__file__).resolve().parents[2]

KNOBS: dict[str, Any] = {
    "micro_batch_size": {"values": [1, 2, 4, 8]},
    "recompute": {"values": ["none", "selective", "full"], "baseline": "full"},
    "cross_entropy_loss_fusion": {"type": "bool"},
}
REC = {"none": 1.0, "selective": 0.9, "full": 0.7}


def _space(agent: dict[str, Any], **extra: Any) -> SearchSpace:
    agent = {"name": "tpe", "seed": 0, "prior": False, **agent}
    space: SearchSpace = small_space("estimate", KNOBS, agent=agent, **extra)
    return space


def _estimate(p: dict[str, Any]) -> float:
    """A speed estimate: larger micro-batches and less recompute are faster."""
    return (
        100.0
        * REC[p["recompute"]]
        * (1 + 0.1 * p["micro_batch_size"])
        * (1.02 if p["cross_entropy_loss_fusion"] else 1.0)
    )


def _fits(p: dict[str, Any]) -> tuple[float, float]:
    """A memory hint: every configuration well under the 80 GiB."""
    return 10.0 * p["micro_batch_size"] / 8, 0.05


def _run(agent: Any, truth: Any, n: int) -> list[dict[str, Any]]:
    seen = []
    for _ in range(n):
        (prop,) = agent.ask(1)
        seen.append(prop.params)
        agent.tell(prop.trial_id, truth(prop.params))
    return seen


def _measured(value: float) -> Feedback:
    return Feedback("complete", (value,), {"peak_mem_gib": 10.0})


@pytest.mark.parametrize("name", ["tpe", "gp"])
def test_the_first_choice_after_the_baseline_is_the_best_estimated(name: str) -> None:
    agent = create_agent(_space({"name": name}), memory_hint=_fits, speed_hint=_estimate)
    seen = _run(agent, lambda p: _measured(_estimate(p)), 3)
    assert seen[0]["recompute"] == "full" and seen[0]["micro_batch_size"] == 1  # baseline
    assert seen[1] == {
        "micro_batch_size": 8,
        "recompute": "none",
        "cross_entropy_loss_fusion": True,
    }
    # the estimate was right: nothing promises a gain over it; the sampler goes on
    assert seen[2] != seen[1]


def test_parallel_picks_before_any_measurement_follow_the_estimate() -> None:
    """Three proposals at once, nothing measured yet: the baseline, then the estimate's two
    best (not whatever candidate comes first)."""
    agent = create_agent(_space({}), memory_hint=_fits, speed_hint=_estimate)
    got = [p.params for p in agent.ask(3)]
    assert got[0]["recompute"] == "full" and got[0]["micro_batch_size"] == 1
    by_estimate = sorted(
        (c for c in _space({}).iter_configs() if c != got[0]), key=_estimate, reverse=True
    )
    assert got[1:] == by_estimate[:2]


def test_a_wrong_estimate_is_corrected_near_where_it_was_wrong() -> None:
    """MBS 8 without recompute measures at half its estimate, the baseline at its estimate:
    a configuration one knob from the wrong one inherits most of the error, one knob from
    the baseline little of it; the next proposal is the best corrected estimate."""
    import math

    from dse.agents._estimate import DECAY, EstimateGuide
    from dse.agents._prior import PriorGuide

    sp = _space({"n_startup_trials": 3})
    guide = EstimateGuide(sp, _estimate, PriorGuide(sp, random.Random(0)))
    base = sp.baseline()
    wrong = {"micro_batch_size": 8, "recompute": "none", "cross_entropy_loss_fusion": True}
    corr = [(base, 0.0), (wrong, math.log(0.5))]
    near_wrong = {**wrong, "cross_entropy_loss_fusion": False}  # 1 knob from wrong, 2 from base
    near_base = {**base, "cross_entropy_loss_fusion": True}  # 1 knob from base, 2 from wrong
    w1, w2 = DECAY, DECAY**2
    for c, want in ((near_wrong, w1 / (w1 + w2)), (near_base, w2 / (w1 + w2))):
        got = guide.predict(c, corr)
        assert got == pytest.approx(math.log(_estimate(c)) + want * math.log(0.5))

    def truth(p: dict[str, Any]) -> Feedback:
        return _measured(_estimate(p) * (0.5 if p == wrong else 1.0))

    agent = create_agent(sp, memory_hint=_fits, speed_hint=_estimate)
    seen = _run(agent, truth, 3)
    assert seen[1] == wrong
    ref = _estimate(wrong) * 0.5
    obs = [(base, 0.0), (wrong, math.log(0.5))]
    best = max(
        (c for c in sp.iter_configs() if c not in (base, wrong)),
        key=lambda c: guide.predict(c, obs),
    )
    assert math.exp(guide.predict(best, obs)) > ref
    assert seen[2] == best


def test_a_configuration_as_large_as_a_measured_oom_is_not_proposed() -> None:
    """MBS 8 without recompute ran out of memory: whatever uses at least as much memory on
    every memory knob is skipped, although the estimate ranks it first."""

    def truth(p: dict[str, Any]) -> Feedback:
        if p["micro_batch_size"] == 8 and p["recompute"] != "full":
            return Feedback("infeasible", metrics={"peak_mem_gib": 81.0}, failure_class="oom")
        return _measured(_estimate(p))

    agent = create_agent(_space({"n_startup_trials": 4}), memory_hint=_fits, speed_hint=_estimate)
    seen = _run(agent, truth, 5)
    assert seen[1] == {
        "micro_batch_size": 8,
        "recompute": "none",
        "cross_entropy_loss_fusion": True,
    }
    later = seen[2:]
    assert not any(p["micro_batch_size"] == 8 and p["recompute"] == "none" for p in later)


def test_rules_are_respected_by_the_start() -> None:
    """A rule rejects MBS 8 (GBS 4 is not divisible by it): the start never proposes it."""
    sp = _space({}, semantics={"global_batch_size": 4, "seq_length": 128})
    agent = create_agent(sp, memory_hint=_fits, speed_hint=_estimate)
    agent.set_validity(lambda p: not check(sp, sp.full_params(p)))
    seen = _run(agent, lambda p: _measured(_estimate(p)), 4)
    assert all(p["micro_batch_size"] <= 4 for p in seen)
    assert seen[1] == {
        "micro_batch_size": 4,
        "recompute": "none",
        "cross_entropy_loss_fusion": True,
    }


def _guide(sp: SearchSpace, hint: Any) -> Any:
    from dse.agents._estimate import EstimateGuide
    from dse.agents._prior import PriorGuide

    return EstimateGuide(sp, hint, PriorGuide(sp, random.Random(0), _fits))


def _ob(p: dict[str, Any], fb: Feedback) -> Any:
    from dse.agents import Observation

    return Observation(dict(p), fb)


def test_the_picks_end_when_one_loses_and_random_starts_follow() -> None:
    """The estimate's best measures below the baseline: no more picks, even if a later
    measurement makes the estimate look right again; the rest of the n_startup_trials
    start-up trials are random samples, then the sampler's model takes over."""
    sp = _space({"n_startup_trials": 3})
    configs = list(sp.iter_configs())
    guide = _guide(sp, _estimate)
    base = sp.baseline()
    obs = [_ob(base, _measured(_estimate(base)))]
    first = guide.propose(obs, configs, {params_key(base)})
    assert first == {"micro_batch_size": 8, "recompute": "none", "cross_entropy_loss_fusion": True}
    obs.append(_ob(first, _measured(10.0)))  # far below the baseline's 77
    seen = {params_key(base), params_key(first)}
    assert guide.propose(obs, configs, seen) is None
    obs.append(_ob(configs[0], _measured(1000.0)))
    assert guide.propose(obs, configs, seen | {params_key(configs[0])}) is None

    def truth(p: dict[str, Any]) -> Feedback:
        return _measured(10.0 if p == first else _estimate(p))

    agent = create_agent(sp, memory_hint=_fits, speed_hint=_estimate)
    got = _run(agent, truth, 2 + 3 + 2)
    assert got[1] == first
    assert agent._random_starts == 2  # 1 pick + 2 random = n_startup_trials, then the sampler
    assert len({params_key(p) for p in got}) == len(got)


def test_the_picks_end_when_nothing_promises_a_gain() -> None:
    """The same estimate everywhere: after the baseline nothing is estimated faster than it
    measured, so the guide picks nothing."""
    sp = _space({})
    guide = _guide(sp, lambda p: 50.0)
    base = sp.baseline()
    obs = [_ob(base, _measured(77.0))]
    assert guide.propose(obs, list(sp.iter_configs()), {params_key(base)}) is None


def test_a_winning_pick_lets_the_estimate_pick_again() -> None:
    """Full recompute measures at twice its estimate (the baseline among them), the rest at
    theirs: the first pick (MBS 8, none) still beats the baseline, so the estimate picks
    again, now corrected: not its own second best (MBS 8, none, no fusion: one knob from the
    pick, which measured as estimated), but MBS 8 with selective recompute, two knobs from
    both measurements, which inherits half of the baseline's error."""
    sp = _space({"n_startup_trials": 3})
    agent = create_agent(sp, memory_hint=_fits, speed_hint=_estimate)
    truth = lambda p: _measured(  # noqa: E731
        _estimate(p) * (2.0 if p["recompute"] == "full" else 1.0)
    )
    got = _run(agent, truth, 3)
    assert got[1] == {
        "micro_batch_size": 8,
        "recompute": "none",
        "cross_entropy_loss_fusion": True,
    }
    assert got[2] == {
        "micro_batch_size": 8,
        "recompute": "selective",
        "cross_entropy_loss_fusion": False,
    }
    assert agent._random_starts == 0


def test_estimate_false_or_prior_on_ignores_the_speed_hint() -> None:
    truth = lambda p: _measured(_estimate(p))  # noqa: E731
    off = _run(
        create_agent(_space({"estimate": False}), memory_hint=_fits, speed_hint=_estimate),
        truth,
        5,
    )
    none = _run(create_agent(_space({})), truth, 5)
    assert off == none
    prior = _run(create_agent(_space({"prior": True}), speed_hint=lambda p: 1.0), truth, 5)
    prior_no_hint = _run(create_agent(_space({"prior": True})), truth, 5)
    assert prior == prior_no_hint


def test_a_bad_estimate_setting_is_named() -> None:
    with pytest.raises(ValueError, match="agent.estimate"):
        _space({"estimate": "maybe"})


def test_the_speed_hint_speaks_the_objective_metric() -> None:
    sp = load_space(REPO / "examples" / "llama_2b_h200.yaml")
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    base = sp.baseline()
    est = cm.estimate_throughput(sp.full_params(base))
    hint = cost_model_speed_hint(sp, cm)
    assert hint is not None and hint(base) == pytest.approx(est["tflops_per_gpu"])
    for metric, want in (
        ("step_time_s", est["step_time_s"]),
        ("tokens_per_s_per_gpu", 4 * 4096 / est["step_time_s"]),
    ):
        direction = "minimize" if metric == "step_time_s" else "maximize"
        other = sp.model_copy(update={"objectives": [sp.objective.model_copy(
            update={"metric": metric, "direction": direction})]})  # fmt: skip
        h = cost_model_speed_hint(other, cm)
        assert h is not None and h(base) == pytest.approx(want)
    mem = sp.model_copy(update={"objectives": [sp.objective.model_copy(
        update={"metric": "peak_mem_gib", "direction": "minimize"})]})  # fmt: skip
    assert cost_model_speed_hint(mem, cm) is None
    assert cost_model_speed_hint(sp, None) is None


@pytest.mark.parametrize(
    "table",
    [
        "examples/tables/h200_llama1b_unfused_1gpu.jsonl",
        "examples/tables/h200_llama1b_unfused_2gpu.jsonl",
        "examples/tables/h200_llama2b_sdpa_1gpu.jsonl",
    ],
)
def test_bench_without_the_prior_follows_the_estimate_on_measured_tables(table: str) -> None:
    """On the measured tables the estimate's best is within 2% of the measured best: the
    target is met by the second trial; without the estimate the start is random."""
    on = bench(str(REPO / table), ["tpe"], seeds=3, prior=False)
    off = bench(str(REPO / table), ["tpe"], seeds=3, prior=False, estimate=False)
    assert on["estimate"] is True and off["estimate"] is False
    assert on["agents"]["tpe"]["trials_to_target"] == [2, 2, 2]
    assert off["agents"]["tpe"]["trials_to_target"] != [2, 2, 2]


def test_the_picks_end_once_the_estimate_orders_the_measurements_wrongly() -> None:
    """Three measured trials that the estimate orders exactly backwards (rank agreement -1):
    the estimate has not earned its steering, so it picks nothing more, although each of
    its earlier picks beat the best before it."""
    from dse.agents._estimate import MIN_AGREEMENT_TRIALS

    sp = _space({"n_startup_trials": 6})
    configs = list(sp.iter_configs())
    guide = _guide(sp, _estimate)
    ranked = sorted(configs, key=_estimate)
    measured = ranked[:MIN_AGREEMENT_TRIALS]  # estimated slowest first ...
    obs = [_ob(p, _measured(1000.0 - 10 * i)) for i, p in enumerate(measured)]  # ... fastest
    assert guide.rank_agreement(obs) == pytest.approx(-1.0)
    seen = {params_key(p) for p in measured}
    assert guide.propose(obs, configs, seen) is None
    agreeing = [_ob(p, _measured(_estimate(p))) for p in measured]
    assert guide.rank_agreement(agreeing) == pytest.approx(1.0)
    assert guide.rank_agreement(agreeing[:2]) is None  # too few to tell


def test_an_inverted_estimate_reaches_the_target_no_later_than_random(tmp_path: Path) -> None:
    """A measured table whose TFLOP/s are reassigned so that the cost model's order is exactly
    inverted (its best estimate measures worst): the estimate start still reaches within 2%
    of the best no later than random search (median over seeds; seeded, so deterministic)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("er", REPO / "bench" / "estimates_range.py")
    assert spec is not None and spec.loader is not None
    er = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(er)
    src = REPO / "examples/tables/h200_llama2b_sdpa_1gpu.jsonl"
    table = er.inverted_table(src, tmp_path / "inverted.jsonl")
    rep = bench(str(table), ["tpe", "random"], seeds=30, budget=16, prior=False)
    assert rep["estimate"] is True
    tpe, rnd = rep["agents"]["tpe"], rep["agents"]["random"]
    t, r = tpe["median_trials_to_target"], rnd["median_trials_to_target"]
    assert t is not None and r is not None
    assert t <= r, (tpe, rnd)
