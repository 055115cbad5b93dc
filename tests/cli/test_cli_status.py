"""``dse status`` text: the best trial with its step time and memory, figures with four
significant digits (dse.core.figures), one row per trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from dse.cli.main import main
from dse.storage import open_storage
from tests.api.seed import _run, create_study, ok


def test_status_text_shows_step_time_memory_and_four_digits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url)
    try:
        sid = create_study(storage, "fmt")
        params = {"tensor_model_parallel_size": 1, "micro_batch_size": 1,
                  "use_distributed_optimizer": False}  # fmt: skip
        _run(storage, sid, params, ok(123.456789, 61.23456), gpu_seconds=1.0)
        mbs2 = {**params, "micro_batch_size": 2}
        _run(storage, sid, mbs2, ok(98.7654321, 70.5), gpu_seconds=1.0)
    finally:
        storage.close()
    assert main(["status", "--study", "fmt", "--storage", url]) == 0
    out = capsys.readouterr().out
    # the best with its noise-aware interval (dse.results.noise: from the per-step times), four
    # digits
    best = next(line for line in out.splitlines() if line.strip().startswith("best: "))
    assert best.strip().startswith("best: trial 0 tflops_per_gpu=123.5 [")
    assert ", step 0.5000 s, peak 61.23 GiB" in best
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert rows[0][:3] + rows[0][5:7] == ["0", "complete", "123.5", "0.5000", "61.23"]
    assert rows[1][:3] + rows[1][5:7] == ["1", "complete", "98.77", "0.5000", "70.50"]
    # each row's interval is its configuration's, the best's the one its line shows
    interval = " ".join(rows[0][3:5])
    assert interval.startswith("[") and f"tflops_per_gpu=123.5 {interval}" in best
    assert "123.46" not in out and "98.77 " in out
