"""The shared vocabulary between layers: trial specs, outcomes and frozen storage records.

Trial contract: a trial process reads a :class:`TrialSpec` (JSON) and writes metrics JSONL
to ``spec.metrics_path``: one ``{"type": "step", ...}`` line per training step, then one
``{"type": "summary", ...}`` line, or one ``{"type": "failure", "failure_class": ...,
"reason": ...}`` line. :func:`read_metrics` turns such a file into an :class:`Outcome`.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "FailureClass",
    "TrialState",
    "TrialSpec",
    "StepMetrics",
    "Outcome",
    "StudyRecord",
    "TrialRecord",
    "TrialPoint",
    "RejectionRecord",
    "read_metrics",
    "summarize_steps",
]

#: Classes of expected trial failures (values, not exceptions).
FailureClass = Literal[
    "oom",  # measured out of memory
    "predicted_oom",  # cost model said it will not fit (never launched)
    "invalid",  # a validity rule rejected it (never launched) or Megatron refused it at build
    "error",  # the trial crashed for another reason
    "timeout",  # ran past trial_timeout_s
    "hang",  # no step for hang_timeout_s
    "nan",  # loss became NaN/inf
    "interrupted",  # the controller died while it ran
    "node_fail",  # a node of the trial failed (cluster runners)
    "preempted",  # the cluster's scheduler preempted the trial's job
    "cancelled",  # the trial's job was cancelled from outside (e.g. scancel)
]

#: States of a trial in storage.
TrialState = Literal["queued", "running", "complete", "failed", "infeasible", "pruned"]


class TrialSpec(BaseModel):
    """What a trial process gets (``trial.json``)."""

    model_config = ConfigDict(extra="forbid")

    study: str
    trial_number: int
    params: dict[str, Any] = Field(description="Knob values (explored + fixed).")
    model: dict[str, Any] = Field(description="ModelSpec as a dict.")
    semantics: dict[str, Any] = Field(description="Semantics as a dict.")
    world_size: int
    device: Literal["cuda", "cpu"]
    metrics_path: str
    workload: dict[str, Any] = Field(default_factory=dict, description="WorkloadSpec as dict.")
    features: list[str] | None = Field(
        None, description="Features declared present; None: detect in the trial process."
    )
    gpu: str | None = Field(None, description="GPU name of the trial's nodes (resources.gpu).")
    gpu_memory_gib: float | None = Field(None, description="Memory per GPU (resources).")


@dataclass(frozen=True)
class StepMetrics:
    step: int
    step_time_s: float
    tflops_per_gpu: float
    peak_mem_gib: float
    peak_reserved_gib: float
    loss: float
    grad_norm: float | None = None


@dataclass(frozen=True)
class Outcome:
    """The result of one trial: metrics when ``ok``, otherwise a failure class and reason.

    ``source`` says where the numbers came from: ``measured`` (a real training run),
    ``replay`` (a measured table), ``estimate`` (the cost model / simulator) or ``rules``.
    """

    status: Literal["ok", "failed", "infeasible"]
    metrics: dict[str, Any] = field(default_factory=dict)
    failure_class: str | None = None
    reason: str | None = None
    steps: tuple[StepMetrics, ...] = ()
    source: Literal["measured", "replay", "estimate", "rules"] = "measured"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def failure(
        cls,
        failure_class: str,
        reason: str,
        *,
        metrics: dict[str, Any] | None = None,
        steps: tuple[StepMetrics, ...] = (),
        source: Literal["measured", "replay", "estimate", "rules"] = "measured",
    ) -> Outcome:
        status: Literal["failed", "infeasible"] = (
            "infeasible" if failure_class in ("oom", "predicted_oom", "invalid") else "failed"
        )
        return cls(status, dict(metrics or {}), failure_class, reason, steps, source)


@dataclass(frozen=True)
class StudyRecord:
    id: int
    name: str
    space_yaml: str
    space_hash: str
    state: str
    direction: str
    metric: str
    created_at: float
    model: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialRecord:
    id: int
    study_id: int
    number: int
    state: str
    params: dict[str, Any]
    params_key: str
    metrics: dict[str, Any] = field(default_factory=dict)
    value: float | None = None
    failure_class: str | None = None
    reason: str | None = None
    source: str | None = None
    runner: str | None = None
    host: str | None = None
    log_path: str | None = None
    metrics_path: str | None = None
    queued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    heartbeat_at: float | None = None
    gpu_seconds: float | None = None
    steps: tuple[StepMetrics, ...] = ()
    #: How many times the trial was re-queued after an interruption (0: never).
    attempts: int = 0
    #: One entry per re-queue: ``{"at", "reason", "state", "runner", "host", "started_at",
    #: "log_path"}`` (what was interrupted, where and why).
    history: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class TrialPoint:
    """A trial in brief, for charts of a whole study (``Storage.list_trial_points``): no
    steps, paths or history; the summary metrics a chart plots."""

    id: int
    number: int
    state: str
    params: dict[str, Any]
    value: float | None = None
    failure_class: str | None = None
    reason: str | None = None
    gpu_seconds: float | None = None
    tflops_per_gpu: float | None = None
    peak_mem_gib: float | None = None
    step_time_s: float | None = None


@dataclass(frozen=True)
class RejectionRecord:
    """A proposal rejected before launch (a validity rule or the cost-model pre-screen)."""

    id: int
    study_id: int
    params: dict[str, Any]
    params_key: str
    kind: str  # "invalid" (a rule) | "predicted_oom" (the cost model)
    rule: str
    reason: str
    values: dict[str, Any] = field(default_factory=dict)
    created_at: float | None = None


def summarize_steps(steps: list[StepMetrics], warmup_steps: int) -> dict[str, Any]:
    """The summary of a run: medians over the measured (post-warm-up) steps."""
    measured = steps[warmup_steps:] or steps
    return {
        "step_time_s": statistics.median(s.step_time_s for s in measured),
        "tflops_per_gpu": statistics.median(s.tflops_per_gpu for s in measured),
        "peak_mem_gib": max(s.peak_mem_gib for s in steps),
        "peak_reserved_gib": max(s.peak_reserved_gib for s in steps),
        "loss": steps[-1].loss,
        "losses": [s.loss for s in steps],
        "steps": len(steps),
    }


def read_metrics(path: str | Path) -> Outcome | None:
    """Read a metrics JSONL file written by a trial.

    Returns the outcome when the file ends in a summary or failure line, None when the trial
    has not finished (or the file does not exist). Partial trailing lines are ignored.
    """
    p = Path(path)
    if not p.exists():
        return None
    steps: list[StepMetrics] = []
    final: dict[str, Any] | None = None
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = rec.get("type")
        if kind == "step":
            steps.append(
                StepMetrics(
                    step=int(rec["step"]),
                    step_time_s=float(rec["step_time_s"]),
                    tflops_per_gpu=float(rec["tflops_per_gpu"]),
                    peak_mem_gib=float(rec["peak_mem_gib"]),
                    peak_reserved_gib=float(rec.get("peak_reserved_gib", rec["peak_mem_gib"])),
                    loss=float(rec["loss"]),
                    grad_norm=None if rec.get("grad_norm") is None else float(rec["grad_norm"]),
                )
            )
        elif kind in ("summary", "failure"):
            final = rec
    if final is None:
        return None
    src = final.get("source", "measured")
    if final["type"] == "summary":
        metrics = {k: v for k, v in final.items() if k not in ("type", "source")}
        return Outcome("ok", metrics, steps=tuple(steps), source=src)
    metrics = dict(final.get("metrics") or {})
    return Outcome.failure(
        final.get("failure_class", "error"),
        str(final.get("reason", "")),
        metrics=metrics,
        steps=tuple(steps),
        source=src,
    )


#: Study attribute :meth:`dse.storage.Storage.import_study` sets (true): the study's run
#: settings came from an export file and are not run unconfirmed (see dse.run_settings).
IMPORTED_ATTR = "imported"
