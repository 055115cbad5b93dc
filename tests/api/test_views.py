"""The pure parts of the views: the Pareto front, JSON-safe numbers, study matching."""

from __future__ import annotations

import math
import random

import pytest

from dse.api.schemas import BestQuery
from dse.api.views import clean, finite, pareto_front, study_matches
from dse.core.records import StudyRecord


def _dominated(i: int, pts: list[tuple[float, float]]) -> bool:
    x, y = pts[i]
    return any((a >= x and b <= y) and (a > x or b < y) for j, (a, b) in enumerate(pts) if j != i)


@pytest.mark.parametrize("seed", range(20))
def test_pareto_front_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    pts = [(float(rng.randint(0, 8)), float(rng.randint(0, 8))) for _ in range(rng.randint(0, 40))]
    front = pareto_front(pts)
    assert sorted(front) == [i for i in range(len(pts)) if not _dominated(i, pts)]
    xs = [pts[i][0] for i in front]
    assert xs == sorted(xs)


def test_pareto_front_small_cases() -> None:
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 1.0)]) == [0]
    assert pareto_front([(300.0, 60.0), (350.0, 80.0), (280.0, 90.0)]) == [0, 1]
    assert pareto_front([(1.0, 1.0), (1.0, 1.0)]) == [0, 1]  # equal points both stay


def test_finite_and_clean() -> None:
    assert finite(1) == 1.0 and finite(2.5) == 2.5
    assert finite(math.nan) is None and finite(math.inf) is None
    assert finite(None) is None and finite("3") is None and finite(True) is None
    assert clean({"a": [1.0, math.nan, {"b": -math.inf}], "c": "x"}) == {
        "a": [1.0, None, {"b": None}],
        "c": "x",
    }


def _study(**hardware: object) -> StudyRecord:
    return StudyRecord(
        id=1, name="s", space_yaml="", space_hash="", state="created", direction="maximize",
        metric="tflops_per_gpu", created_at=0.0,
        model={"num_layers": 32, "hidden_size": 4096}, hardware=dict(hardware),
    )  # fmt: skip


def test_study_matches() -> None:
    s = _study(gpu="NVIDIA H200", world_size=8)
    assert study_matches(s, BestQuery(model={"num_layers": 32}))
    assert study_matches(s, BestQuery(hardware={"gpu": "nvidia h200", "world_size": 8}))
    assert not study_matches(s, BestQuery(model={"num_layers": 16}))
    assert not study_matches(s, BestQuery(model={"num_moe_experts": 8}))
    assert not study_matches(s, BestQuery(hardware={"world_size": 16}))
    assert not study_matches(s, BestQuery(model={"num_layers": 32}, metric="step_time_s"))
