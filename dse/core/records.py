"""The shared vocabulary between layers: its names, trial specs, outcomes, frozen storage
records and the trial contract.

Names: every closed set of values the layers exchange (trial and study states, failure
classes, metrics and their directions, best formats, agent / runner / workload names) is a
``Literal`` defined here once, with its tuple of values; storage, API, agents and CLI import
them. :func:`finite` is the one rule for "a finite number or None".

Trial contract: a trial process reads a :class:`TrialSpec` (JSON) and writes metrics JSONL
to ``spec.metrics_path`` with a :class:`MetricsWriter`: one :class:`StepLine` per training
step, then one :class:`SummaryLine`, or one :class:`FailureLine` (a failure class and a
reason). :func:`read_metrics` turns such a file into an :class:`Outcome`.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "sample_numbers",
    # names (each defined once; every layer imports them from here)
    "TrialState",
    "REPLAY_RUNS",
    "FinishedState",
    "TRIAL_STATES",
    "FINISHED_STATES",
    "TAKEN_STATES",
    "ANSWERED_STATES",
    "MEASURED_STATES",
    "StudyState",
    "STUDY_STATES",
    "FailureClass",
    "FAILURE_CLASSES",
    "ESTIMATE_WORKLOADS",
    "INFEASIBLE_CLASSES",
    "OOM_CLASSES",
    "OutcomeStatus",
    "Source",
    "RejectionKind",
    "REJECTION_KINDS",
    "Metric",
    "Direction",
    "METRICS",
    "DIRECTIONS",
    "METRIC_DIRECTION",
    "SPEED_METRICS",
    "BestFormat",
    "BEST_FORMATS",
    "AgentName",
    "AGENT_NAMES",
    "RunnerName",
    "RUNNER_NAMES",
    "WorkloadName",
    "WORKLOAD_NAMES",
    "MeasurementMode",
    "MEASUREMENT_MODES",
    "StopReason",
    "STOP_REASONS",
    "PRUNED_STOP_REASON",
    "NumericsStatus",
    "NUMERICS_STATUSES",
    "numerics_status",
    "finite",
    # records
    "TrialSpec",
    "StepMetrics",
    "Outcome",
    "StudyRecord",
    "TrialRecord",
    "TrialPoint",
    "TrialRun",
    "gpu_slots_of",
    "ConfigStats",
    "RejectionRecord",
    # the trial contract
    "StepLine",
    "SummaryLine",
    "FailureLine",
    "MetricsLine",
    "MetricsWriter",
    "read_metrics",
    "summarize_steps",
]

# --- names -----------------------------------------------------------------------------------

#: Classes of expected trial failures (values, not exceptions).
FailureClass = Literal[
    "oom",  # measured out of memory
    "predicted_oom",  # cost model said it will not fit (never launched)
    "invalid",  # a validity rule rejected it (never launched) or Megatron refused it at build
    "error",  # the trial crashed for another reason
    "timeout",  # ran past trial_timeout_s, or waited in the cluster's queue past the
    # runner's queue_timeout_s while the cluster was busy (the job could have started later)
    "hang",  # no step for hang_timeout_s
    "nan",  # loss became NaN/inf
    # the trial process was stopped by SIGTERM or SIGINT before it ended (a runner's stop,
    # Ctrl-C; a scheduler's preemption or time limit is recorded as the scheduler says)
    "interrupted",
    "node_fail",  # a node of the trial failed (cluster runners)
    "preempted",  # the cluster's scheduler preempted the trial's job
    # the trial's job was cancelled, or its process killed, from outside dse (scancel; a
    # signal to its torchrun, whose ranks the runner then ends)
    "cancelled",
    # the cluster can never start the trial as asked: sbatch refused the job, Slurm holds it
    # for a reason that does not clear (PartitionNodeLimit, ...), or Ray finds its placement
    # group infeasible; infeasible for this cluster, whatever its load
    "unschedulable",
]
FAILURE_CLASSES: tuple[FailureClass, ...] = get_args(FailureClass)
#: Failure classes that say "this configuration cannot run" (the agent learns an infeasible
#: region; the trial's state is ``infeasible``); the others are ``failed``.
INFEASIBLE_CLASSES: frozenset[FailureClass] = frozenset(
    {"oom", "predicted_oom", "invalid", "unschedulable"}
)
#: Failure classes that say "it does not fit in memory" (measured or predicted).
OOM_CLASSES: frozenset[FailureClass] = frozenset({"oom", "predicted_oom"})

#: States of a finished trial (also what an agent is told: :class:`dse.agents.Feedback`).
#: ``pruned``: stopped early because its interval lay clearly below the study's best (its
#: measured figures are kept; it is never the best).
FinishedState = Literal["complete", "failed", "infeasible", "pruned"]
#: States of a trial in storage: ``queued`` -> ``running`` -> one of :data:`FinishedState`
#: (an interrupted trial goes back to ``queued``).
TrialState = Literal["queued", "running", FinishedState]
TRIAL_STATES: tuple[TrialState, ...] = get_args(TrialState)
FINISHED_STATES: tuple[FinishedState, ...] = get_args(FinishedState)
#: States in which a configuration counts as taken (no second trial unless repeats are on).
TAKEN_STATES: tuple[TrialState, ...] = ("queued", "running", "complete", "infeasible", "pruned")
#: Finished states whose answer holds for the configuration (a ``failed`` trial, a crash or a
#: timeout, may go differently next time): duplicates and warm starts reuse these.
ANSWERED_STATES: tuple[FinishedState, ...] = ("complete", "infeasible", "pruned")
#: Finished states of a trial that measured its figures (an ``ok`` outcome): ``complete``,
#: or ``pruned`` (stopped early, figures kept; never the best).
MEASURED_STATES: tuple[FinishedState, ...] = ("complete", "pruned")

#: States of a study: ``created`` -> ``running`` -> ``complete``, or ``stopping`` (asked
#: through the API) -> ``stopped``; ``interrupted`` when the controller stopped on an error
#: (its running trials re-queued). A study whose controller died stays ``running``.
StudyState = Literal["created", "running", "stopping", "complete", "stopped", "interrupted"]
STUDY_STATES: tuple[StudyState, ...] = get_args(StudyState)

#: What a trial's outcome says.
OutcomeStatus = Literal["ok", "failed", "infeasible"]
#: Where an outcome's numbers came from.
Source = Literal["measured", "replay", "estimate", "rules"]
#: The metric of a replayed trial that says how many runs its table holds of the
#: configuration: a replay of one run answers the same figure again (deterministic).
REPLAY_RUNS = "replay_runs"
#: Why a proposal was rejected before launch: a validity rule or the cost-model pre-screen
#: (both are also failure classes: the agent is told them as infeasible).
RejectionKind = Literal["invalid", "predicted_oom"]
REJECTION_KINDS: tuple[RejectionKind, ...] = get_args(RejectionKind)

#: Objective metrics of a study (fields of a trial's summary line).
Metric = Literal["tflops_per_gpu", "step_time_s", "peak_mem_gib", "tokens_per_s_per_gpu"]
METRICS: tuple[Metric, ...] = get_args(Metric)
Direction = Literal["minimize", "maximize"]
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
#: The direction in which each metric is better.
METRIC_DIRECTION: dict[Metric, Direction] = {
    "tflops_per_gpu": "maximize",
    "tokens_per_s_per_gpu": "maximize",
    "step_time_s": "minimize",
    "peak_mem_gib": "minimize",
}
#: The speed metrics (metric -> the direction that is "faster"): what the knob-semantics
#: prior and the cost model's speed estimate speak about.
SPEED_METRICS: dict[Metric, Direction] = {
    m: d for m, d in METRIC_DIRECTION.items() if m != "peak_mem_gib"
}

#: Formats of the best configuration (``dse best --format``, ``GET .../best?format=``).
BestFormat = Literal["json", "yaml", "megatron", "bridge", "nemo"]
BEST_FORMATS: tuple[BestFormat, ...] = get_args(BestFormat)
#: Search agents a space file may name (``agent.name``).
AgentName = Literal["tpe", "gp", "nsga2", "random", "grid"]
AGENT_NAMES: tuple[AgentName, ...] = get_args(AgentName)
#: Runners a space file may name (``runner.name``).
RunnerName = Literal["local", "ray", "slurm"]
RUNNER_NAMES: tuple[RunnerName, ...] = get_args(RunnerName)
#: Workloads a trial may run (``workload.name``; bridge / nemo / megatron_lm: the user's recipe
#: through its launcher).
WorkloadName = Literal["megatron", "replay", "sim", "bridge", "nemo", "megatron_lm"]
#: Workloads whose figures are the cost model's estimate, not a measurement (the sim): their
#: memory verdict is the pre-screen's own, so the pre-screen takes it without a margin.
ESTIMATE_WORKLOADS: frozenset[str] = frozenset({"sim"})
WORKLOAD_NAMES: tuple[WorkloadName, ...] = get_args(WorkloadName)


#: How a trial measures its step time (the space's ``measurement.mode``): ``fixed`` times
#: ``semantics.steps`` steps after ``semantics.warmup_steps``; ``adaptive`` detects the end of
#: warm-up from the data and stops once the steady-state step time is known to the space's
#: precision (see :mod:`dse.stats.measure`).
MeasurementMode = Literal["adaptive", "fixed"]
MEASUREMENT_MODES: tuple[MeasurementMode, ...] = get_args(MeasurementMode)
#: Why a trial stopped measuring (``metrics["measurement"]["stop_reason"]``): its interval
#: was narrow enough, it reached ``max_steps``, it ran its fixed window, or it was dominated
#: by the study's best (the trial is then ``pruned``).
StopReason = Literal["converged", "max_steps", "fixed", "dominated"]
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)
#: The stop reason of a pruned trial.
PRUNED_STOP_REASON: StopReason = "dominated"
#: The loss-parity guard's verdict on a complete trial (``metrics["numerics"]["status"]``):
#: ``baseline`` (the reference run: the first complete trial of the space's baseline
#: configuration), ``ok`` (its per-step loss stays within the tolerance of the baseline's),
#: ``changed`` (it drifts beyond it: the configuration trains another model; a flag, not a
#: state), ``unchecked`` (no reference yet, or no loss to compare).
NumericsStatus = Literal["ok", "changed", "unchecked", "baseline"]
NUMERICS_STATUSES: tuple[NumericsStatus, ...] = get_args(NumericsStatus)


def numerics_status(metrics: Mapping[str, Any] | None) -> NumericsStatus | None:
    """The loss-parity status a trial's metrics hold (``metrics["numerics"]["status"]``), or
    None when they hold none."""
    v = (metrics or {}).get("numerics")
    st = v.get("status") if isinstance(v, Mapping) else None
    return st if st in NUMERICS_STATUSES else None


def finite(x: object) -> float | None:
    """``x`` as a float when it is a finite real number, else None.

    The one rule for metric values everywhere (agents, storage, API, metrics lines): None,
    a bool, a string, NaN and +/-inf are not numbers.
    """
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


# --- records ---------------------------------------------------------------------------------


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
    measurement: dict[str, Any] | None = Field(
        None,
        description="MeasurementSpec as a dict (dse.stats.measure); None: fixed, from semantics.",
    )
    prune: dict[str, Any] | None = Field(
        None,
        description="PruneTarget as a dict (dse.stats.measure): the study's best when the trial "
        "starts; the trial stops as dominated when its interval lies clearly below it.",
    )


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

    status: OutcomeStatus
    metrics: dict[str, Any] = field(default_factory=dict)
    failure_class: FailureClass | None = None
    reason: str | None = None
    steps: tuple[StepMetrics, ...] = ()
    source: Source = "measured"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def pruned(self) -> bool:
        """An ``ok`` outcome of a trial stopped early as dominated (stored as ``pruned``)."""
        m = self.metrics.get("measurement")
        return self.ok and isinstance(m, dict) and m.get("stop_reason") == PRUNED_STOP_REASON

    @classmethod
    def failure(
        cls,
        failure_class: FailureClass,
        reason: str,
        *,
        metrics: dict[str, Any] | None = None,
        steps: tuple[StepMetrics, ...] = (),
        source: Source = "measured",
    ) -> Outcome:
        status: OutcomeStatus = "infeasible" if failure_class in INFEASIBLE_CLASSES else "failed"
        return cls(status, dict(metrics or {}), failure_class, reason, steps, source)


@dataclass(frozen=True)
class StudyRecord:
    id: int
    name: str
    space_yaml: str
    space_hash: str
    state: StudyState
    direction: Direction
    metric: Metric
    created_at: float
    model: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    #: The study's change counter: moves with every write of its trials, rejections, state
    #: or attributes (not with heartbeats); equal versions, equal data. Not compared: two
    #: records of the same study data are equal whatever their counters (an imported copy).
    version: int = field(default=0, compare=False)


@dataclass(frozen=True)
class TrialRecord:
    id: int
    study_id: int
    number: int
    state: TrialState
    params: dict[str, Any]
    params_key: str
    metrics: dict[str, Any] = field(default_factory=dict)
    value: float | None = None
    failure_class: FailureClass | None = None
    reason: str | None = None
    source: Source | None = None
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
    #: A re-measurement: the number of the trial whose configuration this trial runs again
    #: (a baseline repeat of the loss-parity guard, or a re-measure of a configuration
    #: within noise of the best); None for a trial the agent proposed.
    remeasure_of: int | None = None

    @property
    def numerics(self) -> NumericsStatus | None:
        """The loss-parity status of the trial (:func:`numerics_status`)."""
        return numerics_status(self.metrics)


@dataclass(frozen=True)
class TrialRun:
    """Where and when a trial ran, for a timeline (``Storage.list_trial_runs``): its state,
    host (a cluster runner's placement after it finished), start and finish, the GPU slots
    it held when the runner recorded them (``metrics["gpu_slots"]``), and its interrupted
    attempts (``history``)."""

    number: int
    state: TrialState
    host: str | None
    started_at: float | None
    finished_at: float | None
    value: float | None = None
    failure_class: FailureClass | None = None
    reason: str | None = None
    gpu_slots: tuple[str, ...] | None = None
    history: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(cls, t: TrialRecord) -> TrialRun:
        """The run of a full trial record."""
        return cls(
            number=t.number,
            state=t.state,
            host=t.host,
            started_at=t.started_at,
            finished_at=t.finished_at,
            value=t.value,
            failure_class=t.failure_class,
            reason=t.reason,
            gpu_slots=gpu_slots_of(t.metrics),
            history=t.history,
        )


def gpu_slots_of(metrics: Any) -> tuple[str, ...] | None:
    """The GPU slot labels a trial's metrics record (``gpu_slots``: ``["host:0", ...]``), or
    None when they record none (or not as a list of strings)."""
    slots = metrics.get("gpu_slots") if isinstance(metrics, dict) else None
    if isinstance(slots, list) and slots and all(isinstance(x, str) for x in slots):
        return tuple(slots)
    return None


@dataclass(frozen=True)
class TrialPoint:
    """A trial in brief, for charts of a whole study (``Storage.list_trial_points``): no
    steps, paths or history; the summary metrics a chart plots."""

    id: int
    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None = None
    failure_class: FailureClass | None = None
    reason: str | None = None
    gpu_seconds: float | None = None
    tflops_per_gpu: float | None = None
    peak_mem_gib: float | None = None
    step_time_s: float | None = None
    #: the loss-parity status (:data:`NumericsStatus`), None when not judged
    numerics: NumericsStatus | None = None
    #: the trial it re-measures (:attr:`TrialRecord.remeasure_of`)
    remeasure_of: int | None = None


@dataclass(frozen=True)
class ConfigStats:
    """The eligible trials of one stored configuration (``params_key``) in aggregate
    (``Storage.best_configurations``): how many, the mean of their values and of the squares
    of their values, and the first of them (its number and knob values)."""

    params_key: str
    params: dict[str, Any]
    first_number: int
    n: int
    mean: float
    mean_sq: float

    @property
    def m2(self) -> float:
        """The sum of squared deviations of the values from their mean."""
        return max(0.0, self.n * (self.mean_sq - self.mean * self.mean))


@dataclass(frozen=True)
class RejectionRecord:
    """A proposal rejected before launch (a validity rule or the cost-model pre-screen)."""

    id: int
    study_id: int
    params: dict[str, Any]
    params_key: str
    kind: RejectionKind
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


# --- the trial contract: metrics lines, their writer and their reader -------------------------

_FinalLineType = Literal["summary", "failure"]
_FINAL: tuple[_FinalLineType, ...] = get_args(_FinalLineType)


class StepLine(BaseModel):
    """One training step (``{"type": "step", ...}``); numbers are finite, unknown fields are
    ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    type: Literal["step"] = "step"
    step: int
    step_time_s: float
    tflops_per_gpu: float
    peak_mem_gib: float
    peak_reserved_gib: float | None = Field(None, description="Default: peak_mem_gib.")
    loss: float
    grad_norm: float | None = None
    source: Source | None = None

    @classmethod
    def of(cls, m: StepMetrics, source: Source | None = None) -> StepLine:
        """The line of a step's metrics."""
        return cls(
            step=m.step,
            step_time_s=m.step_time_s,
            tflops_per_gpu=m.tflops_per_gpu,
            peak_mem_gib=m.peak_mem_gib,
            peak_reserved_gib=m.peak_reserved_gib,
            loss=m.loss,
            grad_norm=finite(m.grad_norm),
            source=source,
        )

    @classmethod
    def coerce(cls, m: StepMetrics | StepLine | Mapping[str, Any]) -> StepLine:
        """A step line from metrics, a line or a mapping of its fields (validated)."""
        if isinstance(m, StepLine):
            return m
        if isinstance(m, StepMetrics):
            return cls.of(m)
        return cls.model_validate({**m, "type": "step"})

    def metrics(self) -> StepMetrics:
        """The step as :class:`StepMetrics`."""
        reserved = self.peak_mem_gib if self.peak_reserved_gib is None else self.peak_reserved_gib
        return StepMetrics(
            step=self.step,
            step_time_s=self.step_time_s,
            tflops_per_gpu=self.tflops_per_gpu,
            peak_mem_gib=self.peak_mem_gib,
            peak_reserved_gib=reserved,
            loss=self.loss,
            grad_norm=self.grad_norm,
        )


class SummaryLine(BaseModel):
    """The summary of a run that finished (``{"type": "summary", ...}``).

    The three figures every objective needs are required; a workload adds its own (layout,
    losses, memory breakdown, versions) as extra fields, which become the outcome's metrics.
    """

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    type: Literal["summary"] = "summary"
    step_time_s: float
    tflops_per_gpu: float
    peak_mem_gib: float
    source: Source = "measured"


class FailureLine(BaseModel):
    """A classified failure (``{"type": "failure", ...}``); unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["failure"] = "failure"
    failure_class: FailureClass
    reason: str
    metrics: dict[str, Any] = Field(default_factory=dict)
    source: Source = "measured"


MetricsLine = StepLine | SummaryLine | FailureLine


class MetricsWriter:
    """Append-only writer of one trial's metrics JSONL (what :func:`read_metrics` reads).

    Each line is appended with one ``write`` under an exclusive ``flock`` and reaches the OS at
    once, so the controller can tail the file while the trial runs. JSON has no NaN: step and
    summary lines refuse non-finite numbers (:class:`pydantic.ValidationError`), a failure
    line drops them from its metrics. Only the first final line (summary or failure) of a
    file counts: a second rank that fails after another one already wrote a failure writes
    nothing.

    Args:
        path: the metrics file (``spec.metrics_path``); its folder is created.
        source: the ``source`` of every line written (``None``: lines keep their own).
    """

    def __init__(self, path: str | Path, *, source: Source | None = None) -> None:
        self.path = Path(path)
        self.source = source
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, line: MetricsLine) -> bool:
        """Append ``line``; False when it is final and a final line was already there."""
        if self.source is not None:
            line = line.model_copy(update={"source": self.source})
        data = line.model_dump(mode="json")
        if isinstance(line, StepLine) and data["source"] is None:
            del data["source"]
        text = json.dumps(data, allow_nan=False) + "\n"
        final = isinstance(line, SummaryLine | FailureLine)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if final and self.has_final():
                return False
            os.write(fd, text.encode())
            return True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def has_final(self) -> bool:
        """True when the file already holds a summary or failure line."""
        if not self.path.exists():
            return False
        for raw in self.path.read_text().splitlines():
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("type") in _FINAL:
                return True
        return False

    def step(self, m: StepMetrics | StepLine | Mapping[str, Any]) -> None:
        """One step line (from metrics, a line or a mapping of its fields)."""
        self.write(StepLine.coerce(m))

    def summary(self, record: Mapping[str, Any] | SummaryLine) -> bool:
        """The summary line; False when a final line was already there."""
        if not isinstance(record, SummaryLine):
            record = SummaryLine.model_validate({**record, "type": "summary"})
        return self.write(record)

    def failure(
        self,
        failure_class: FailureClass,
        reason: str,
        metrics: Mapping[str, Any] | None = None,
    ) -> bool:
        """The failure line (non-finite metrics dropped); False when a final line was already
        there."""
        clean = {
            k: v
            for k, v in (metrics or {}).items()
            if not isinstance(v, float) or math.isfinite(v)
        }
        return self.write(FailureLine(failure_class=failure_class, reason=reason, metrics=clean))


def read_metrics(path: str | Path) -> Outcome | None:
    """Read a metrics JSONL file written by a trial.

    Returns the outcome when the file ends in a summary or failure line, None when the trial
    has not finished (or the file does not exist). Partial trailing lines (not JSON) and lines
    of an unknown ``type`` are ignored; a line that breaks its model (:class:`StepLine`,
    :class:`SummaryLine`, :class:`FailureLine`) makes the outcome an ``error`` naming it.
    """
    p = Path(path)
    if not p.exists():
        return None
    steps: list[StepMetrics] = []
    final: SummaryLine | FailureLine | None = None
    raw_final: dict[str, Any] = {}
    bad: str | None = None
    for n, raw in enumerate(p.read_text().splitlines(), start=1):
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        kind = rec.get("type")
        try:
            if kind == "step":
                steps.append(StepLine.model_validate(rec).metrics())
            elif kind == "summary":
                final, raw_final = SummaryLine.model_validate(rec), rec
            elif kind == "failure":
                final, raw_final = FailureLine.model_validate(rec), rec
        except ValidationError as e:
            if kind in _FINAL:
                final = None
                raw_final = rec
            if bad is None:
                first = e.errors()[0]
                where = ".".join(str(x) for x in first["loc"]) or kind
                bad = f"{p.name} line {n}: bad {kind} line ({where}: {first['msg']})"
    if final is None and not raw_final:
        return None
    src: Source = final.source if final is not None else "measured"
    if bad is not None:
        return Outcome.failure("error", bad, steps=tuple(steps), source=src)
    if isinstance(final, SummaryLine):
        metrics = {k: v for k, v in raw_final.items() if k not in ("type", "source")}
        return Outcome("ok", metrics, steps=tuple(steps), source=src)
    assert isinstance(final, FailureLine)
    return Outcome.failure(
        final.failure_class,
        final.reason,
        metrics=dict(final.metrics),
        steps=tuple(steps),
        source=src,
    )


#: Study attribute :meth:`dse.storage.Storage.import_study` sets (true): the study's run
#: settings came from an export file and are not run unconfirmed (see dse.results.run_settings).
IMPORTED_ATTR = "imported"
#: Study attribute holding the last ``dse verify`` result (:mod:`dse.loop.verify`).
VERIFY_ATTR = "verify"


def sample_numbers(numbers: Iterable[int], limit: int, seed: int = 0) -> list[int]:
    """At most ``limit`` of the trial ``numbers``, ascending: all of them, or the ``limit``
    whose numbers hash lowest (with ``seed``; a bottom-k sample). A uniform sample, the same
    on every run and machine, that one more number changes by at most one member, so that a
    figure drawn from it does not jump as a study grows."""
    return sorted(heapq.nsmallest(limit, numbers, key=lambda n: _mix(n, seed)))


def _mix(number: int, seed: int) -> int:
    """A 64-bit hash of a trial number (splitmix64's finalizer)."""
    z = (number * 0x9E3779B97F4A7C15 + seed * 0xBF58476D1CE4E5B9 + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)
