"""A study on warm trial workers, end to end on CPU: `dse start` runs its one-rank Megatron
trials in one worker process, records each trial's start-up and measured time, and `dse
status` shows the study's held time and busy fraction; a stopped study leaves no worker."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dse.results.gpu_usage import HELD_ATTR_PREFIX
from dse.storage import open_storage
from tests.conftest import EXAMPLES


def _space(tmp_path: Path, **over: object) -> Path:
    space = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    space["resources"]["world_size"] = 1
    space["knobs"] = {"micro_batch_size": {"values": [1, 2, 4], "baseline": 1}}
    space["agent"] = {"name": "grid", "seed": 0}
    space["budget"]["n_trials"] = 3
    space["budget"]["remeasure"] = 0  # re-measures of a tie are the study tests' concern
    space["semantics"]["steps"] = 3
    space["runner"] = {"name": "local", "workdir": str(tmp_path / "runs"),
                       "options": {"warm_workers": True}}  # fmt: skip
    for k, v in over.items():
        section, key = k.split("__")
        space[section][key] = v
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    return p


def _dse(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dse.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900)  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _worker_pids(runs: Path) -> set[int]:
    events = runs / "tiny-gpt-cpu" / "workers" / "events.jsonl"
    return {json.loads(x)["pid"] for x in events.read_text().splitlines()}


@pytest.mark.slow
def test_study_on_a_warm_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    r = _dse("start", "--space", str(_space(tmp_path)), "--storage", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    st = open_storage(url)
    try:
        study = st.get_study("tiny-gpt-cpu")
        trials = st.list_trials(study.id)
        attrs = st.get_study_attrs(study.id)
    finally:
        st.close()
    assert [t.state for t in trials] == ["complete"] * 3
    pids = {t.metrics["worker"]["pid"] for t in trials}
    assert len(pids) == 1 and all(t.metrics["worker"]["warm"] for t in trials)
    for t in trials:
        tm = t.metrics["timing"]
        assert tm["device"] == "cpu" and tm["devices"] == 1
        assert tm["measure_s"] > 0 and tm["startup_s"] >= 0
        assert tm["startup_s"] + tm["measure_s"] == pytest.approx(tm["wall_s"])
        assert "gpu_seconds_startup" not in t.metrics  # CPU: no GPU-seconds
    # the first trial waited for the worker's start; the next ones were handed over warm
    assert trials[0].metrics["timing"]["startup_s"] > trials[2].metrics["timing"]["startup_s"]
    (held,) = [v for k, v in attrs.items() if k.startswith(HELD_ATTR_PREFIX)]
    assert held["devices"] == 1 and held["last"] > held["started"]
    assert attrs["grid"]["configurations"] == 3 and attrs["grid"]["complete"] is True

    status = json.loads(_dse("status", "--storage", url, "--format", "json", cwd=tmp_path).stdout)
    g = status["gpu"]
    assert g["device"] == "cpu" and g["held_basis"] == "controller"
    assert 0 < g["busy_fraction"] < 1
    assert g["device_seconds_held"] == pytest.approx(held["last"] - held["started"])
    assert g["grid_configurations"] == 3
    text = _dse("status", "--storage", url, cwd=tmp_path).stdout
    assert "device time (cpu): busy" in text
    assert not any(_alive(p) for p in _worker_pids(tmp_path / "runs"))


@pytest.mark.slow
def test_a_stopped_study_leaves_no_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    space = _space(tmp_path, semantics__steps=100_000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "start", "--space", str(space), "--storage", url],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    metrics = tmp_path / "runs" / "tiny-gpt-cpu" / "trial-00000" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not metrics.exists():
        assert proc.poll() is None
        time.sleep(0.2)
    assert metrics.exists(), "the first trial never trained"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    pids = _worker_pids(tmp_path / "runs")
    assert pids and not any(_alive(p) for p in pids)
    st = open_storage(url)
    try:
        study = st.get_study("tiny-gpt-cpu")
        assert study.state == "stopped"
        assert st.count_trials(study.id).get("queued") == 1  # re-queued, not lost
    finally:
        st.close()
