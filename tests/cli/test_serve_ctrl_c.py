"""Ctrl-C on ``dse serve`` (one process or several): it stops with one line and exit 130 or 0,
never a traceback (it printed 20 lines of one, issue 29). The terminal's Ctrl-C reaches the
whole process group, so the test sends SIGINT to the group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.api.seed import create_study, seed_database


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_stops_dse_serve_without_a_traceback(tmp_path: Path, workers: int) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    seed_database(url, lambda st: create_study(st, "s"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "serve", "--port", "0", "--storage", url,
         "--workers", str(workers)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "Ctrl-C stops" in line, line
        base = line.split(" at ", 1)[1].split("/ ", 1)[0]
        with urllib.request.urlopen(f"{base}/api/v1/studies", timeout=30) as r:  # noqa: S310
            assert r.status == 200  # it serves before it is stopped
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert len([x for x in err.splitlines() if x.strip()]) <= 1, err
