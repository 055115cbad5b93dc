"""A pruned trial through the REST API: counted and listed under its state, shown with its
figures and measurement, never the best, never on the Pareto front."""

from __future__ import annotations

from pathlib import Path

from dse.core.records import Outcome
from dse.storage import open_storage
from tests.api.conftest import make_client
from tests.api.seed import _run, create_study, ok

V1 = "/api/v1"


def pruned(tflops: float, mem: float) -> Outcome:
    base = ok(tflops, mem)
    m = {
        **base.metrics,
        "measurement": {
            "mode": "adaptive", "warmup_steps": 1, "measured_steps": 9,
            "stop_reason": "dominated", "dominated_by": {"trial": 0},
        },
        "step_time_ci_s": [0.49, 0.51],
        "tflops_per_gpu_ci": [tflops * 0.98, tflops * 1.02],
    }  # fmt: skip
    return Outcome("ok", m, steps=base.steps)


def test_a_pruned_trial_in_the_api(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    st = open_storage(url)
    try:
        sid = create_study(st, "pruning")
        _run(st, sid, {"tensor_model_parallel_size": 1, "micro_batch_size": 1}, ok(300.0, 60.0))
        # higher TFLOP/s and lower memory than the complete trial: still neither best nor front
        _run(st, sid, {"tensor_model_parallel_size": 2, "micro_batch_size": 1},
             pruned(320.0, 40.0))  # fmt: skip
    finally:
        st.close()
    with make_client(url) as c:
        s = c.get(f"{V1}/studies/pruning").json()
        assert s["counts"]["pruned"] == 1 and s["counts"]["complete"] == 1
        assert s["best_trial"] == 0 and s["best_value"] == 300.0
        page = c.get(f"{V1}/studies/pruning/trials", params={"state": "pruned"}).json()
        assert page["count"] == 1
        (t,) = page["data"]
        assert t["number"] == 1 and t["state"] == "pruned" and t["value"] == 320.0
        assert t["metrics"]["measurement"]["stop_reason"] == "dominated"
        assert t["metrics"]["tflops_per_gpu_ci"] == [320.0 * 0.98, 320.0 * 1.02]
        assert c.get(f"{V1}/studies/pruning/best").json()["trial"] == 0
        pareto = c.get(f"{V1}/studies/pruning/pareto").json()
        assert [p["number"] for p in pareto["front"]] == [0]
        kinds = {p["number"]: p["kind"] for p in pareto["points"]}
        assert kinds == {0: "complete", 1: "pruned"}
