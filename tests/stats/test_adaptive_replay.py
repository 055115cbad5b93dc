"""bench/adaptive_window.py --from-json: the adaptive rule of this checkout replayed on the
per-step series a run saved (what the next GPU run is analysed with). Seeded series, the
real dse.stats.measure rule and the real space file; no training."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from dse.stats.measure import MeasurementSpec, StepSeries

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "adaptive_window_bench", REPO / "bench" / "adaptive_window.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(times: list[float]) -> dict[str, list[float]]:
    # 2 TFLOP per step per GPU: the TFLOP/s of a step is 2 / its time
    return {"step_time_s": times, "tflops_per_gpu": [2.0 / t for t in times]}


def _saved(tmp_path: Path, *, rebuild: bool = False, with_series: bool = True) -> Path:
    rng = np.random.default_rng(5)
    rows: list[dict[str, Any]] = []
    for i, base in enumerate((0.010, 0.012, 0.015)):
        jitter = 0.04 if i == 2 else 0.005  # the third needs more steps than its run took
        adaptive = list(base * (1 + rng.normal(0, jitter, 12)))
        adaptive[0] *= 6.0  # cold start
        adaptive[5] *= 30.0  # a spike in the middle
        fixed = list(base * (1 + rng.normal(0, jitter, 30)))
        row: dict[str, Any] = {
            "params": {"micro_batch_size": 2**i},
            "build_s": 0.1,
            "first": "adaptive",
            "fixed_s": sum(fixed) * 1.1,  # loop wall time: 10% over the step times
            "adaptive_s": sum(adaptive) * 1.1,
            "adaptive_stop": "max_steps",
        }
        if with_series:
            row["series"] = {"adaptive": _run(adaptive), "fixed": _run(fixed)}
        rows.append(row)
    args = {
        "space": str(REPO / "examples" / "tiny_gpt_cpu.yaml"),
        "set": ["resources.world_size=1"],
        "fixed_steps": 30,
        "min_steps": 10,
        "max_steps": 30,
        "rel_halfwidth": 0.01,
        "confidence": 0.95,
        "adaptive": "live",
        "rebuild": rebuild,
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"args": args, "rows": rows, "summary": {}}))
    return path


def _replayed(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["rows"]


def test_replay_applies_this_checkouts_rule(bench: ModuleType, tmp_path: Path) -> None:
    src = _saved(tmp_path)
    out = tmp_path / "replay.json"
    assert bench.main(["--from-json", str(src), "--json", str(out)]) == 0
    saved = json.loads(src.read_text())["rows"]
    rows = _replayed(out)
    spec = MeasurementSpec(mode="adaptive", min_steps=10, max_steps=30, rel_halfwidth=0.01)
    for old, new in zip(saved, rows, strict=True):
        # the rule sees the adaptive run's steps, then the fixed window of the same model
        times = old["series"]["adaptive"]["step_time_s"] + old["series"]["fixed"]["step_time_s"]
        s = StepSeries(spec, steps=30, warmup_steps=1)
        for t in times:
            if s.add(t, 2.0 / t) is not None:
                break
        r = s.result()
        assert new["adaptive_steps"] == len(s.times) and new["adaptive_stop"] == r.stop_reason
        assert new["adaptive_step_s"] == pytest.approx(r.step_time_s)
        assert new["adaptive_value"] == pytest.approx(2.0 / r.step_time_s)
        # GPU-seconds: the replayed steps, scaled by their run's wall over step times
        assert new["adaptive_s"] == pytest.approx(1.1 * sum(times[: len(s.times)]))
        fixed = old["series"]["fixed"]["step_time_s"]
        assert new["fixed_step_s"] == pytest.approx(float(np.median(fixed[1:])))
        assert "replay_exhausted" not in new
    # the first two converge within their own 12 steps, the spike notwithstanding
    assert [r["adaptive_stop"] for r in rows[:2]] == ["converged", "converged"]
    assert all(r["adaptive_steps"] <= 12 and r["adaptive_spikes"] == 1 for r in rows[:2])
    assert rows[2]["adaptive_steps"] > 12  # continued into the fixed window
    summary = json.loads(out.read_text())["summary"]
    assert summary["measured"] == 3 and summary["same_best"] is True


def test_replay_without_the_same_model_says_it_ran_out(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    assert (
        bench.main(["--from-json", str(_saved(tmp_path, rebuild=True)), "--json", str(out)]) == 0
    )
    rows = _replayed(out)
    assert rows[2]["adaptive_steps"] == 12 and rows[2]["replay_exhausted"] is True
    assert "replay_exhausted" not in rows[0]


def test_replay_settings_and_bad_files(bench: ModuleType, tmp_path: Path) -> None:
    src = _saved(tmp_path)
    out = tmp_path / "replay.json"
    # a looser precision from the command line: every row stops one step after min_steps
    # (at 10 steps, 9 after the warm-up step: floor(0.1 * 9) = 0 trimmed, the 30x step counts)
    assert bench.main(["--from-json", str(src), "--rel-halfwidth", "0.2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["args"]["rel_halfwidth"] == 0.2 and data["args"]["trim"] is None
    assert all(r["adaptive_steps"] == 11 for r in data["rows"])
    # another trim: untrimmed (the mean), the 30x step keeps every row from converging
    assert bench.main(["--from-json", str(src), "--trim", "0", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["args"]["trim"] == 0
    assert all(r["adaptive_stop"] == "max_steps" for r in data["rows"])
    old = _saved(tmp_path, with_series=False)
    with pytest.raises(SystemExit, match=r"row 0 .* has no per-step series"):
        bench.main(["--from-json", str(old)])
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a JSON file of this bench"):
        bench.main(["--from-json", str(tmp_path / "junk.json")])


def test_replay_prunes_against_the_best_so_far(bench: ModuleType, tmp_path: Path) -> None:
    """--prune: in the order of the rows, each run stops as 'dominated' once its interval lies
    below the best adaptive result so far by the margin (a study's measurement.prune)."""
    src = _saved(tmp_path)
    plain, pruned = tmp_path / "plain.json", tmp_path / "pruned.json"
    assert bench.main(["--from-json", str(src), "--json", str(plain)]) == 0
    assert bench.main(["--from-json", str(src), "--prune", "--json", str(pruned)]) == 0
    p_rows, rows = _replayed(plain), _replayed(pruned)
    # row 0 (200 TFLOP/s) has nothing to be pruned against; rows 1 and 2 (167, 133) are
    # more than 5% below it and stop soon after min_steps (10)
    assert rows[0]["adaptive_stop"] == p_rows[0]["adaptive_stop"] == "converged"
    assert [r["adaptive_stop"] for r in rows[1:]] == ["dominated", "dominated"]
    assert all(r["adaptive_steps"] <= 12 for r in rows[1:])
    assert rows[2]["adaptive_steps"] < p_rows[2]["adaptive_steps"]
    # the same decision as the rule itself told that target
    target = bench.prune_target(
        "tflops_per_gpu", "maximize", best_value=rows[0]["adaptive_value"],
        best_metrics={"step_time_ci_s": rows[0]["adaptive_ci_s"]}, margin=0.05,
    )  # fmt: skip
    assert target is not None
    saved = json.loads(src.read_text())["rows"][1]
    times = saved["series"]["adaptive"]["step_time_s"] + saved["series"]["fixed"]["step_time_s"]
    spec = MeasurementSpec(mode="adaptive", min_steps=10, max_steps=30, rel_halfwidth=0.01)
    s = StepSeries(spec, steps=30, warmup_steps=1, prune=target)
    for t in times:
        if s.add(t, 2.0 / t) is not None:
            break
    assert s.stop_reason == "dominated" and len(s.times) == rows[1]["adaptive_steps"]
    summary = json.loads(pruned.read_text())["summary"]
    assert summary["pruned"] == 2 and summary["fixed_best_pruned"] is False
    assert summary["stops"]["dominated"] == 2
    assert (
        summary["median_gpu_seconds_ratio"]
        > json.loads(plain.read_text())["summary"]["median_gpu_seconds_ratio"]
    )
    with pytest.raises(SystemExit):
        bench.main(["--from-json", str(src), "--prune-margin", "0.1"])  # only with --prune


def test_replay_of_a_run_split_over_files(bench: ModuleType, tmp_path: Path) -> None:
    """A run split with --start is replayed as one from repeated --from-json; files of
    different runs are refused, naming the setting."""
    src = _saved(tmp_path)
    out = tmp_path / "both.json"
    assert bench.main(["--from-json", str(src), "--from-json", str(src), "--json", str(out)]) == 0
    assert len(_replayed(out)) == 6
    other = json.loads(src.read_text())
    other["args"]["fixed_steps"] = 40
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="fixed_steps is 40, not 30"):
        bench.main(["--from-json", str(src), "--from-json", str(tmp_path / "other.json")])
