"""``classify_log`` on real trial-log lines (tests/workloads/data/logs, sources in its README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dse.workloads.runners import classify_log
from tests.conftest import REPLAY_TABLE

LOGS = Path(__file__).parent / "data" / "logs"

CASES = [
    ("oom_torch24.txt", "oom"),
    ("oom_torch_cuda.txt", "oom"),
    ("oom_runtime_error.txt", "oom"),
    ("nccl_watchdog_ranks.txt", "hang"),
    ("nccl_watchdog_terminate.txt", "hang"),
    ("nan_grad_norm_bucket.txt", "nan"),
    ("nan_grad_norm_assert.txt", "nan"),
    ("nan_grad_norm_backwards.txt", "nan"),
    ("error_missing_module.txt", "error"),
]


@pytest.mark.parametrize(("name", "expected"), CASES)
def test_real_log_lines(name: str, expected: str) -> None:
    assert classify_log((LOGS / name).read_text()) == expected


def test_every_fixture_is_in_the_table() -> None:
    assert sorted(p.name for p in LOGS.glob("*.txt")) == sorted(n for n, _ in CASES)


def test_the_measured_h200_ooms() -> None:
    rows = [json.loads(x) for x in REPLAY_TABLE.read_text().splitlines() if x.strip()]
    errors = [r["metrics"]["error"] for r in rows if r["status"] == "oom"]
    assert len(errors) == 8
    assert {classify_log(e) for e in errors} == {"oom"}


def test_an_oom_on_one_rank_wins_over_the_watchdog_of_the_others() -> None:
    text = (LOGS / "nccl_watchdog_ranks.txt").read_text() + (LOGS / "oom_torch24.txt").read_text()
    assert classify_log(text) == "oom"


def test_the_trainers_own_nan_reason() -> None:
    assert classify_log("nan: loss is nan at step 2") == "nan"
    assert classify_log("loss is inf at step 7") == "nan"


def test_nothing_recognised_is_an_error() -> None:
    assert classify_log("") == "error"
    assert classify_log("Segmentation fault (core dumped)") == "error"
