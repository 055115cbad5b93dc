"""The built-in trainer behind a Megatron-LM command line (dse/workloads/megatron/mlm.py): the
lines it prints are Megatron-LM's, read back by dse's own Megatron-LM log parser
(dse/workloads/logs.py) figure for figure; run as the megatron_lm launcher renders it, it trains
on CPU and prints one iteration line per step; a configuration Megatron refuses ends in an
``AssertionError`` that the log classification reads as ``invalid`` with Megatron's message."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from dse.core.records import StepMetrics, TrialSpec
from dse.space.searchspace import SearchSpace, parse_space
from dse.workloads.launchers import launcher_for
from dse.workloads.logs import classify_failure, parse_log
from dse.workloads.megatron.mlm import _MegatronLog
from tests.conftest import EXAMPLES, REPO, needs_megatron

SEMANTICS = {"global_batch_size": 8, "steps": 12, "lr": 2.5e-4}


def _log(capsys: pytest.CaptureFixture[str], steps: list[Any]) -> str:
    spec = TrialSpec(study="s", trial_number=0, params={}, model={}, semantics=SEMANTICS,
                     world_size=1, device="cpu", metrics_path="unused.jsonl")  # fmt: skip
    log = _MegatronLog(spec)
    for m in steps:
        log.step(m)
    return capsys.readouterr().out


def test_iteration_lines_read_back_by_the_megatron_lm_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _log(
        capsys,
        [
            StepMetrics(step=0, step_time_s=0.5, tflops_per_gpu=0.00123456789,
                        peak_mem_gib=1.5, peak_reserved_gib=2.0, loss=10.375, grad_norm=3.25),
            StepMetrics(step=1, step_time_s=0.25, tflops_per_gpu=0.0025, peak_mem_gib=1.75,
                        peak_reserved_gib=2.5, loss=9.5),
        ],
    )  # fmt: skip
    lines = out.splitlines()
    assert len(lines) == 4  # an iteration line and a report_memory line per step
    assert "iteration        1/      12 |" in lines[0]  # Megatron-LM's widths (8 digits)
    assert (
        " consumed samples:            8 |" in lines[0]
        and "consumed samples:           16" in lines[2]
    )
    assert lines[1].startswith("[Rank 0] (after 1 iterations) memory (MB) | allocated: 1536.0 |")
    assert "grad norm" not in lines[2]  # none measured: none printed

    parsed = parse_log(out)  # the format is detected from the lines alone
    assert parsed.format == "megatron" and parsed.total_steps == 12 and parsed.failure is None
    assert [(s.step, s.step_time_s, s.loss, s.grad_norm) for s in parsed.steps] == [
        (1, 0.5, 10.375, 3.25), (2, 0.25, 9.5, None),
    ]  # fmt: skip
    assert parsed.steps[0].tflops_per_gpu == pytest.approx(0.00123456789, rel=1e-5)
    assert parsed.steps[1].tflops_per_gpu == 0.0025
    assert (parsed.peak_mem_gib, parsed.peak_reserved_gib) == (1.75, 2.5)  # the largest
    summary = parsed.summary(warmup_steps=1)
    assert summary["step_time_s"] == 0.25 and summary["loss"] == [10.375, 9.5]
    assert summary["tflops_per_gpu_log"] == 0.0025  # the log's figure, after the warm-up


def test_a_step_without_a_reserved_peak_prints_the_allocated_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A step line may leave the reserved peak out (it defaults to the allocated one)."""
    out = _log(capsys, [{"step": 3, "step_time_s": 1.0, "tflops_per_gpu": 1.0,
                         "peak_mem_gib": 0.5, "loss": 2.0}])  # fmt: skip
    assert "max allocated: 512.0 | reserved: 512.0 | max reserved: 512.0" in out
    parsed = parse_log(out, "megatron")
    assert [s.step for s in parsed.steps] == [4]
    assert (parsed.peak_mem_gib, parsed.peak_reserved_gib) == (0.5, 0.5)


def _space(**upd: Any) -> SearchSpace:
    """examples/tiny_gpt_cpu_megatron_lm.yaml on one CPU rank, two layers, three steps."""
    data = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu_megatron_lm.yaml").read_text())
    data["resources"]["world_size"] = 1
    data["model"]["num_layers"] = 2
    data["semantics"]["steps"] = 3
    data["knobs"] = {"micro_batch_size": {"values": [1, 4], "baseline": 4}}
    data["workload"]["launcher"].update(upd)
    return parse_space(data)


def _run(space: SearchSpace) -> subprocess.CompletedProcess[str]:
    """The command the megatron_lm launcher renders for the baseline, run as a trial runs it."""
    r = launcher_for(space).render(space.full_params(space.baseline()), python=sys.executable)
    argv = r.to_dict()["argv"]
    assert argv[argv.index("-m", 3) + 1] == "dse.workloads.megatron.mlm"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
@needs_megatron
def test_trains_on_cpu_behind_the_rendered_megatron_lm_command() -> None:
    proc = _run(_space())
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = parse_log(proc.stdout)
    assert parsed.format == "megatron" and parsed.failure is None, proc.stdout[-2000:]
    assert [s.step for s in parsed.steps] == [1, 2, 3] and parsed.total_steps == 3
    for s in parsed.steps:
        assert s.step_time_s and s.step_time_s > 0 and s.tflops_per_gpu and s.tflops_per_gpu > 0
        assert s.loss is not None and 0 < s.loss < 20  # ln(1024) = 6.9 at the start
    assert parsed.peak_mem_gib and parsed.peak_mem_gib > 0
    assert "consumed samples:            8 |" in proc.stdout  # GBS 8 per iteration


@pytest.mark.slow
@needs_megatron
def test_a_configuration_megatron_refuses_ends_in_its_assertion() -> None:
    """Expert parallelism 2 on one rank: the trainer's plan refuses it, and the entry prints
    the refusal as Megatron-LM's validate_args does (an AssertionError and its message),
    exit status 1, no iteration line."""
    proc = _run(_space(overrides={"--expert-model-parallel-size": 2}))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "iteration" not in proc.stdout
    assert "in validate_args" in proc.stderr
    found = classify_failure(proc.stderr)
    assert found is not None and found[0] == "invalid", proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("AssertionError: "))
    assert found[1] == line.removeprefix("AssertionError: ").strip() != ""
