"""The Omni command of docs/usage.md on the cost model, killed and resumed: ``dse start --space
examples/nemotron_omni.yaml --workload sim`` (the file's workload is ``bridge``) then
``dse resume``, exactly as a user types them (default storage and work directory in the
current directory). The workload choice is stored with the study, so the resumed run stays
on the cost model, and a second ``dse start ... --workload sim`` continues the same study."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

OMNI = Path(__file__).resolve().parents[2] / "examples" / "nemotron_omni.yaml"
DSE = [sys.executable, "-m", "dse.cli"]

pytestmark = pytest.mark.slow


def _finished(db: Path) -> int:
    if not db.is_file():
        return 0
    with sqlite3.connect(db) as c:
        try:
            row = c.execute("select count(*) from trials where finished_at is not null").fetchone()
        except sqlite3.OperationalError:  # not migrated yet
            return 0
    return int(row[0])


def test_the_readme_omni_sim_study_survives_a_kill_and_resumes(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("DSE_STORAGE", None)
    db = tmp_path / "dse.db"
    log = tmp_path / "start.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*DSE, "start", "--space", str(OMNI), "--workload", "sim"], cwd=tmp_path, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 240
    while _finished(db) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, log.read_text()  # still running: killed mid-study
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = _finished(db)
    assert 3 <= killed_at < 24

    res = subprocess.run([*DSE, "resume"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=400)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "resumed" in res.stderr and "GPU(s) per trial" not in res.stderr
    assert " estimate)" in res.stderr  # the resumed trials ran on the cost model too

    st = subprocess.run([*DSE, "status", "--format", "json"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert st.returncode == 0, st.stderr
    s = json.loads(st.stdout)
    assert s["state"] == "complete"
    numbers = [t["number"] for t in s["trials"]]
    assert numbers == list(range(len(numbers)))  # none lost, none repeated
    proposed = [t for t in s["trials"] if t["remeasure_of"] is None]
    assert len(proposed) == 24  # the file's budget
    assert all(t["source"] == "estimate" for t in s["trials"] if t["state"] == "complete")
    # the sim and the pre-screen share one memory verdict: no simulated OOM
    assert not [t for t in s["trials"] if t["failure_class"] == "oom"]
    # every estimate says how far it is trusted, and TP 1 (outside the published layouts'
    # TP 2..4) is extrapolated
    done = [t for t in s["trials"] if t["state"] == "complete"]
    assert all(t["metrics"]["trust"]["label"] for t in done)
    for t in done:
        if t["params"].get("tensor_model_parallel_size") == 1:
            assert t["metrics"]["trust"]["label"] == "extrapolated", t
    assert s["trust"]["counts"] and sum(s["trust"]["counts"].values()) == len(done)

    # the same command again: the same study (not "exists with a different space")
    again = subprocess.run([*DSE, "start", "--space", str(OMNI), "--workload", "sim",
                            "--n-trials", "25"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=400)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "resumed" in again.stderr and "different space" not in again.stderr

    # the stored space file is the recipe's own (the trial kind is a stored run setting), so
    # the best still exports as the recipe's CloudAI test, its figure labelled an estimate
    exp = subprocess.run([*DSE, "cloudai", "export"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert exp.returncode == 0, exp.stderr
    assert "(estimate" in exp.stdout.splitlines()[0] and "(measured)" not in exp.stdout
