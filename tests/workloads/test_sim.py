"""The sim workload writes the metrics JSONL contract, read back as source "estimate"."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from dse.core.records import TrialSpec, read_metrics
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


# --- the simulated loss (issue 15's loss-parity guard and the loss curves read it) -------------

#: Execution-only knob settings: a layout, the micro-batch size, recompute and fusions.
EXECUTION = [
    {"micro_batch_size": 1, "recompute": "selective"},
    {"micro_batch_size": 4, "recompute": "full"},
    {"micro_batch_size": 2, "tensor_model_parallel_size": 2, "sequence_parallel": True},
    {"micro_batch_size": 1, "pipeline_model_parallel_size": 2, "recompute": "none"},
    {"micro_batch_size": 2, "bias_activation_fusion": True, "cross_entropy_loss_fusion": True,
     "attention_backend": "flash"},
]  # fmt: skip


def _losses(tmp_path, params, semantics=None, world_size=4) -> tuple[list[float], list[float]]:
    """(per-step losses, the summary's losses) of a simulated trial."""
    spec = TrialSpec(
        study="s", trial_number=0, params=params, model=MODEL,
        semantics={**SEMANTICS, **(semantics or {})}, world_size=world_size, device="cuda",
        metrics_path=str(tmp_path / "m.jsonl"), workload={"name": "sim"},
    )  # fmt: skip
    lines = sim.simulate(spec, "NVIDIA H200", None)
    steps = [x.loss for x in lines if x.type == "step"]
    summary = next(x for x in lines if x.type == "summary")
    assert summary.model_dump()["loss_model"] == "simulated" and summary.source == "estimate"
    return steps, list(summary.model_dump()["losses"])


def test_sim_loss_is_a_plausible_decreasing_curve(tmp_path):
    steps, summary = _losses(tmp_path, EXECUTION[0], {"steps": 60})
    assert steps == summary and len(steps) == 60
    assert all(x > 0 for x in steps)
    # a randomly initialised model: about ln(vocab) at the start
    assert math.log(32000) - 0.2 < steps[0] < math.log(32000) + 1.0
    # decreasing on average: the last ten steps well below the first ten, a negative slope
    assert sum(steps[-10:]) / 10 < sum(steps[:10]) / 10 - 0.2
    mx, my = (len(steps) - 1) / 2, sum(steps) / len(steps)
    slope = sum((i - mx) * (y - my) for i, y in enumerate(steps))
    assert slope < 0
    # deterministic
    assert _losses(tmp_path, EXECUTION[0], {"steps": 60})[0] == steps


def test_sim_loss_is_the_same_for_every_execution_knob(tmp_path):
    curves = [_losses(tmp_path, p)[0] for p in EXECUTION]
    assert all(c == curves[0] for c in curves), curves
    assert len(set(curves[0])) == len(curves[0])  # not a constant


def test_sim_loss_follows_what_defines_the_training(tmp_path):
    from dse.stats.numerics import floor_of, judge, tolerance_of

    base = _losses(tmp_path, EXECUTION[0])[0]
    tol = tolerance_of(floor_of(None, "bf16"), 3.0, [])
    for change in (
        {"data": {"kind": "synthetic", "seed": 99}},
        {"seed": 7},
        {"global_batch_size": 16},
        {"seq_length": 2048},
        {"precision": "fp16"},
        {"lr": 3e-4},
    ):
        other = _losses(tmp_path, EXECUTION[1], change)[0]
        assert other != base, change
        if "data" in change:  # another data seed: the loss-parity guard flags it
            v = judge(dict(enumerate(other)), dict(enumerate(base)), baseline_trial=0, tol=tol)
            assert v["status"] == "changed", v
    # more steps or another warm-up do not change the loss of the steps both run
    longer = _losses(tmp_path, EXECUTION[2], {"steps": 8, "warmup_steps": 3})[0]
    assert longer[:4] == base
    # another model size: another curve
    spec = TrialSpec(
        study="s", trial_number=0, params=EXECUTION[0], model={**MODEL, "num_layers": 8},
        semantics=SEMANTICS, world_size=4, device="cuda",
        metrics_path=str(tmp_path / "m.jsonl"), workload={"name": "sim"},
    )  # fmt: skip
    small = [x.loss for x in sim.simulate(spec, "NVIDIA H200", None) if x.type == "step"]
    assert small != base


def test_a_sim_study_flags_no_execution_knob_and_says_its_losses_are_simulated(tmp_path, capsys):
    """The Bridge-style 16-knob sim space through ``dse start``: every trial's loss is
    compared with the baseline's over every step (non-zero losses, drift 0: nothing flagged),
    and ``dse status`` says the figures and losses are estimates."""
    from dse.cli.main import main
    from dse.storage import open_storage
    from tests.conftest import EXAMPLES

    url = f"sqlite:///{tmp_path / 'sim.db'}"
    argv = ["start", "--space", str(EXAMPLES / "bridge_moe_sim.yaml"), "--storage", url,
            "--workdir", str(tmp_path / "runs"), "--n-trials", "8"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    with open_storage(url) as st:
        sid = st.get_study("bridge-moe-sim").id
        trials = st.list_trials(sid, with_steps=True)
    done = [t for t in trials if t.state == "complete"]
    assert len(done) >= 6 and len({t.params_key for t in done}) == len(done)
    curves = {tuple(s.loss for s in t.steps) for t in done}
    assert len(curves) == 1 and all(x > 1 for x in next(iter(curves)))
    verdicts = [t.metrics["numerics"] for t in done]
    assert sorted(v["status"] for v in verdicts) == ["baseline"] + ["ok"] * (len(done) - 1)
    assert all(v["drift"] == 0 and v["steps_compared"] == 6 for v in verdicts)
    assert all(t.source == "estimate" and t.metrics["loss_model"] == "simulated" for t in done)

    assert main(["status", "--storage", url]) == 0
    text = capsys.readouterr().out
    assert f"loss parity: {len(done) - 1} ok, 0 numerics changed" in text
    assert "losses of sim trials are simulated (cost model), not trained" in text
    best = next(x for x in text.splitlines() if x.strip().startswith("best: trial"))
    assert "(estimates: cost model, not measured)" in best

    # the API's loss curves say where the losses come from
    from tests.api.conftest import make_client

    with make_client(url) as client:
        r = client.get("/api/v1/studies/bridge-moe-sim/losses?trials=1&trials=2").json()
    assert [c["source"] for c in r["curves"]] == ["estimate"] * 3
