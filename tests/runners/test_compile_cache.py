"""Compile caches per study and node: every trial the local runner starts, a process of its
own or a warm worker, gets the study's on-disk kernel caches (Triton, TorchInductor, torch
extensions, the CUDA driver's), unless its environment sets them already."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from dse.runners import Launch, LocalRunner
from dse.runners._base import COMPILE_CACHE_VARS, compile_cache_env
from dse.runners.warm import WarmPool, WarmSettings

DUMP = (
    "import json, os, sys; json.dump({k: os.environ.get(k) for k in sys.argv[1].split(',')}, "
    "open(sys.argv[2], 'w'))"
)
NAMES = ",".join(v for v, _ in COMPILE_CACHE_VARS)


def test_cache_env_is_per_study_and_node_and_keeps_the_users() -> None:
    env = compile_cache_env(Path("/runs/study-a"), "node7", {"TRITON_CACHE_DIR": "/mine"})
    assert "TRITON_CACHE_DIR" not in env  # the trial's own setting wins
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/runs/study-a/cache/node7/inductor"
    assert set(env) == {v for v, _ in COMPILE_CACHE_VARS} - {"TRITON_CACHE_DIR"}


def test_a_trial_process_gets_the_studys_caches(tmp_path: Path) -> None:
    study = tmp_path / "study"
    d = study / "trial-00001"
    d.mkdir(parents=True)
    out = d / "env.json"
    r = LocalRunner(device="cpu", world_size=1)
    r.submit(Launch(trial_id=1, number=1, argv=[sys.executable, "-c", DUMP, NAMES, str(out)],
                    trial_dir=d, metrics_path=d / "metrics.jsonl", log_path=d / "log.txt",
                    world_size=1, device="cpu", timeout_s=60.0, hang_timeout_s=60.0))  # fmt: skip
    deadline = time.monotonic() + 60
    while not r.poll() and time.monotonic() < deadline:
        time.sleep(0.05)
    got = json.loads(out.read_text())
    assert got["TRITON_CACHE_DIR"] == str(study / "cache" / r.host / "triton")
    assert all(got[v] for v, _ in COMPILE_CACHE_VARS)


def test_a_warm_worker_gets_the_studys_caches(tmp_path: Path) -> None:
    # a stand-in interpreter that records its environment and exits (no worker starts)
    out = tmp_path / "env.json"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{DUMP}" {NAMES} {out}\n')
    fake.chmod(0o755)
    study = tmp_path / "study"
    pool = WarmPool(WarmSettings(python=str(fake), workdir=study), slots=[[]], device="cpu",
                    base_env={"PATH": "/usr/bin:/bin"}, host="nodeX")  # fmt: skip
    pool.prepare("owner")
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pool.stop()
    got = json.loads(out.read_text())
    assert got["TRITON_CACHE_DIR"] == str(study / "cache" / "nodeX" / "triton")
    assert got["CUDA_CACHE_PATH"] == str(study / "cache" / "nodeX" / "cuda")
