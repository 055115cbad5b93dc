"""bench/gpu_study.sh, run for real here (the replay workload: no GPU, no network): it exits
with `dse start`'s status (its last loop once made a successful study exit 1 under pipefail),
a second run installs this checkout again (the install lacked --upgrade, so a second run on
the same node tested the first run's code), and only this run's failed trials are shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import EXAMPLES, REPLAY_TABLE

REPO = Path(__file__).resolve().parents[2]


def _run(root: Path, out: Path, space: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DSE_GPU_ROOT": str(root),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("PYTHONPATH", None)
    env.pop("DSE_STORAGE", None)
    return subprocess.run(
        ["bash", "bench/gpu_study.sh", str(space), str(out), *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_gpu_study_script(tmp_path: Path) -> None:
    from importlib.metadata import version

    # the script builds dse without isolation, as on a node without network: the carried
    # wheels bring setuptools there, the dev extra here
    assert int(version("setuptools").split(".")[0]) >= 77, "the dev extra needs setuptools>=77"
    d = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    d["workload"] = {"name": "replay", "table": str(REPLAY_TABLE), "delay_s": 0}
    d["budget"] = {"n_trials": 4, "trial_timeout_s": 60, "hang_timeout_s": 30}
    d["runner"] = {"name": "local", "max_parallel": 1}
    d["prescreen"] = {"enabled": False}  # the table's OOM rows run: failed trials to show
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(d))
    root = tmp_path / "node"
    # a trial of an earlier run on the node, failed: not this run's
    old = root / "dse_runs" / "other-study" / "trial-00000"
    old.mkdir(parents=True)
    (old / "log.txt").write_text("EARLIER RUN LOG\n")
    (old / "metrics.jsonl").write_text('{"type": "failure", "failure_class": "oom"}\n')

    got = _run(root, tmp_path / "out", space)
    assert got.returncode == 0, got.stdout + got.stderr
    status = (tmp_path / "out" / "status.txt").read_text()
    assert "4 trials" in status and "infeasible" in status
    assert "EARLIER RUN LOG" not in got.stdout
    shown = [ln for ln in got.stdout.splitlines() if ln.startswith("== ")]
    assert shown and all("/replay-llama1b/trial-" in ln for ln in shown), got.stdout
    assert "OutOfMemoryError" in got.stdout  # the failed trial's log tail

    # code left on the node by an earlier install is replaced
    installed = root / "dse" / "dse" / "__init__.py"
    installed.write_text(installed.read_text() + "\nSTALE = True\n")
    got = _run(root, tmp_path / "out", space, "--n-trials", "5")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "STALE" not in installed.read_text()
    assert "5 trials" in (tmp_path / "out" / "status.txt").read_text()
    # a study that does not run is the script's exit status too
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: [\n")
    assert _run(root, tmp_path / "out2", bad).returncode == 2
