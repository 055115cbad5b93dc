"""Response and request schemas of the REST API (never the storage records or tables).

Naming follows the full-stack-fastapi-template: ``XPublic`` is what a client sees of an
``X``, ``XsPublic`` a page of them (``{data, count}``). Non-finite numbers (a NaN loss) are
sent as ``null``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dse.core.records import Metric, NumericsStatus
from dse.space.searchspace import MODEL_FAMILY_FIELDS, ModelSpec, Semantics

__all__ = [
    "ErrorPublic",
    "HealthPublic",
    "StudySummaryPublic",
    "StudiesPublic",
    "StudyPublic",
    "StudyCreatedPublic",
    "LaunchPublic",
    "TrialPublic",
    "TrialsPublic",
    "StepPublic",
    "TrialDetailPublic",
    "ObjectivePublic",
    "NumericsPublic",
    "FigurePublic",
    "TiePublic",
    "BestNoisePublic",
    "BestPublic",
    "ANY",
    "BestQuery",
    "HARDWARE_FIELDS",
    "MODEL_FIELDS",
    "SEMANTICS_FIELDS",
    "CrossBestPublic",
    "PointPublic",
    "ParetoPublic",
    "RejectionPublic",
    "RejectionsPublic",
    "TrialOrder",
    "TimelinePublic",
    "LossCurvesPublic",
    "CompareStudyPublic",
    "ComparePublic",
    "ComparablePublic",
]

# Formats of ``GET /studies/{name}/best`` (``json`` is a JSON object, the others text/plain),
# trial states and objective metrics are the vocabulary's (dse.core.records): BestFormat,
# TrialState, Metric.

#: Orders of a trial page.
TrialOrder = Literal["number", "-number", "value", "-value"]


class ErrorPublic(BaseModel):
    """Every error response: ``{"detail": message}``."""

    detail: str = Field(description="What went wrong, naming the field or object.")


class HealthPublic(BaseModel):
    """``GET /api/v1/health``."""

    status: Literal["ok"]
    version: str
    storage: str = Field(description="The database URL, password hidden.")
    schema_revision: str
    writes_enabled: bool = Field(description="Whether an API token is configured.")
    poll_interval_s: float = Field(description="How often the dashboard polls a running study.")


class GpuUsagePublic(BaseModel):
    """A study's GPU time (``dse.results.gpu_usage``, the same figures as ``dse status`` and the
    report). GPU figures are null on CPU; the busy fraction is then of CPU ranks."""

    device: str = Field(description="The study's device: cuda or cpu.")
    gpu_hours: float = Field(description="GPU-hours of its trials (the sum of gpu_seconds).")
    gpu_hours_startup: float | None = Field(
        description="Of those, outside training steps: launch (or hand-off to a warm worker) "
        "to the first step, gaps between steps, teardown (sum of gpu_seconds_startup)."
    )
    gpu_hours_measure: float | None = Field(
        description="Of those, in training steps, warm-up included (sum of gpu_seconds_measure)."
    )
    held_gpu_hours: float | None = Field(
        description="GPU-hours the study held: its controllers' wall time x the GPUs their "
        "runner holds (local runner), or its trials' own (runners that take GPUs per trial)."
    )
    held_basis: Literal["controller", "trials"] | None = Field(
        description="How the held time was measured (see held_gpu_hours)."
    )
    busy_fraction: float | None = Field(
        description="Device-seconds in training steps / device-seconds held (0..1)."
    )
    device_seconds_held: float | None = Field(description="Held time in device-seconds.")
    device_seconds_startup: float | None = Field(
        description="Device-seconds of trials outside training steps."
    )
    device_seconds_measure: float | None = Field(
        description="Device-seconds of trials in training steps."
    )
    measured_fraction: float | None = Field(
        None,
        description="Device-seconds in measured steps (after each trial's warm-up) / "
        "device-seconds held (0..1): busy as a user means it.",
    )
    kernel_fraction: float | None = Field(
        None,
        description="Device-seconds in any device work of the trials (model builds, first, "
        "warm-up and measured steps) / device-seconds held (0..1).",
    )
    first_step_s_median: float | None = Field(
        None, description="A trial's first step (kernel compilation included), median, s."
    )
    first_step_s_max: float | None = Field(None, description="The longest first step, s.")
    device_seconds_measured: float | None = Field(
        None, description="Device-seconds in measured steps."
    )
    device_seconds_kernel: float | None = Field(
        None, description="Device-seconds in builds and all steps."
    )
    device_seconds_first_step: float | None = Field(
        None, description="Device-seconds in the trials' first steps."
    )
    trials_without_split: int | None = Field(
        None,
        description="Trials without the build / first / warm-up / measured split (another "
        "workload, or stored before it): all their steps count as measured.",
    )
    accounting: dict[str, Any] | None = Field(
        None,
        description="Where the held device-seconds went, by part (build, first_step, warmup, "
        "measured, in_trial_other, between_trials; the parts add up to the held time): "
        "seconds, shares of the held time, seconds per trial.",
    )
    trials_run: int = Field(description="Trials with recorded GPU time.")
    trials_timed: int = Field(description="Trials with the startup/measure split.")
    mean_gpu_seconds_per_trial: float | None
    grid_configurations: int | None = Field(
        description="Valid configurations of the space (the space check's count)."
    )
    grid_complete: bool | None = Field(
        description="False when the space is larger than the check looks at whole "
        "(grid_configurations is then estimated from a random sample)."
    )
    grid_gpu_hours: float | None = Field(
        description="Estimate: every valid configuration run once at the study's mean "
        "GPU-seconds per trial."
    )
    saved_gpu_hours: float | None = Field(description="Estimate: grid_gpu_hours - gpu_hours.")
    saved_fraction: float | None = Field(description="Estimate: saved / grid GPU-hours.")
    label: str = Field(description="Which figures are measured and which are estimates.")


class StudySummaryPublic(BaseModel):
    """A study in the list: its state, trial counts and best value so far."""

    name: str
    state: str
    direction: str
    metric: str
    created_at: float
    counts: dict[str, int] = Field(description="Trials per state, and 'total'.")
    rejections: int = Field(description="Proposals rejected before launch.")
    best_value: float | None = Field(
        description="Best objective value so far: the pooled estimate of the best "
        "configuration (noise-aware; numerics-changed trials left out unless allowed)."
    )
    best_trial: int | None = Field(
        description="Number of the best configuration's first trial (GET .../best: 'trial')."
    )
    best_ci: list[float | None] | None = Field(
        None, description="[low, high]: the 95 % interval of best_value (null: not known)."
    )
    best_tied: list[int] = Field(
        default_factory=list,
        description="First trials of the configurations tied within noise with the best "
        "(their intervals overlap the best's); empty when the best is clear.",
    )
    numerics_counts: dict[str, int] = Field(
        default_factory=dict,
        description="Complete trials per loss-parity status: 'baseline', 'ok', 'changed' "
        "(numerics-changed: excluded from best unless allowed), 'unchecked'.",
    )
    remeasure_trials: int = Field(
        0, description="Re-measurement trials (baseline repeats and re-measures of ties)."
    )
    gpu_hours: float = Field(description="GPU-hours spent by finished trials.")
    gpu: GpuUsagePublic = Field(
        description="GPU time: startup/measure split, held, busy fraction, grid saving."
    )
    model: dict[str, Any]
    hardware: dict[str, Any]


class StudiesPublic(BaseModel):
    data: list[StudySummaryPublic]
    count: int


class StudyPublic(StudySummaryPublic):
    """One study: the summary, the space file as given and rejections per kind."""

    space_hash: str
    space_yaml: str
    rejection_counts: dict[str, int] = Field(description="Rejections per kind.")


class LaunchPublic(BaseModel):
    """A controller started by ``POST /studies?start=true``."""

    pid: int
    command: list[str] = Field(description="The command line (without secrets).")
    log_path: str | None


class StudyCreatedPublic(StudyPublic):
    launch: LaunchPublic | None = None


class NumericsPublic(BaseModel):
    """The loss-parity verdict of a complete trial (``metrics.numerics``)."""

    status: NumericsStatus = Field(
        description="'baseline' (the reference run), 'ok', 'changed' (its loss drifts beyond "
        "the tolerance: numerics-changed, excluded from best unless allowed) or 'unchecked' "
        "(no reference or no loss to compare)."
    )
    drift: float | None = Field(
        description="Largest |loss - baseline loss| / baseline loss over the steps compared."
    )
    tolerance: float | None = Field(
        description="Relative tolerance: max(floor, noise_factor x measured run-to-run drift)."
    )
    baseline_trial: int | None = Field(description="Number of the baseline trial compared with.")
    steps_compared: int = Field(description="Steps both trials ran.")


class TrialPublic(BaseModel):
    """A trial in a page (metrics without the per-step loss list)."""

    id: int
    number: int
    state: str
    params: dict[str, Any]
    value: float | None
    metrics: dict[str, Any]
    failure_class: str | None
    reason: str | None
    source: str | None
    host: str | None
    queued_at: float | None
    started_at: float | None
    finished_at: float | None
    gpu_seconds: float | None
    attempts: int
    numerics: NumericsPublic | None = Field(
        None, description="The loss-parity verdict (also metrics.numerics); null: not judged."
    )
    remeasure_of: int | None = Field(
        None,
        description="A re-measurement: the number of the trial whose configuration it runs "
        "again (baseline repeat or re-measure of a tie); null for a trial the agent proposed.",
    )


class FigurePublic(BaseModel):
    """A figure of the best configuration, pooled over its trials, with its interval."""

    value: float | None
    ci: list[float | None] | None = Field(
        description="[low, high]: the 95 % interval (null: not known, e.g. peak memory)."
    )


class EstimatePublic(BaseModel):
    """A configuration's pooled figures with THE 95 % intervals (the noise model of
    dse.results.noise: the same wherever a trial of it is shown)."""

    trial: int = Field(description="The configuration's first trial.")
    n: int = Field(description="How many runs of it are pooled.")
    trials: list[int] = Field(description="Its runs (the first 50 when more).")
    kind: Literal["measured", "estimate"] = Field(
        description="'measured' (step-to-step and run-to-run noise) or 'estimate' (a "
        "deterministic workload's error band: sim, a replay of one run; never re-measured)."
    )
    source: str = Field(description="What the interval rests on: steps, measured, repeats, "
                        "prior, estimate.")  # fmt: skip
    figures: dict[str, FigurePublic]


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int = Field(description="Trials matching the filter (all pages).")
    intervals: dict[str, EstimatePublic] = Field(
        {},
        description="By trial number, each complete trial's configuration: its pooled "
        "figures and their 95 % intervals (the ones the best panel, the comparison view, the "
        "report and the CLI show).",
    )


class StepPublic(BaseModel):
    step: int
    step_time_s: float | None
    tflops_per_gpu: float | None
    peak_mem_gib: float | None
    peak_reserved_gib: float | None
    loss: float | None
    grad_norm: float | None


class TrialDetailPublic(TrialPublic):
    """One trial with its per-step metrics and where it ran."""

    study: str
    runner: str | None
    log_path: str | None
    metrics_path: str | None
    heartbeat_at: float | None
    history: list[dict[str, Any]]
    steps: list[StepPublic]


class ObjectivePublic(BaseModel):
    metric: str
    direction: str
    value: float | None = Field(
        description="The best configuration's pooled estimate (its trial's value when it "
        "ran once); its interval is noise.figures[metric].ci."
    )


class TiePublic(BaseModel):
    """A configuration tied within noise with the best (its interval overlaps the best's)."""

    trial: int = Field(description="Its first trial.")
    trials: list[int] = Field(description="Every trial of it (pooled).")
    value: float | None = Field(description="Its pooled objective.")
    ci: list[float | None] | None
    params: dict[str, Any] = Field(description="Its knob values.")
    study: str | None = Field(
        None, description="The study of its first trial (a cross-study answer), else null."
    )


class BestNoisePublic(BaseModel):
    """How sure the best is: pooled figures with intervals, and the ties."""

    trials: list[int] = Field(
        description="The trials of the best configuration (repeats and re-measures pooled; "
        "configurations identical in effect count as one); the first 50 when it ran more."
    )
    n_trials: int = Field(description="How many trials the pooled objective is over.")
    figures: dict[str, FigurePublic] = Field(
        description="tflops_per_gpu, step_time_s, tokens_per_s_per_gpu (with intervals) and "
        "peak_mem_gib, pooled over the trials."
    )
    interval_source: Literal["measured", "steps", "repeats", "prior", "estimate", "none"] = Field(
        description="What the intervals rest on beside the run-to-run noise model: 'steps' "
        "(the stored per-step figures after warm-up), 'measured' (the trials' own "
        "tflops_per_gpu_ci / step_time_ci_s), 'repeats' (run-to-run spread only), 'prior' "
        "(one run: the model's prior), 'estimate' (a deterministic workload's error band), "
        "'none'."
    )
    kind: Literal["measured", "estimate"] = Field(
        "measured",
        description="'estimate': the figures are deterministic (sim, a replay of one run), "
        "their interval an error band; never re-measured.",
    )
    rel_sd: float | None = Field(
        description="Relative run-to-run standard deviation of the objective that the "
        "re-measures alone show (null: none yet); model.rel_sd is the one the intervals use."
    )
    model: dict[str, Any] = Field(
        {},
        description="The noise model: rel_sd (used), prior_rel_sd, learned_rel_sd, dof, "
        "prior_dof, basis ('prior' or 're-measures').",
    )
    verdict: Literal["best", "tied"] = Field(
        "best", description="'best' (its interval clears every other) or 'tied'."
    )
    answer: str = Field("", description="The decision in words.")
    split_budget: int | None = Field(
        None,
        description="The re-measure budget (runs, all told) that would split the tie (null: "
        "no tie, estimates, or no practical budget).",
    )
    inseparable: list[int] = Field(
        [],
        description="First trials of the tied configurations no practical re-measure budget "
        "separates from the best (equal to it within noise).",
    )
    evidence: list[dict[str, Any]] = Field(
        [],
        description="A cross-study answer: every run pooled into the best, {study, trial}; "
        "a run found twice by its content (an imported copy) once.",
    )
    tied: list[TiePublic] = Field(
        description="Configurations tied within noise with the best, best first."
    )
    message: str = Field(
        description="'tied within noise: trial A and trial B' when tied, else empty."
    )


class BestPublic(BaseModel):
    """The best configuration of a study and its configuration in every export format.

    Noise-aware: the configuration with the best pooled objective; configurations flagged
    numerics-changed are left out unless the space allows them."""

    study: str
    trial: int = Field(description="The best configuration's first trial.")
    objective: ObjectivePublic
    params: dict[str, Any] = Field(description="Knob values, fixed ones included.")
    metrics: dict[str, Any]
    source: str | None
    model: dict[str, Any]
    hardware: dict[str, Any]
    numerics: NumericsPublic | None = Field(
        None, description="The loss-parity verdict of the best trial (null: not judged)."
    )
    noise: BestNoisePublic | None = Field(
        None, description="Pooled figures with their intervals, the pooled trials, the ties."
    )
    exports: dict[str, str | None] = Field(
        description="The knob and environment part of the best trial's launch command on "
        "each recipe target, as 'dse best --format' prints it: 'megatron' (Megatron-LM "
        "arguments), 'bridge' (Megatron-Bridge overrides), 'nemo' (NeMo-Run overrides), each "
        "'export NAME=value' lines then the arguments; null where the target cannot express "
        "a knob value, with '<format>_why' naming the knob, its value and the nearest "
        "upstream setting."
    )
    trust: dict[str, Any] | None = Field(
        None,
        description="For a study of estimates (workload sim): its estimates by trust label "
        "(calibrated, interpolated, extrapolated), the highest estimate and the best within "
        "the measured range ('trusted_best'), which an extrapolated estimate never replaces. "
        "Null for a measured study.",
    )


#: Fields of a study's hardware that a best query may match (``GET /best`` and the body of
#: ``POST /best/query``); model fields are those of the space's ``model``, semantics fields
#: those of its ``semantics``.
HARDWARE_FIELDS = ("gpu", "gpu_memory_gib", "world_size", "device")
MODEL_FIELDS = tuple(ModelSpec.model_fields)
#: The value of a model family field (:data:`~dse.space.searchspace.MODEL_FAMILY_FIELDS`) in a best
#: query that matches a study whatever it has there (left out, the field means absent).
ANY = "any"
SEMANTICS_FIELDS = tuple(k for k in Semantics.model_fields if k != "data")


def _only_known(what: str, v: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    unknown = [k for k in v if k not in known]
    if unknown:
        raise ValueError(
            f"unknown {what} field {', '.join(map(repr, unknown))} (known: {', '.join(known)})"
        )
    return v


class BestQuery(BaseModel):
    """``POST /api/v1/best/query``: match studies by model, semantics and hardware fields."""

    model_config = ConfigDict(extra="forbid")

    model: dict[str, int | str | bool | None] = Field(
        default_factory=dict,
        description="Model fields that must equal the study's (e.g. num_layers, hidden_size, "
        "seq_length). Left out, num_moe_experts, hybrid_layer_pattern and frozen_params "
        "mean absent (a dense GPT without frozen encoders; null and 0 read the same); give "
        "a value, or 'any' to match whatever a study has there.",
    )
    semantics: dict[str, int | float | str | None] = Field(
        default_factory=dict,
        description="Training semantics that must equal the study's (seq_length, "
        "global_batch_size, precision, steps, ...).",
    )
    hardware: dict[str, int | float | str | None] = Field(
        default_factory=dict,
        description="Hardware fields that must equal the study's (gpu, world_size, device, "
        "gpu_memory_gib); gpu is compared without case.",
    )
    metric: Metric = Field("tflops_per_gpu", description="Objective the studies optimise.")

    @field_validator("model")
    @classmethod
    def _model_known(cls, v: dict[str, Any]) -> dict[str, Any]:
        v = _only_known("model", v, MODEL_FIELDS)
        wild = [k for k, x in v.items() if x == ANY and k not in MODEL_FAMILY_FIELDS]
        if wild:
            raise ValueError(
                f"model.{wild[0]}: {ANY!r} matches any value only for "
                f"{', '.join(MODEL_FAMILY_FIELDS)} (which otherwise mean absent)"
            )
        return v

    @field_validator("semantics")
    @classmethod
    def _semantics_known(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _only_known("semantics", v, SEMANTICS_FIELDS)

    @field_validator("hardware")
    @classmethod
    def _hardware_known(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _only_known("hardware", v, HARDWARE_FIELDS)


class CrossBestPublic(BaseModel):
    """The best trial over every study that matches a model/hardware query."""

    matched: list[str] = Field(description="Studies whose model and hardware match.")
    best: BestPublic


class PointPublic(BaseModel):
    """A trial (or a pre-launch rejection) as a point of TFLOP/s vs peak memory.

    ``kind`` is ``complete``, ``pruned`` (stopped early, dominated; never on the front), the
    failure class of a failed or infeasible trial (``oom``, ``invalid``, ``predicted_oom``,
    ``error``, ``timeout``, ``hang``, ``nan``, ...), or the state of an unfinished one
    (``queued``, ``running``). Rejections have no trial number;
    their ``peak_mem_gib`` is the cost model's prediction when there is one.
    """

    trial_id: int | None
    number: int | None
    state: str
    kind: str
    source: Literal["trial", "rejection"]
    value: float | None
    tflops_per_gpu: float | None
    peak_mem_gib: float | None
    step_time_s: float | None
    gpu_seconds: float | None
    on_front: bool
    reason: str | None
    params: dict[str, Any]
    numerics: NumericsStatus | None = Field(
        None, description="Loss-parity status of a trial ('changed': numerics-changed)."
    )
    remeasure_of: int | None = Field(None, description="The trial it re-measures.")


class BestSoFarPublic(BaseModel):
    number: int = Field(description="Trial number.")
    value: float | None = Field(description="The best pooled objective up to it (null: none).")


class ParetoPublic(BaseModel):
    """The non-dominated complete trials (max TFLOP/s, min peak memory) and every point."""

    study: str
    x_metric: Literal["tflops_per_gpu"] = "tflops_per_gpu"
    y_metric: Literal["peak_mem_gib"] = "peak_mem_gib"
    direction: str
    metric: str
    gpu_memory_gib: float | None = Field(description="Memory per GPU of the study hardware.")
    front: list[PointPublic] = Field(description="The front, by increasing TFLOP/s.")
    points: list[PointPublic] = Field(description="Every trial by number, then rejections.")
    best_so_far: list[BestSoFarPublic] = Field(
        [],
        description="The noise-aware best after each trial (the best pooled objective of "
        "the configurations measured so far; the last one is GET .../best's value).",
    )


class RejectionPublic(BaseModel):
    id: int
    params: dict[str, Any]
    kind: str = Field(description="'invalid' (a rule) or 'predicted_oom' (the cost model).")
    rule: str
    reason: str
    values: dict[str, Any]
    created_at: float | None


class RejectionsPublic(BaseModel):
    data: list[RejectionPublic]
    count: int = Field(description="Rejections matching the filter (all pages).")
    counts: dict[str, int] = Field(description="Rejections per kind (whole study).")


# --- decision views (data from dse.report.plots, the same the report draws) -------------------


class TimelineBarPublic(BaseModel):
    trial: int = Field(description="Trial number.")
    state: str = Field(description="The trial's state, or 'interrupted' (a re-queued attempt).")
    lane: str = Field(description="The GPU slot (lane) it held.")
    start: float = Field(description="Seconds since the timeline's first start (t0).")
    end: float = Field(description="Seconds since t0 (a running trial: now).")
    duration_s: float
    reason: str | None
    failure_class: str | None
    value: float | None
    open: bool = Field(description="Still running.")


class TimelineLanePublic(BaseModel):
    label: str
    busy_s: float = Field(description="Seconds some trial held the slot.")
    busy_fraction: float | None = Field(description="busy_s over the timeline's span.")


class TimelineGapPublic(BaseModel):
    lane: str
    start: float
    end: float
    duration_s: float


class TimelinePublic(BaseModel):
    """What ran where and when: one lane per GPU slot, bars per trial, idle gaps."""

    study: str
    t0: float = Field(description="Epoch seconds of the first start.")
    span_s: float
    unit: str = Field(description="Unit the plots use for the time axis: s, min or h.")
    scale: float = Field(description="Seconds per unit.")
    lanes: list[TimelineLanePublic]
    bars: list[TimelineBarPublic]
    gaps: list[TimelineGapPublic]
    busy_fraction: float | None = Field(description="Busy slot-seconds over span x lanes.")
    slots_from: list[str] = Field(
        description="Where the lanes come from: 'gpu_slots' (recorded per trial), "
        "'placement' (a cluster runner's nodes and GPU indices), 'overlap' (inferred)."
    )
    trials_shown: int = Field(description="Trials in this answer (the latest starts).")
    trials_ran: int = Field(description="Trials of the study that ran (started) in all.")
    runs: int = Field(description="Runs drawn: the trials and their interrupted attempts.")
    colors: dict[str, str] = Field(description="Colour of each state.")
    label: str


class LossCurvePublic(BaseModel):
    number: int
    state: str
    baseline: bool = Field(description="The baseline configuration's trial.")
    params: dict[str, Any]
    value: float | None
    numerics: str | None = Field(description="metrics.numerics.status when checked.")
    drift: float | None
    source: str | None = Field(
        None,
        description="Where the losses come from: measured, replay, or estimate (the sim "
        "workload: simulated, not trained).",
    )
    steps: list[int]
    loss: list[float | None]


class LossCurvesPublic(BaseModel):
    """Per-step losses of chosen trials over the baseline trial's (listed first)."""

    study: str
    baseline: int | None = Field(description="Number of the baseline trial (None: not run).")
    baseline_params: dict[str, Any]
    baseline_how: str
    curves: list[LossCurvePublic]
    colors: dict[str, str]


class CompareBestPublic(BaseModel):
    trial: int
    value: float | None
    params: dict[str, Any]
    source: str | None
    numerics: str | None
    tflops_per_gpu: float | None
    step_time_s: float | None
    peak_mem_gib: float | None
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu_ci: list[float | None] | None
    step_time_ci_s: list[float | None] | None
    step_clock: Literal["wall", "cpu"] = Field(
        "wall",
        description="What step_time_s times: 'cpu' (measurement.clock cpu: the CPU time of a "
        "step, its wall time in step_wall_time_s) or 'wall'.",
    )
    step_wall_time_s: float | None = Field(
        None, description="The best trial's wall time per step where step_clock is 'cpu'."
    )
    pooled: bool = Field(
        False, description="The figures are the configuration's pooled ones (noise-aware)."
    )
    trials: list[int] = Field([], description="The trials they pool (repeats, re-measures).")
    tied: list[int] = Field([], description="First trials of the configurations tied with it.")
    tie: str = Field("", description="'tied within noise: trial A and trial B', else empty.")


class CompareStudyPublic(BaseModel):
    """A study in a comparison: hardware, recipe, training settings, best figures."""

    study: str
    state: str
    metric: str
    direction: str
    recipe: str | None
    workload: str | None
    gpu: str | None
    gpu_memory_gib: float | None
    world_size: int | None
    device: str | None
    seq_length: int | None
    global_batch_size: int | None
    counts: dict[str, int]
    gpu_hours: float
    best: CompareBestPublic | None


class ComparePublic(BaseModel):
    """Studies of one model side by side."""

    model: dict[str, Any]
    figures: dict[str, str] = Field(description="Figure keys of each best and their labels.")
    studies: list[CompareStudyPublic]
    label: str


class ComparablePublic(BaseModel):
    """The other studies of a study's model."""

    study: str
    data: list[CompareStudyPublic]
    count: int


class VerifyPublic(BaseModel):
    """The last ``dse verify`` of a study (``GET /studies/{name}/verify``): the long runs of
    its best and its baseline (measured, one CPU rank of the built-in trainer), a checkpoint
    saved midway and reloaded, and the verdict."""

    study: str
    best_trial: int = Field(description="The best's trial number when verify ran.")
    steps: int = Field(description="Steps of each long run.")
    verdict: str = Field(description="`verified` or `failed`.")
    reasons: list[str] = Field(description="What failed, each naming its run; empty if verified.")
    loss_drift: float | None = Field(
        description="(best's last loss - baseline's) / baseline's; None when the best is the "
        "baseline."
    )
    best_is_baseline: bool
    best: dict[str, Any] = Field(
        description="The best's run: steps, first_loss, last_loss, losses, final_step_time_s, "
        "final_tflops_per_gpu, peak_mem_gib, reload_ok, reload_reason (or error)."
    )
    baseline: dict[str, Any] | None = Field(description="The baseline's run, as `best`.")
