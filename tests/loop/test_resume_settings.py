"""A study's identity versus its run settings: `dse resume` / `dse start` on an existing study
take new run settings, a finished study's budget can be extended, a changed identity is
refused; a signal stops a study like Ctrl-C and the output says how to continue. Real trial
processes (the replay workload), real SQLite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
from dse.storage import open_storage
from tests.conftest import EXAMPLES, REPLAY_TABLE


def _space(tmp_path: Path, *, budget: int = 2, delay: float = 0.0, **extra: object) -> Path:
    d = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    d["study"] = "crash"
    d["workload"] = {"name": "replay", "table": str(REPLAY_TABLE), "delay_s": delay}
    d["budget"] = {"n_trials": budget, "trial_timeout_s": 60, "hang_timeout_s": 30}
    d["runner"] = {"name": "local", "workdir": str(tmp_path / "runs")}
    d["agent"] = {"name": "random", "seed": 1}
    d["prescreen"] = {"enabled": False}
    d.update(extra)
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _trials(url: str, study: str = "crash") -> list:
    st = open_storage(url)
    try:
        return st.list_trials(st.get_study(study).id)
    finally:
        st.close()


def _attrs(url: str, study: str = "crash") -> dict:
    st = open_storage(url)
    try:
        return st.get_study_attrs(st.get_study(study).id)
    finally:
        st.close()


def test_resume_and_start_take_new_run_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    space = _space(tmp_path, budget=2)
    assert main(["start", "--space", str(space), "--storage", url]) == 0
    assert len(_trials(url)) == 2
    # a finished study's budget is extended, with another workdir, agent and parallelism
    other = tmp_path / "elsewhere"
    argv = ["resume", "--study", "crash", "--storage", url, "--n-trials", "4",
            "--workdir", str(other), "--agent", "grid", "--max-parallel", "2",
            "--runner", "local"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    trials = _trials(url)
    assert len(trials) == 4
    assert all(t.state in ("complete", "failed", "infeasible") for t in trials)
    assert (other / "crash").is_dir()
    run = _attrs(url)["run_settings"]
    assert run["budget"]["n_trials"] == 4
    assert run["runner"]["workdir"] == str(other)
    assert run["runner"]["max_parallel"] == 2
    assert run["agent"]["name"] == "grid"
    # a plain resume keeps the stored (effective) settings: nothing more to run
    assert main(["resume", "--study", "crash", "--storage", url]) == 0
    assert len(_trials(url)) == 4
    # start on the existing study with its space file and a larger budget
    assert main(["start", "--space", str(space), "--storage", url, "--n-trials", "5"]) == 0
    assert len(_trials(url)) == 5


def test_start_refuses_another_identity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert main(["start", "--space", str(_space(tmp_path, budget=1)), "--storage", url]) == 0
    d = yaml.safe_load((tmp_path / "space.yaml").read_text())
    d["semantics"]["global_batch_size"] *= 2
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(d))
    capsys.readouterr()
    assert main(["start", "--space", str(tmp_path / "space.yaml"), "--storage", url]) == 1
    err = capsys.readouterr().err
    assert "exists with a different space: semantics differ" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_stops_like_ctrl_c(tmp_path: Path, sig: signal.Signals) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    space = _space(tmp_path, budget=3, delay=30.0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "start", "--space", str(space), "--storage", url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    pgid_file = tmp_path / "runs" / "crash" / "trial-00000" / "pgid"
    deadline = time.monotonic() + 60
    while not pgid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pgid_file.exists()
    time.sleep(0.5)
    import json

    trial_pgid = json.loads(pgid_file.read_text())["pgid"]
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, out
    assert f"stopped (signal {sig.name})" in out
    assert "to continue: dse resume --study crash --storage" in out
    assert "done:" not in out
    st = open_storage(url)
    try:
        assert st.get_study("crash").state == "stopped"
    finally:
        st.close()
    assert all(t.state == "queued" for t in _trials(url))
    with pytest.raises(ProcessLookupError):
        os.killpg(trial_pgid, 0)  # the trial's process group was stopped too
