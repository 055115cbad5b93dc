"""The sim workload writes the metrics JSONL contract, read back as source "estimate"."""

from __future__ import annotations

import json
import subprocess
import sys

from dse.records import TrialSpec, read_metrics
from dse.workloads import sim

MODEL = {
    "num_layers": 16, "hidden_size": 2048, "num_attention_heads": 16, "num_query_groups": 8,
    "ffn_hidden_size": 5632, "vocab_size": 32000,
}  # fmt: skip
SEMANTICS = {"global_batch_size": 8, "seq_length": 4096, "steps": 4, "warmup_steps": 1}


def _spec(tmp_path, params, workload=None) -> str:
    spec = TrialSpec(
        study="s", trial_number=3, params=params, model=MODEL, semantics=SEMANTICS,
        world_size=1, device="cuda", metrics_path=str(tmp_path / "metrics.jsonl"),
        workload=workload or {"name": "sim"},
    )  # fmt: skip
    path = tmp_path / "trial.json"
    path.write_text(spec.model_dump_json())
    return str(path)


def test_ok_trial_round_trip(tmp_path):
    spec = _spec(tmp_path, {"micro_batch_size": 2, "recompute": "selective"})
    assert sim.main(["--spec", spec, "--gpu", "NVIDIA H200", "--gpu-memory-gib", "139.8"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["type"] for x in lines] == ["step"] * 4 + ["summary"]
    assert all(x["source"] == "estimate" for x in lines)
    out = read_metrics(tmp_path / "metrics.jsonl")
    assert out is not None and out.ok and out.source == "estimate"
    assert len(out.steps) == 4
    assert out.metrics["tflops_per_gpu"] > 0 and out.metrics["peak_mem_gib"] > 10


def test_predicted_oom_is_a_failure_line(tmp_path):
    spec = _spec(
        tmp_path, {"micro_batch_size": 8},
        workload={"name": "sim", "gpu": "NVIDIA H200", "gpu_memory_gib": 139.8},
    )  # fmt: skip
    assert sim.main(["--spec", spec]) == 0
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["type"] == "failure"
    assert lines[0]["failure_class"] == "oom" and lines[0]["reason"].startswith("predicted")
    out = read_metrics(tmp_path / "metrics.jsonl")
    assert out is not None and not out.ok
    assert out.failure_class == "oom" and out.source == "estimate"
    assert out.metrics["peak_mem_gib"] > 139.8


def test_without_capacity_everything_fits(tmp_path, monkeypatch):
    monkeypatch.delenv("DSE_SIM_GPU_MEMORY_GIB", raising=False)
    spec = _spec(tmp_path, {"micro_batch_size": 8})
    assert sim.main(["--spec", spec]) == 0
    out = read_metrics(tmp_path / "metrics.jsonl")
    assert out is not None and out.ok and out.source == "estimate"


def test_capacity_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DSE_SIM_GPU_MEMORY_GIB", "80")
    spec = _spec(tmp_path, {"micro_batch_size": 4})
    assert sim.main(["--spec", spec]) == 0
    out = read_metrics(tmp_path / "metrics.jsonl")
    assert out is not None and out.failure_class == "oom"


def test_bad_spec_returns_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert sim.main(["--spec", str(bad)]) == 2
    assert "bad trial spec" in capsys.readouterr().err


def test_runs_as_a_module(tmp_path):
    spec = _spec(tmp_path, {"micro_batch_size": 1, "attention_backend": "sdpa"})
    proc = subprocess.run(
        [sys.executable, "-m", "dse.workloads.sim", "--spec", spec],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = read_metrics(tmp_path / "metrics.jsonl")
    assert out is not None and out.ok and out.source == "estimate"
