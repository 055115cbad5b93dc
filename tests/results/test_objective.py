"""dse/results/objective.py on its own: the value storage keeps for a trial is the space's
objective
metric of an ``ok`` outcome, a float; nothing for a failure or a missing metric."""

from __future__ import annotations

from dse.core.records import Outcome
from dse.results.objective import objective_value
from tests.conftest import small_space

KNOBS = {"micro_batch_size": {"values": [1, 2]}}


def test_the_objective_metric_of_an_ok_outcome() -> None:
    space = small_space("o", KNOBS)
    out = Outcome("ok", {space.objective.metric: 412, "step_time_s": 0.5})
    v = objective_value(space, out)
    assert v == 412.0 and type(v) is float
    by_time = small_space("o", KNOBS, objective={"metric": "step_time_s", "direction": "minimize"})
    assert objective_value(by_time, out) == 0.5


def test_no_value_for_a_failure_or_a_missing_metric() -> None:
    space = small_space("o", KNOBS)
    metric = space.objective.metric
    oom = Outcome.failure("oom", "CUDA out of memory", metrics={metric: 300.0})
    assert not oom.ok and objective_value(space, oom) is None  # a failure's partial figures
    assert objective_value(space, Outcome("ok", {"step_time_s": 1.0})) is None
    assert objective_value(space, Outcome("ok", {metric: None})) is None
