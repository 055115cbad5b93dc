"""bench/estimate_rank.py on a committed H200 result file: the file's overrides are applied,
every measured row is counted, and the estimate's best is a configuration of the file,
measured no faster than the measured best."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_rank_of_a_measured_series() -> None:
    f = "docs/results/adaptive_window_h200_s4096_a.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "estimate_rank.py"), f, "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    (out,) = json.loads(r.stdout)
    rows = json.loads((REPO / f).read_text())["rows"]
    assert out["configurations"] == sum(1 for x in rows if x.get("fixed_step_s"))
    assert out["seq_length"] == 4096 and out["global_batch_size"] == 4  # the file's --set
    assert out["estimate_best"] in [x["params"] for x in rows]
    assert out["estimate_best_over_measured_best"] >= 1.0
    assert -1.0 <= out["kendall_tau"] <= 1.0
