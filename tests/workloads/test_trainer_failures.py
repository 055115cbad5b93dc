"""How the built-in trainer classifies what goes wrong: only Megatron-Core's own refusals are
``invalid`` (they teach the agent an infeasible region); a failure of dse's own code while it
builds the model is an ``error``; a trial stopped by SIGTERM or SIGINT before it ends is
``interrupted``, unless the runner or the scheduler that stopped it knows better (its
timeout, a preemption)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dse.core.records import MetricsWriter, Outcome, StepMetrics, TrialSpec, read_metrics
from dse.runners import Launch
from dse.runners._cluster import outcome_after_exit
from dse.runners.local import LocalRunner
from tests.conftest import needs_megatron

MODEL = {
    "num_layers": 2,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "ffn_hidden_size": 64,
    "vocab_size": 256,
}


def _spec(tmp: Path, name: str, steps: int = 3) -> Path:
    spec = TrialSpec(
        study="t",
        trial_number=0,
        params={},
        model=MODEL,
        semantics={"global_batch_size": 2, "seq_length": 16, "steps": steps, "warmup_steps": 1},
        world_size=1,
        device="cpu",
        metrics_path=str(tmp / f"{name}.jsonl"),
    )
    path = tmp / f"{name}.json"
    path.write_text(spec.model_dump_json())
    return path


#: The trainer's ``main`` with its layer-spec step replaced by ``BODY`` (a function of the
#: plan): what a bug of dse's own build code, or a refusal Megatron-Core raises, looks like.
DRIVER = """
import sys
import dse.workloads.megatron.trainer as trainer

def layer_spec(plan):
{body}

trainer.layer_spec = layer_spec
sys.exit(trainer.main(["--spec", sys.argv[1]]))
"""


def _run_patched(tmp: Path, body: str) -> Outcome:
    spec = _spec(tmp, "patched")
    code = DRIVER.format(body=body)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(spec)], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    out = read_metrics(tmp / "patched.jsonl")
    assert out is not None, proc.stderr[-3000:]
    assert proc.returncode != 0
    return out


@pytest.mark.slow
@needs_megatron
def test_a_dse_bug_while_building_the_model_is_an_error(tmp_path: Path) -> None:
    out = _run_patched(tmp_path, "    raise ValueError('a bug in dse build code')")
    assert out.failure_class == "error" and out.status == "failed", out.reason
    assert "a bug in dse build code" in (out.reason or "")


@pytest.mark.slow
@needs_megatron
def test_megatron_cores_own_refusal_while_building_is_invalid(tmp_path: Path) -> None:
    # megatron.core.utils.divide asserts divisibility: a refusal raised in Megatron-Core
    body = "    from megatron.core.utils import divide\n    divide(3, 2)"
    out = _run_patched(tmp_path, body)
    assert out.failure_class == "invalid" and out.status == "infeasible", out.reason
    assert "3 is not divisible by 2" in (out.reason or "")


def _kind(line: str) -> str | None:
    try:
        return str(json.loads(line).get("type"))
    except ValueError:  # a line being written
        return None


def _wait_for_a_step(path: Path, proc: subprocess.Popen[bytes], limit_s: float = 240) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if any(
            _kind(x) == "step" for x in (path.read_text() if path.exists() else "").splitlines()
        ):
            return
        assert proc.poll() is None, "the trial ended before its first step"
        time.sleep(0.2)
    raise AssertionError("no step within the limit")


@pytest.mark.slow
@needs_megatron
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_trial_stopped_by_a_signal_is_interrupted(tmp_path: Path, sig: int) -> None:
    spec = _spec(tmp_path, "long", steps=100_000)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "dse.workloads.megatron.trainer", "--spec", str(spec)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_a_step(tmp_path / "long.jsonl", proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = read_metrics(tmp_path / "long.jsonl")
    assert out is not None, err.decode()[-3000:]
    assert out.failure_class == "interrupted" and out.status == "failed", out.reason
    assert signal.Signals(sig).name in (out.reason or "")
    assert out.steps, "the steps measured before the stop are kept"


def _interrupted_file(path: Path) -> None:
    w = MetricsWriter(path)
    w.step(StepMetrics(0, 1.0, 1.0, 1.0, 1.0, 5.0))
    w.failure("interrupted", "stopped by SIGTERM before the trial ended")


def _launch(tmp: Path, argv: list[str] | None = None, timeout_s: float = 3600) -> Launch:
    return Launch(
        trial_id=1, number=1, argv=argv or [], trial_dir=tmp, metrics_path=tmp / "m.jsonl",
        log_path=tmp / "log.txt", world_size=1, device="cpu", env={}, timeout_s=timeout_s,
        hang_timeout_s=3600,
    )  # fmt: skip


def test_a_schedulers_class_wins_over_the_trials_interrupted_line(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    _interrupted_file(launch.metrics_path)
    out = outcome_after_exit(launch, "preempted", "slurm job 7 ended PREEMPTED")
    assert out.failure_class == "preempted"
    assert "slurm job 7 ended PREEMPTED; the trial: stopped by SIGTERM" in (out.reason or "")
    assert len(out.steps) == 1
    # without a class from the scheduler the trial's own word stands
    assert outcome_after_exit(launch, None, "exited 3").failure_class == "interrupted"


#: A trial process that takes its time and, stopped by SIGTERM, writes an ``interrupted``
#: line (as the built-in trainer does).
SLOW_TRIAL = """
import signal, sys, time
from dse.core.records import MetricsWriter, StepMetrics
w = MetricsWriter(sys.argv[1])
def stop(signum, frame):
    w.failure("interrupted", "stopped by SIGTERM")
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
w.step(StepMetrics(0, 1.0, 1.0, 1.0, 1.0, 5.0))
while True:
    time.sleep(0.05)
"""


def test_a_trial_the_local_runner_stops_at_its_timeout_is_a_timeout(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    launch = _launch(tmp_path, [sys.executable, "-c", SLOW_TRIAL, str(metrics)], timeout_s=1.0)
    runner = LocalRunner(device="cpu", world_size=1)
    runner.submit(launch)
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)  # the trial is up (its step written) and past its timeout
    time.sleep(1.0)
    done: list[Any] = []
    while not done and time.monotonic() < deadline:
        done = runner.poll()
        time.sleep(0.2)
    assert done, "the runner did not stop the trial"
    assert done[0].outcome.failure_class == "timeout", done[0].outcome.reason
    assert "interrupted" in metrics.read_text()  # the trial did write its line
