"""The trial contract: the one metrics writer, its typed lines and the reader
(dse.core.records)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from dse.core.records import (
    FailureLine,
    MetricsWriter,
    Outcome,
    StepLine,
    StepMetrics,
    SummaryLine,
    read_metrics,
)

STEP = StepMetrics(
    step=0, step_time_s=0.5, tflops_per_gpu=1.0, peak_mem_gib=0.4, peak_reserved_gib=0.5,
    loss=6.9, grad_norm=float("inf"),
)  # fmt: skip
SUMMARY = {"step_time_s": 0.5, "tflops_per_gpu": 1.0, "peak_mem_gib": 0.4, "device": "cpu"}


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_writer_round_trips_through_read_metrics(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "sub" / "m.jsonl")
    w.step(STEP)
    assert read_metrics(w.path) is None  # not finished yet
    assert w.summary(SUMMARY)
    assert not w.failure("error", "late")  # a final line is already there
    out = read_metrics(w.path)
    assert isinstance(out, Outcome) and out.ok and out.source == "measured"
    assert out.metrics == SUMMARY
    assert out.steps[0].loss == 6.9 and out.steps[0].grad_norm is None  # inf is not a number
    assert [x["type"] for x in lines(w.path)] == ["step", "summary"]


def test_failure_keeps_only_finite_metrics(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "m.jsonl")
    assert w.failure("nan", "loss is nan at step 2", {"peak_mem_gib": 1.5, "x": float("nan")})
    assert not w.failure("error", "second rank")
    out = read_metrics(w.path)
    assert out is not None and out.failure_class == "nan" and out.status == "failed"
    assert out.metrics == {"peak_mem_gib": 1.5}


def test_source_is_stamped_on_every_line(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "m.jsonl", source="replay")
    w.step(STEP)
    w.summary(SUMMARY)
    assert {x["source"] for x in lines(w.path)} == {"replay"}
    out = read_metrics(w.path)
    assert out is not None and out.source == "replay" and "source" not in out.metrics


def test_step_and_summary_refuse_non_finite_numbers(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path / "m.jsonl")
    with pytest.raises(ValidationError, match="loss"):
        StepLine(step=1, step_time_s=0.1, tflops_per_gpu=1.0, peak_mem_gib=1.0, loss=math.nan)
    with pytest.raises(ValidationError, match="step_time_s"):
        w.summary({**SUMMARY, "step_time_s": math.inf})
    with pytest.raises(ValidationError, match="tflops_per_gpu"):
        w.summary({"step_time_s": 0.5, "peak_mem_gib": 1.0})  # a required figure missing
    assert not w.path.exists() or w.path.read_text() == ""


def test_an_unknown_failure_class_is_refused() -> None:
    with pytest.raises(ValidationError, match="failure_class"):
        FailureLine(failure_class="pruned", reason="x")  # type: ignore[arg-type]


def test_reader_turns_a_broken_final_line_into_an_error_naming_it(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text(
        json.dumps(StepLine.of(STEP).model_dump()) + "\n"
        + json.dumps({"type": "failure", "failure_class": "infeasable", "reason": "typo"}) + "\n"
    )  # fmt: skip
    out = read_metrics(p)
    assert out is not None and out.failure_class == "error"
    assert out.reason is not None and "m.jsonl line 2" in out.reason
    assert "failure_class" in out.reason and len(out.steps) == 1


def test_reader_ignores_partial_lines_and_unknown_types(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    summary = SummaryLine.model_validate(SUMMARY).model_dump()
    p.write_text(
        '{"type": "note", "text": "hello"}\n' + json.dumps(summary) + "\n" + '{"type": "st'
    )
    out = read_metrics(p)
    assert out is not None and out.ok and out.metrics["device"] == "cpu"
