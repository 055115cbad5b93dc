"""bench/api_load.py --mode first-read runs end to end on a small database: the real server,
one write per round, then the first cross-study /best, /studies and study /best after it
(the figures at 100,000 trials are in docs/BENCHMARKS.md)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO


def test_first_read_mode_times_each_read_after_each_write() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "api_load.py"), "--mode", "first-read",
         "--trials", "300", "--requests", "2"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    for name in ("/best", "/studies", "study /best"):
        row = re.search(rf"^{re.escape(name)}\s+(\d+)\s", out.stdout, re.MULTILINE)
        assert row is not None and row.group(1) == "2", out.stdout
    assert "first read after each of 2 writes" in out.stdout
