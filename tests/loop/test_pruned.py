"""Early stop of dominated trials through the whole loop: the controller passes the study's
best into each trial spec, a trial whose interval lies clearly below it stops and is stored
``pruned`` with its figures, status shows it, ``best`` never names it, and a resumed study
tells the agent the pruned trials as measured values. Real trial processes of the sim
workload (cost-model estimates with a labelled synthetic series), real SQLite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
from dse.core.records import TrialSpec
from dse.storage import open_storage

SPACE = """
version: 1
study: prune-sim
model:
  num_layers: 16
  hidden_size: 2048
  num_attention_heads: 16
  num_query_groups: 8
  ffn_hidden_size: 5632
  vocab_size: 32000
semantics: {global_batch_size: 8, seq_length: 4096, steps: 6, warmup_steps: 2}
resources: {world_size: 1, gpu: NVIDIA H200, gpu_memory_gib: 139.8, features: []}
knobs:
  # full recompute is ~30% slower than none on the cost model: clearly dominated
  recompute: {values: [none, full], baseline: none}
  micro_batch_size: {values: [1, 2], baseline: 2}
objective: {metric: tflops_per_gpu, direction: maximize}
budget: {n_trials: 3, trial_timeout_s: 60, hang_timeout_s: 30}
agent: {name: grid}
workload: {name: sim}
measurement: {mode: adaptive, min_steps: 6, max_steps: 30, prune: true, prune_margin: 0.05}
"""


def test_dominated_trials_are_pruned_and_never_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = yaml.safe_load(SPACE)
    d["runner"] = {"name": "local", "workdir": str(tmp_path / "runs")}
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(d))
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert main(["start", "--space", str(space), "--storage", url]) == 0
    err = capsys.readouterr().err
    assert "trial 2 pruned (tflops_per_gpu=" in err and "1 pruned" in err

    # the trial spec carried the best when it started (trial 0: the baseline)
    spec = TrialSpec.model_validate_json((tmp_path / "runs/prune-sim/trial-00002/trial.json")
                                         .read_text())  # fmt: skip
    assert spec.measurement is not None and spec.measurement["mode"] == "adaptive"
    assert spec.prune is not None and spec.prune["best_trial"] in (0, 1)
    assert spec.prune["metric"] == "tflops_per_gpu" and spec.prune["margin"] == 0.05
    assert spec.prune["bound"] <= spec.prune["best"]  # the best's lower interval bound

    st = open_storage(url)
    try:
        study = st.get_study("prune-sim")
        trials = {t.number: t for t in st.list_trials(study.id, with_steps=True)}
        assert [trials[n].state for n in range(3)] == ["complete", "complete", "pruned"]
        p = trials[2]
        assert p.params["recompute"] == "full" and p.value is not None and p.value > 0
        m = p.metrics["measurement"]
        assert m["stop_reason"] == "dominated" and m["series"] == "synthetic"
        assert m["dominated_by"]["trial"] == spec.prune["best_trial"]
        assert 6 <= len(p.steps) < 30  # stopped soon after min_steps, long before max_steps
        lo, hi = p.metrics["tflops_per_gpu_ci"]
        assert hi < m["dominated_by"]["threshold"] and lo <= p.value <= hi
        for t in (trials[0], trials[1]):  # the complete ones ran until converged
            assert t.metrics["measurement"]["stop_reason"] == "converged"
            assert 6 <= len(t.steps) <= 30 and "step_time_ci_s" in t.metrics
        best = st.best_trial(study.id, "maximize")
        assert best is not None and best.state == "complete" and best.number != 2
    finally:
        st.close()

    assert main(["status", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "2 complete" in out and "1 pruned" in out
    assert "pruned     " in out and "dominated by trial" in out
    assert main(["status", "--storage", url, "--format", "json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counts"]["pruned"] == 1 and status["best"]["number"] != 2
    assert main(["best", "--storage", url, "--study", "prune-sim"]) == 0
    assert json.loads(capsys.readouterr().out)["trial"] != 2

    # resume with a larger budget: the agent is restored with the pruned trial as a measured
    # value (the grid never proposes it again) and the last configuration runs
    assert main(["resume", "--study", "prune-sim", "--storage", url, "--n-trials", "4"]) == 0
    st = open_storage(url)
    try:
        study = st.get_study("prune-sim")
        trials = st.list_trials(study.id)
        assert len(trials) == 4 and len({t.params_key for t in trials}) == 4
        assert st.count_trials(study.id)["pruned"] == 2  # full recompute, the other MBS
    finally:
        st.close()
