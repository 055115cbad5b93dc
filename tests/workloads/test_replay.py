"""The replay workload: measured tables, their outcomes, their space and the trial process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dse.core.exceptions import WorkloadError
from dse.core.records import TrialSpec, read_metrics
from dse.workloads.replay import ReplayTable, run_trial

MODEL = {
    "num_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "ffn_hidden_size": 512,
    "vocab_size": 1024,
    "seq_length": 128,
    "global_batch_size": 8,
    "gated_linear_unit": True,
    "activation": "silu",
    "normalization": "RMSNorm",
    "precision": "bf16",
}
HW = {"gpu": "NVIDIA H200", "gpu_memory_gib": 139.8}
LOSS = [10.7, 10.6, 10.5, 10.4]


def _row(mbs: int, rec: str, status: str = "ok", tflops: float = 100.0, **m: Any) -> dict:
    metrics: dict[str, Any] = dict(m)
    if status == "ok":
        metrics = {
            "tflops_per_gpu": tflops,
            "step_time_s": 1.5,
            "peak_mem_gib": 40.0,
            "peak_reserved_gib": 41.0,
            "loss": LOSS,
            **m,
        }
    return {
        "params": {"micro_batch_size": mbs, "recompute": rec},
        "status": status,
        "metrics": metrics,
        "world_size": 1,
        "model": MODEL,
        "hardware": HW,
    }


ROWS = [
    _row(2, "none", tflops=120.0),
    _row(1, "none", tflops=110.0),
    _row(1, "full", tflops=80.0),
    _row(4, "none", "oom", peak_mem_gib=130.5, error="CUDA out of memory. Tried to allocate"),
    _row(4, "full", "invalid", error="AssertionError: bad"),
    _row(2, "full", "error", error="NCCL timeout"),
]


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def table_path(tmp_path: Path) -> Path:
    return _write(tmp_path / "t.jsonl", ROWS)


def test_load_and_knobs(table_path: Path) -> None:
    t = ReplayTable.load(table_path)
    assert len(t.rows) == 6 and t.rows[0].line == 1
    assert t.space_knobs() == {"micro_batch_size": [1, 2, 4], "recompute": ["full", "none"]}
    assert t.lookup({"micro_batch_size": 1, "recompute": "full"}) is t.rows[2]
    assert t.lookup({"micro_batch_size": 2, "recompute": "none", "other": 1}) is t.rows[0]
    assert t.lookup({"micro_batch_size": 8, "recompute": "none"}) is None
    assert t.lookup({"micro_batch_size": 1}) is None
    assert t.best().params == {"micro_batch_size": 2, "recompute": "none"}


def test_outcomes(table_path: Path) -> None:
    t = ReplayTable.load(table_path)
    ok = t.outcome({"micro_batch_size": 2, "recompute": "none"})
    assert ok.ok and ok.source == "replay"
    assert ok.metrics["tflops_per_gpu"] == 120.0 and ok.metrics["step_time_s"] == 1.5
    assert ok.metrics["peak_mem_gib"] == 40.0 and ok.metrics["peak_reserved_gib"] == 41.0
    assert ok.metrics["loss"] == 10.4 and ok.metrics["losses"] == LOSS
    assert [s.step for s in ok.steps] == [1, 2, 3, 4]
    oom = t.outcome({"micro_batch_size": 4, "recompute": "none"})
    assert (oom.status, oom.failure_class, oom.source) == ("infeasible", "oom", "replay")
    assert oom.metrics == {"peak_mem_gib": 130.5, "gpu_memory_gib": 139.8}
    assert "out of memory" in (oom.reason or "")
    inv = t.outcome({"micro_batch_size": 4, "recompute": "full"})
    assert (inv.status, inv.failure_class) == ("infeasible", "invalid")
    err = t.outcome({"micro_batch_size": 2, "recompute": "full"})
    assert (err.status, err.failure_class, err.reason) == ("failed", "error", "NCCL timeout")
    none = t.outcome({"micro_batch_size": 8, "recompute": "none"})
    assert (none.failure_class, none.reason) == (
        "invalid",
        "no measured row for this configuration",
    )


def test_to_space(table_path: Path) -> None:
    t = ReplayTable.load(table_path)
    sp = t.to_space(study="s", agent={"name": "grid", "seed": 3}, budget={"n_trials": 5})
    assert sp.model.activation == "swiglu" and sp.model.num_query_groups == 2
    assert (sp.semantics.global_batch_size, sp.semantics.seq_length) == (8, 128)
    assert (sp.semantics.steps, sp.semantics.precision) == (4, "bf16")
    assert sp.resources.gpu_memory_gib == 139.8 and sp.resources.features == []
    assert sp.workload.name == "replay" and sp.workload.table == str(table_path)
    assert sp.knobs["micro_batch_size"].values() == [1, 2, 4]
    assert sp.baseline() == {"micro_batch_size": 2, "recompute": "none"}
    assert (sp.agent.name, sp.agent.seed, sp.budget.n_trials) == ("grid", 3, 5)
    sp2 = t.to_space(baseline={"micro_batch_size": 1})
    assert sp2.baseline() == {"micro_batch_size": 1, "recompute": "none"}
    with pytest.raises(WorkloadError, match="not parameters"):
        t.to_space(baseline={"tp": 1})


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (["{not json"], r"t\.jsonl:1: not JSON"),
        ([_row(1, "none"), "[1, 2]"], r"t\.jsonl:2: a row must be a JSON object"),
        ([_row(1, "none", "weird")], r":1: 'status' must be one of"),
        ([{**_row(1, "none"), "metrics": {"tflops_per_gpu": 1.0}}], r":1: an ok row needs"),
        ([_row(1, "none", loss=[])], r":1: an ok row needs 'loss'"),
        ([{**_row(1, "none"), "params": {}}], r":1: 'params' must be a non-empty object"),
        (
            [_row(1, "none"), {**_row(2, "none"), "params": {"micro_batch_size": 2}}],
            r":2: parameters",
        ),
        ([""], r"no rows"),
    ],
)
def test_bad_tables(tmp_path: Path, lines: list[Any], match: str) -> None:
    p = _write(tmp_path / "t.jsonl", lines)
    with pytest.raises(WorkloadError, match=match):
        ReplayTable.load(p)


def test_missing_table(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="nope.jsonl: cannot read it"):
        ReplayTable.load(tmp_path / "nope.jsonl")


def _spec(tmp_path: Path, table: Path, params: dict[str, Any], delay: float = 0.0) -> TrialSpec:
    return TrialSpec(
        study="s",
        trial_number=0,
        params=params,
        model={},
        semantics={},
        world_size=1,
        device="cuda",
        metrics_path=str(tmp_path / "out" / "metrics.jsonl"),
        workload={"name": "replay", "table": str(table), "delay_s": delay},
    )


def test_trial_process_round_trip(tmp_path: Path, table_path: Path) -> None:
    t = ReplayTable.load(table_path)
    params = {"micro_batch_size": 2, "recompute": "none"}
    spec = _spec(tmp_path, table_path, params)
    (tmp_path / "trial.json").write_text(spec.model_dump_json())
    proc = subprocess.run(
        [sys.executable, "-m", "dse.workloads.replay", "--spec", str(tmp_path / "trial.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert read_metrics(spec.metrics_path) == t.outcome(params)


@pytest.mark.parametrize(
    "params",
    [
        {"micro_batch_size": 4, "recompute": "none"},
        {"micro_batch_size": 4, "recompute": "full"},
        {"micro_batch_size": 2, "recompute": "full"},
        {"micro_batch_size": 8, "recompute": "full"},
    ],
)
def test_failure_round_trip(tmp_path: Path, table_path: Path, params: dict[str, Any]) -> None:
    spec = _spec(tmp_path, table_path, params)
    assert run_trial(spec, sleep=lambda s: None) == 0
    assert read_metrics(spec.metrics_path) == ReplayTable.load(table_path).outcome(params)


def test_delay_is_spread_over_the_steps(tmp_path: Path, table_path: Path) -> None:
    slept: list[float] = []
    spec = _spec(tmp_path, table_path, {"micro_batch_size": 1, "recompute": "none"}, delay=2.0)
    assert run_trial(spec, sleep=slept.append) == 0
    assert slept == [0.5] * 4
    lines = [json.loads(x) for x in Path(spec.metrics_path).read_text().splitlines()]
    assert [x["type"] for x in lines] == ["step"] * 4 + ["summary"]
    assert all(x["source"] == "replay" for x in lines)


def test_bad_table_in_spec_writes_a_failure(tmp_path: Path) -> None:
    spec = _spec(tmp_path, tmp_path / "missing.jsonl", {"micro_batch_size": 1})
    assert run_trial(spec, sleep=lambda s: None) == 1
    out = read_metrics(spec.metrics_path)
    assert (
        out is not None and out.failure_class == "error" and "missing.jsonl" in (out.reason or "")
    )


def test_bad_spec_file(tmp_path: Path) -> None:
    from dse.workloads.replay import main

    (tmp_path / "trial.json").write_text("{}")
    assert main(["--spec", str(tmp_path / "trial.json")]) == 2


def test_per_step_times_and_repeated_measurements(tmp_path: Path) -> None:
    """A row's ``step_times_s`` become its steps' times (TFLOP/s in proportion); a
    configuration's k-th run (``workload.repeat``) answers with its k-th row, cycling."""
    first = _row(2, "none", tflops=120.0, step_times_s=[3.0, 1.5, 1.5, 1.2])
    second = _row(2, "none", tflops=118.0)
    path = _write(tmp_path / "rep.jsonl", [first, second, _row(1, "none")])
    t = ReplayTable.load(path)
    params = {"micro_batch_size": 2, "recompute": "none"}
    out = t.outcome(params)
    assert [s.step_time_s for s in out.steps] == [3.0, 1.5, 1.5, 1.2]
    assert [s.tflops_per_gpu for s in out.steps] == [60.0, 120.0, 120.0, 150.0]
    assert out.metrics["tflops_per_gpu"] == 120.0 and "step_times_s" not in out.metrics
    assert t.outcome(params, 1).metrics["tflops_per_gpu"] == 118.0
    assert t.outcome(params, 2).metrics["tflops_per_gpu"] == 120.0
    assert t.outcome({"micro_batch_size": 1, "recompute": "none"}, 5).ok
    spec = _spec(tmp_path, path, params).model_copy(
        update={"workload": {"name": "replay", "table": str(path), "repeat": 1}}
    )
    assert run_trial(spec, sleep=lambda s: None) == 0
    assert read_metrics(spec.metrics_path) == t.outcome(params, 1)


@pytest.mark.parametrize("times", [[1.0, 2.0], [1.0, 1.0, 1.0, -1.0], "fast", [1, 1, 1, True]])
def test_bad_step_times_name_the_row(tmp_path: Path, times: Any) -> None:
    path = _write(tmp_path / "bad.jsonl", [_row(1, "none"), _row(2, "none", step_times_s=times)])
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:2: 'step_times_s' must be a list"):
        ReplayTable.load(path)
