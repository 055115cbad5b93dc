"""``classify_log`` on real trial-log lines (tests/fixtures/logs, each file names its source in
its header lines) and on the OOM lines of the measured H200 table, read from the table itself."""

from __future__ import annotations

import json

import pytest

from dse.runners import classify_log
from tests.conftest import LOGS, REPLAY_TABLE

CASES = [
    ("oom_torch24.log", "oom"),
    ("oom_torch_cuda.log", "oom"),
    ("oom_runtime_error.log", "oom"),
    ("nccl_timeout_ranks.log", "hang"),
    ("nccl_watchdog_terminate.log", "hang"),
    ("nan_grad_norm_bucket.log", "nan"),
    ("nan_grad_norm_assert.log", "nan"),
    ("nan_grad_norm_backwards.log", "nan"),
    ("error_missing_module.log", "error"),
]


@pytest.mark.parametrize(("name", "expected"), CASES)
def test_real_log_lines(name: str, expected: str) -> None:
    assert classify_log((LOGS / name).read_text()) == expected


def test_every_log_fixture_names_its_source() -> None:
    logs = sorted(LOGS.iterdir())
    assert {p.suffix for p in logs} == {".log"}
    for p in logs:
        header = [ln for ln in p.read_text().splitlines()[:4] if ln.startswith("# ")]
        assert any(ln.startswith("# Source: ") for ln in header), p.name


def test_the_measured_h200_ooms() -> None:
    rows = [json.loads(x) for x in REPLAY_TABLE.read_text().splitlines() if x.strip()]
    errors = [r["metrics"]["error"] for r in rows if r["status"] == "oom"]
    assert len(errors) == 8
    assert {classify_log(e) for e in errors} == {"oom"}


def test_an_oom_on_one_rank_wins_over_the_watchdog_of_the_others() -> None:
    text = (LOGS / "nccl_timeout_ranks.log").read_text() + (LOGS / "oom_torch24.log").read_text()
    assert classify_log(text) == "oom"


def test_the_trainers_own_nan_reason() -> None:
    assert classify_log("nan: loss is nan at step 2") == "nan"
    assert classify_log("loss is inf at step 7") == "nan"


def test_nothing_recognised_is_an_error() -> None:
    assert classify_log("") == "error"
    assert classify_log("Segmentation fault (core dumped)") == "error"
