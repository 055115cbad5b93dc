"""End to end on CPU: `dse start` runs real Megatron-Core trials (torchrun, gloo), stores
trials, per-step metrics and the best configuration; rejected configurations never run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dse.space.searchspace import params_key
from dse.storage import open_storage
from tests.conftest import EXAMPLES


def _dse(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dse.cli", *args], cwd=cwd, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


@pytest.mark.slow
def test_tiny_gpt_study_on_cpu(tmp_path: Path) -> None:
    space = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    space["budget"]["n_trials"] = 3
    space["semantics"]["steps"] = 3
    space["runner"]["workdir"] = str(tmp_path / "runs")
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    r = _dse("start", "--space", str(p), "--storage", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "3/3 done" in r.stderr  # the progress display

    st = open_storage(url)
    try:
        study = st.get_study("tiny-gpt-cpu")
        trials = st.list_trials(study.id, with_steps=True)
    finally:
        st.close()
    # the 3 trials of the budget, then up to budget.remeasure (2) re-measures of configurations
    # tied within noise with the best (CPU step times are noisy)
    proposed = [t for t in trials if t.remeasure_of is None]
    again = [t for t in trials if t.remeasure_of is not None]
    assert [t.number for t in proposed] == [0, 1, 2] and len(again) <= 2
    assert all(t.remeasure_of in (0, 1, 2) and t.params == trials[t.remeasure_of].params
               for t in again)  # fmt: skip
    assert trials[0].params == {
        "tensor_model_parallel_size": 1,
        "micro_batch_size": 1,
        "recompute": "none",
        "attention_backend": "unfused",
        "use_distributed_optimizer": False,
    }  # fmt: skip  (the baseline first)
    for t in trials:
        assert t.state == "complete", (t.failure_class, t.reason)
        assert t.source == "measured"
        assert t.metrics["tflops_per_gpu"] > 0
        assert t.metrics["device"] == "cpu"
        assert len(t.steps) == 3
        assert all(s.step_time_s > 0 and s.loss > 0 for s in t.steps)
        assert Path(t.log_path or "").exists()
        # execution knobs only (fp32): every loss curve within the guard's tolerance
        assert t.metrics["numerics"]["status"] == ("baseline" if t.number == 0 else "ok")
        assert t.metrics["numerics"]["baseline_trial"] == 0
    # the same seeded global batches for every configuration: the first loss agrees
    first = [t.steps[0].loss for t in trials]
    assert max(first) - min(first) < 1e-3

    best = _dse("best", "--storage", url, "--format", "json", cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    payload = json.loads(best.stdout)
    assert payload["study"] == "tiny-gpt-cpu"
    assert payload["trial"] in (0, 1, 2)
    for k in ("tflops_per_gpu", "peak_mem_gib", "step_time_s", "loss"):
        assert payload["metrics"][k] > 0
    # the best configuration's figure is pooled over its trials, with an interval
    pooled = [
        t.metrics["tflops_per_gpu"] for t in trials if t.number in payload["noise"]["trials"]
    ]
    assert payload["objective"]["value"] == pytest.approx(sum(pooled) / len(pooled))
    lo, hi = payload["noise"]["figures"]["tflops_per_gpu"]["ci"]
    assert lo <= payload["objective"]["value"] <= hi

    status = _dse("status", "--storage", url, "--format", "json", cwd=tmp_path)
    s = json.loads(status.stdout)
    assert s["counts"]["complete"] == len(trials) and len(s["trials"]) == len(trials)
    assert s["numerics"]["counts"]["changed"] == 0


def test_invalid_configurations_never_launch(tmp_path: Path) -> None:
    """Grid over a space where a configuration breaks GBS % (MBS*DP): every valid one runs
    (sim workload, an estimate), the invalid one never runs (the grid samples within the
    rules; what reaches the screen anyway is a stored rejection)."""
    space = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    space["knobs"] = {
        "tensor_model_parallel_size": {"values": [1, 2]},
        "micro_batch_size": {"values": [1, 2, 4, 8]},
    }
    space["workload"] = {"name": "sim"}
    space["agent"] = {"name": "grid"}
    space["budget"] = {"n_trials": 20}
    space["runner"] = {"name": "local", "max_parallel": 2, "workdir": str(tmp_path / "r")}
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    r = _dse("start", "--space", str(p), "--storage", url, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    st = open_storage(url)
    try:
        study = st.get_study("tiny-gpt-cpu")
        trials = st.list_trials(study.id)
        rejections = st.list_rejections(study.id)
    finally:
        st.close()
    # world 2: TP1 -> DP2, MBS 8 breaks 8 % (8*2); TP2 -> DP1, all MBS fit
    bad = {params_key({"tensor_model_parallel_size": 1, "micro_batch_size": 8})}
    assert {t.params_key for t in trials}.isdisjoint(bad)
    assert {r.params_key for r in rejections} <= bad
    assert len(trials) == 7  # every valid configuration, once
    assert all(t.source == "estimate" for t in trials)  # the simulator says so
