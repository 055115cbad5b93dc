"""One builder of a trial's spec (``dse.loop.dispatch.trial_spec``): the study loop's launches and
the benches that run the trainer in their own process write the same ``trial.json``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from dse.loop.dispatch import trial_spec
from dse.space.searchspace import load_space
from dse.stats.measure import MeasurementSpec

REPO = Path(__file__).resolve().parents[2]


def test_the_spec_holds_the_configuration_with_the_spaces_fixed_knobs(tmp_path: Path) -> None:
    space = load_space(REPO / "examples" / "tiny_gpt_cpu.yaml")
    params = space.baseline()
    spec = trial_spec(space, params, tmp_path / "m.jsonl", trial_number=7, features={"b", "a"})
    assert spec.params == space.full_params(params)
    assert spec.trial_number == 7 and spec.study == space.study
    assert spec.features == ["a", "b"] and spec.metrics_path == str(tmp_path / "m.jsonl")
    assert spec.measurement == space.measurement.model_dump(mode="json")
    assert spec.world_size == space.resources.world_size
    assert spec.device == space.resources.device


def test_the_adaptive_window_bench_builds_its_specs_with_it(tmp_path: Path) -> None:
    path = REPO / "bench" / "adaptive_window.py"
    mspec = importlib.util.spec_from_file_location("adaptive_window_bench", path)
    assert mspec is not None and mspec.loader is not None
    bench = importlib.util.module_from_spec(mspec)
    sys.modules[mspec.name] = bench
    mspec.loader.exec_module(bench)
    space = load_space(REPO / "examples" / "tiny_gpt_cpu.yaml")
    m = MeasurementSpec(mode="fixed")
    got = bench._spec(space, space.baseline(), m, tmp_path)
    want = trial_spec(
        space, space.baseline(), tmp_path / "unused.jsonl", measurement=m.model_dump(mode="json")
    )
    assert got == want
