"""The launcher trial process (dse.workloads.launchers.run): it runs the rendered command,
copies its output, parses it as it comes and writes the metrics contract. The "recipe" here
replays a real log (tests/fixtures/logs) with ``sh -c 'cat LOG; exit RC'``."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from dse.records import MetricsWriter, TrialSpec, read_metrics
from dse.workloads.launchers.run import main, run_rendered

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
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
    assert [s.tflops_per_gpu for s in o.steps] == [243.6, 238.7, 224.0]
    assert o.metrics["tflops_per_gpu"] == pytest.approx(238.7)
    assert o.metrics["step_time_s"] == pytest.approx(5.4707)
    assert o.metrics["tflops_source"] == "log" and o.metrics["env"] == {"DSE_TEST_RANK": "0"}
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
    assert any("dse.flops" in n for n in o.metrics["notes"])


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
    assert o.metrics["tflops_per_gpu"] == pytest.approx(24.7)
    assert o.metrics["peak_mem_gib"] == pytest.approx(13.367e9 / 2**30)
