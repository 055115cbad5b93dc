"""The launcher trial process (dse.workloads.launchers.run): it runs the rendered command,
copies its output, parses it as it comes and writes the metrics contract. The "recipe" here
replays a real log (tests/fixtures/logs) with ``sh -c 'cat LOG; exit RC'``."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from dse.core.records import MetricsWriter, TrialSpec, read_metrics
from dse.workloads.launchers.run import main, run_rendered
from tests.conftest import LOGS

MODEL = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
         "ffn_hidden_size": 14336, "vocab_size": 32000}  # fmt: skip
SEM = {"global_batch_size": 128, "seq_length": 4096, "steps": 100, "warmup_steps": 1}


def _spec(tmp_path: Path, log: str, rc: int = 0, fmt: str = "auto", **env: str) -> TrialSpec:
    cmd = f"cat {LOGS / log}; echo done on rank $DSE_TEST_RANK; exit {rc}"
    return TrialSpec(
        study="s", trial_number=0, params={"micro_batch_size": 1}, model=MODEL, semantics=SEM,
        world_size=16, device="cuda", metrics_path=str(tmp_path / "metrics.jsonl"),
        workload={"name": "megatron_lm", "rendered": {
            "launcher": "megatron_lm", "argv": ["sh", "-c", cmd], "env": dict(env),
            "log_format": fmt, "world_size": 16, "node_step_names": [],
        }},
    )  # fmt: skip


def test_figures_of_a_real_log_become_the_metrics_contract(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "megatron_mixtral_16xh100.log", DSE_TEST_RANK="0")
    out = io.StringIO()
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), out) == 0
    assert "done on rank 0" in out.getvalue()  # the environment reached the recipe
    assert "iteration       72/     100" in out.getvalue()  # the log is copied through
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok
    assert [s.loss for s in o.steps] == [1.818812, 1.820313, 1.798953]
    # one FLOP definition: dse's model FLOPs over the logged step time; the log's own
    # TFLOP/s only beside it
    flops = o.metrics["model_flops_per_step"]
    times = [5.3616, 5.4707, 5.8299]
    assert [s.tflops_per_gpu for s in o.steps] == pytest.approx(
        [flops / (t * 16e12) for t in times]
    )
    assert o.metrics["step_time_s"] == pytest.approx(5.4707)
    assert o.metrics["tflops_per_gpu"] == pytest.approx(flops / (5.4707 * 16e12))
    assert o.metrics["tflops_per_gpu_log"] == pytest.approx(238.7)
    assert "throughput per GPU" in o.metrics["tflops_log_source"]
    assert o.metrics["step_time_s_log"] == pytest.approx(5.4707)
    assert o.metrics["tflops_source"] == "computed" and o.metrics["env"] == {"DSE_TEST_RANK": "0"}
    assert o.metrics["tokens_per_s_per_gpu"] == pytest.approx(128 * 4096 / (5.4707 * 16))


def test_no_tflops_in_the_log_computed_and_said_so(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "nemo_bionemo_esm2.log")
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 0
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and o.metrics["tflops_source"] == "computed"
    flops = o.metrics["model_flops_per_step"]
    assert o.metrics["tflops_per_gpu"] == pytest.approx(
        flops / (o.metrics["step_time_s"] * 16 * 1e12)
    )
    assert "tflops_per_gpu_log" not in o.metrics  # the log prints none


@pytest.mark.parametrize(
    ("log", "cls", "words"),
    [("cuda_oom.log", "oom", "CUDA out of memory"),
     ("nccl_timeout_ranks.log", "hang", "Watchdog caught collective operation timeout")],
)  # fmt: skip
def test_a_failed_recipe_is_classified_from_its_log(
    tmp_path: Path, log: str, cls: str, words: str
) -> None:
    spec = _spec(tmp_path, log, rc=1)
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 3
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.failure_class == cls and words in (o.reason or "")


def test_exit_zero_without_iterations_is_an_error(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "nccl_timeout_ranks.log", rc=0)
    spec.workload["rendered"]["argv"] = ["sh", "-c", "echo nothing to see"]
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 3
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.failure_class == "error" and "no iteration line" in (o.reason or "")


def test_missing_recipe_command(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "cuda_oom.log")
    spec.workload["rendered"]["argv"] = [str(tmp_path / "no-such-launcher")]
    p = tmp_path / "trial.json"
    p.write_text(spec.model_dump_json())
    assert main(["--spec", str(p)]) == 3
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.failure_class == "error" and "cannot start the recipe" in o.reason


def test_module_runs_as_the_trial_command(tmp_path: Path) -> None:
    import subprocess

    spec = _spec(tmp_path, "bridge_evo2.log")
    p = tmp_path / "trial.json"
    p.write_text(spec.model_dump_json())
    r = subprocess.run([sys.executable, "-m", "dse.workloads.launchers.run", "--spec", str(p)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and o.metrics["log_format"] == "bridge"
    assert o.metrics["tflops_per_gpu_log"] == pytest.approx(24.7)
    assert o.metrics["tflops_per_gpu"] == pytest.approx(
        o.metrics["model_flops_per_step"] / (7.0373 * 16e12)
    )
    assert o.metrics["peak_mem_gib"] == pytest.approx(13.367e9 / 2**30)


# --- adaptive trial length and early stop on the parsed step series ----------------------------

FAKE_RECIPE = Path(__file__).resolve().parent / "fake_recipe.py"


def _fake_spec(
    tmp_path: Path,
    *,
    iters: int = 300,
    measurement: dict | None = None,
    prune: dict | None = None,
    **recipe: object,
) -> TrialSpec:
    argv = [sys.executable, str(FAKE_RECIPE), "--iters", str(iters),
            "--pidfile", str(tmp_path / "child.pid")]  # fmt: skip
    for k, v in recipe.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return TrialSpec(
        study="s", trial_number=0, params={}, model=MODEL,
        semantics={"global_batch_size": 8, "seq_length": 4096, "steps": iters, "warmup_steps": 2},
        world_size=1, device="cuda", metrics_path=str(tmp_path / "metrics.jsonl"),
        workload={"name": "megatron_lm", "rendered": {
            "launcher": "megatron_lm", "argv": argv, "env": {}, "log_format": "megatron",
            "world_size": 1, "node_step_names": [],
        }},
        measurement=measurement, prune=prune,
    )  # fmt: skip


def _gone(pid: int, within_s: float = 5.0) -> bool:
    import os
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a killed process nobody has reaped yet (a zombie) is gone too
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            pass
        time.sleep(0.05)
    return False


def test_adaptive_stops_the_recipe_once_converged(tmp_path: Path) -> None:
    m = {"mode": "adaptive", "min_steps": 10, "max_steps": 250, "rel_halfwidth": 0.01}
    spec = _fake_spec(tmp_path, measurement=m)
    out = io.StringIO()
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), out) == 0
    assert "dse: stopping the recipe after" in out.getvalue()
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and not o.pruned
    meas = o.metrics["measurement"]
    assert meas["mode"] == "adaptive" and meas["stop_reason"] == "converged"
    assert 10 <= len(o.steps) < 60  # 1% noise: converged long before the 300 iterations
    assert meas["warmup_steps"] >= 2  # the 10x and 2x first iterations are warm-up
    assert meas["warmup_steps"] + meas["measured_steps"] == len(o.steps)
    lo, hi = o.metrics["step_time_ci_s"]
    t = o.metrics["step_time_s"]
    assert lo <= t <= hi and (hi - lo) / 2 <= 0.01 * t
    assert o.metrics["step_time_s"] == pytest.approx(0.1, rel=0.02)  # the steady state
    tlo, thi = o.metrics["tflops_per_gpu_ci"]
    assert tlo <= o.metrics["tflops_per_gpu"] <= thi
    flops = o.metrics["model_flops_per_step"]
    assert o.metrics["tflops_per_gpu"] == pytest.approx(flops / (t * 1e12), rel=1e-6)
    # the whole process group of the recipe is gone, its child included
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_noisy_recipe_is_stopped_at_max_steps(tmp_path: Path) -> None:
    # a recipe that would run 300 iterations (its own count, not dse's): stopped at 25
    m = {"mode": "adaptive", "min_steps": 10, "max_steps": 25, "rel_halfwidth": 0.01}
    spec = _fake_spec(tmp_path, measurement=m, cv=0.3, sleep=0.01)
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 0
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and len(o.steps) == 25
    assert o.metrics["measurement"]["stop_reason"] == "max_steps"
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_a_dominated_recipe_is_stopped_and_recorded_pruned(tmp_path: Path) -> None:
    m = {"mode": "adaptive", "min_steps": 10, "max_steps": 250, "prune": True}
    from dse.model.flops import model_flops_per_step

    # the fake recipe's steady 0.1 s step, in dse's TFLOP/s; the study's best is 1.5x that
    tf = model_flops_per_step(MODEL, {"global_batch_size": 8, "seq_length": 4096}) / 0.1e12
    best = {"metric": "tflops_per_gpu", "direction": "maximize", "best": 1.5 * tf,
            "bound": 1.45 * tf, "margin": 0.05, "best_trial": 4}  # fmt: skip
    spec = _fake_spec(tmp_path, measurement=m, prune=best, cv=0.05)
    out = io.StringIO()
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), out) == 0
    assert "(dominated)" in out.getvalue()
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and o.pruned
    assert o.metrics["measurement"]["dominated_by"]["trial"] == 4
    assert 10 <= len(o.steps) < 40 and o.metrics["tflops_per_gpu_ci"][1] < 1.45 * tf * 0.95
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_fixed_window_records_its_interval(tmp_path: Path) -> None:
    spec = _fake_spec(tmp_path, iters=12, sleep=0.0)
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 0
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and len(o.steps) == 12
    meas = o.metrics["measurement"]
    assert meas == {**meas, "mode": "fixed", "warmup_steps": 2, "measured_steps": 10,
                    "stop_reason": "fixed"}  # fmt: skip
    lo, hi = o.metrics["step_time_ci_s"]
    assert lo <= o.metrics["step_time_s"] <= hi


def test_a_recipe_slow_to_exit_after_its_last_step_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream pretrain_gpt.py sat 32 s after its last iteration: dse ends it, the trial is
    complete (not a failure of the signal) and says so; its process group is gone."""
    import dse.workloads.launchers.run as run_mod

    monkeypatch.setattr(run_mod, "EXIT_GRACE_S", 0.5)
    spec = _fake_spec(tmp_path, iters=12, sleep=0.0, exit_hang=300)
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 0
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and len(o.steps) == 12
    assert any("dse ended it" in n for n in o.metrics["notes"])
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_a_recipe_that_exits_promptly_is_not_ended(tmp_path: Path) -> None:
    spec = _fake_spec(tmp_path, iters=12, sleep=0.0)
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 0
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok
    assert not any("dse ended it" in n for n in o.metrics["notes"])


def test_the_runners_stop_reaches_the_recipes_group(tmp_path: Path) -> None:
    """A recipe that may be stopped early runs in its own process group; SIGTERM to the
    trial process (what a runner's stop sends) ends that group too."""
    import os
    import signal
    import subprocess
    import time

    m = {"mode": "adaptive", "min_steps": 10, "max_steps": 250, "rel_halfwidth": 1e-6}
    spec = _fake_spec(tmp_path, measurement=m, sleep=0.05)
    p = tmp_path / "trial.json"
    p.write_text(spec.model_dump_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.workloads.launchers.run", "--spec", str(p)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        pidfile = tmp_path / "child.pid"
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pidfile.read_text())
        assert os.getpgid(child) != proc.pid  # the recipe's own group
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) != 0
        assert _gone(child)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
