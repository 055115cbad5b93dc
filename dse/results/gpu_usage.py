"""GPU time of trials and studies, computed in one place for the controller, the report,
``dse status`` and the API.

Per trial (:func:`trial_timing`, added to the trial's metrics when it finishes): the wall time
the runner held its devices (launch, or hand-off to a warm worker, to the final line), split
into the training steps (``measure``: the sum of the step times the trial recorded, warm-up
steps included) and the rest (``startup``: process start, imports, model build, set-up before
the first step, plus the short gaps between steps and the teardown). On CUDA these are
GPU-seconds, wall seconds x GPUs of the trial: ``gpu_seconds_startup`` +
``gpu_seconds_measure`` = the trial's ``gpu_seconds`` column. Every trial also gets
``timing`` (wall seconds and device count, on CPU too).

Per study (:func:`study_gpu_usage`):

* **held**: the devices the study held, for how long. For a runner that holds its devices for
  the whole study (the local runner: its slots x ranks per trial), each controller run records
  its devices and its wall time (from when its runner was prepared to the end of its loop,
  refreshed at every heartbeat) in a study attribute (``held:<owner>``); held = the sum over
  the runs of wall seconds x devices. A runner that takes devices per trial (Slurm, Ray) holds
  them only while its trials run: held = the sum of the trials' own device-seconds.
* **GPU-busy fraction** = device-seconds in training steps (all trials) / device-seconds held.
  It is the share of the held GPU time spent in training steps; 1 - it is what start-up,
  model builds, failures, the controller's own work and idle slots cost.
* **Busy as a user means it** (:func:`busy_shares`): ``measured_fraction``, the share of the
  held device-seconds spent in *measured* steps (after each trial's warm-up: the steps its
  figures come from), beside ``kernel_fraction``, the share in any device work of a trial
  (its model build, its first step with the kernels' compilation, its warm-up and measured
  steps). Each trial records them apart (``build_s``, ``first_step_s``, ``warmup_steps_s``,
  ``measured_steps_s``, the built-in trainer's summary); a trial without them (another
  workload, or stored before) counts all its steps as measured and no build
  (``trials_without_split``).
* **Accounting** (:func:`accounting`): the held device-seconds split into parts that add up
  to them: model builds, first steps, warm-up steps after the first, measured steps, the rest
  of the trials' time (process start or hand-off, gaps, teardown) and the time held outside
  any trial (worker start, the controller between trials, idle slots), as seconds, shares of
  the held time and seconds per trial.
* **grid saving** (an estimate): every valid configuration of the space (the space check's
  count, :func:`count_grid`) run once at the study's mean GPU-seconds per trial, minus the
  GPU-seconds the study spent.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dse.core.exceptions import SpaceError
from dse.core.records import StepMetrics, StudyRecord, TrialRecord, finite
from dse.model.rules import check_space
from dse.results.reads import StudyReads
from dse.space.searchspace import parse_space_text
from dse.stats.gpu_figures import TRIAL_GPU_FIGURES, GpuTotals, trial_gpu_figures

__all__ = [
    "HELD_ATTR_PREFIX",
    "GRID_ATTR",
    "GridCount",
    "count_grid",
    "grid_of_study",
    "held_record",
    "trial_timing",
    "study_gpu_usage",
    "study_gpu_usage_of",
    "busy_shares",
    "accounting",
    "ACCOUNT_PARTS",
    "gpu_totals",
    "usage_of_totals",
]

#: Study attribute of one controller run: ``held:<owner>`` -> ``{"started", "last",
#: "devices", "device"}`` (wall-clock seconds since the epoch; devices None: the runner takes
#: devices per trial).
HELD_ATTR_PREFIX = "held:"
#: Study attribute with the space's valid configurations (:class:`GridCount` as a dict, and
#: the ``space_hash`` it was counted for).
GRID_ATTR = "grid"


@dataclass(frozen=True)
class GridCount:
    """The valid configurations of a space (those that pass the rules)."""

    configurations: int
    looked_at: int
    #: False when the space is larger than the space check looks at whole: ``configurations``
    #: is then estimated from its random sample
    complete: bool


def count_grid(space: Any) -> GridCount:
    """The space check's count of valid configurations (:func:`dse.model.rules.check_space`)."""

    got = check_space(space, f"study {space.study!r}")
    return GridCount(got.estimated_valid, got.looked_at, got.complete)


@functools.lru_cache(maxsize=64)
def _grid_of_text(space_hash: str, space_yaml: str, name: str) -> GridCount | None:
    try:
        return count_grid(parse_space_text(space_yaml, f"study {name!r}"))
    except (SpaceError, ValueError):
        return None


def grid_of_study(study: StudyRecord, attrs: Mapping[str, Any]) -> GridCount | None:
    """A study's grid: the count its controller stored, else counted here (once per process
    and space)."""
    g = attrs.get(GRID_ATTR)
    if isinstance(g, Mapping) and g.get("space_hash") == study.space_hash:
        try:
            return GridCount(int(g["configurations"]), int(g["looked_at"]), bool(g["complete"]))
        except (KeyError, TypeError, ValueError):
            pass
    return _grid_of_text(study.space_hash, study.space_yaml, study.name)


def grid_attr(grid: GridCount, space_hash: str) -> dict[str, Any]:
    """The :data:`GRID_ATTR` value of a count."""
    return {**asdict(grid), "space_hash": space_hash}


def held_record(
    started: float, devices: int | None, device: str, last: float | None = None
) -> dict[str, Any]:
    """The :data:`HELD_ATTR_PREFIX` attribute of a controller run."""
    return {
        "started": started,
        "last": time.time() if last is None else last,
        "devices": devices,
        "device": device,
    }


def trial_timing(
    *,
    wall_s: float,
    devices: int,
    device: str,
    steps: Sequence[StepMetrics],
    measured: bool,
    gpu_slots: Iterable[str] = (),
) -> dict[str, Any]:
    """The metrics a finished trial gets from the controller (see the module doc).

    ``measured``: the steps ran here (a replay's or an estimate's step times are not this
    trial's: its measure is 0)."""
    wall = max(0.0, float(wall_s))
    measure = min(wall, sum(s.step_time_s for s in steps)) if measured else 0.0
    startup = wall - measure
    out: dict[str, Any] = {
        "timing": {
            "device": device,
            "devices": devices,
            "wall_s": wall,
            "startup_s": startup,
            "measure_s": measure,
        }
    }
    if device == "cuda":
        out["gpu_seconds_startup"] = startup * devices
        out["gpu_seconds_measure"] = measure * devices
        out["gpu_slots"] = list(gpu_slots)
    return out


def _fold(trials: Sequence[TrialRecord], estimates: int = 0) -> GpuTotals:
    """:class:`GpuTotals` of ``trials`` (every one counted; in their order)."""
    figs = [trial_gpu_figures(t.metrics) for t in trials]

    def total(key: str) -> float:
        return sum((x for f in figs if (x := f[key]) is not None), 0.0)

    firsts = sorted(x for f in figs if (x := f["first_step_s"]) is not None)
    ran = [t.gpu_seconds for t in trials if t.gpu_seconds]
    return GpuTotals(
        estimates=estimates,
        trials=len(trials),
        gpu_seconds=sum((_num(t.gpu_seconds) for t in trials), 0.0),
        ran=len(ran),
        ran_seconds=sum(ran, 0.0),
        **{k: total(k) for k in TRIAL_GPU_FIGURES if k != "first_step_s"},
        timed=sum(1 for f in figs if f["device_seconds"] is not None),
        split=len(firsts),
        first_step_s_median=firsts[len(firsts) // 2] if firsts else None,
        first_step_s_max=firsts[-1] if firsts else None,
    )


def gpu_totals(trials: Sequence[TrialRecord]) -> GpuTotals:
    """:class:`GpuTotals` of a study's trial records (the storage's query computes the same
    from its columns)."""
    return _fold(
        [t for t in trials if t.source != "estimate"],
        estimates=sum(1 for t in trials if t.source == "estimate"),
    )


def busy_shares(trials: Sequence[TrialRecord], held: float | None) -> dict[str, Any]:
    """The measured-step and all-kernel shares of ``held`` device-seconds, and the first
    steps' cost (see the module doc): over the trials with a ``timing`` record."""
    return _shares(_fold(trials), held)


def _shares(t: GpuTotals, held: float | None) -> dict[str, Any]:
    return {
        "measured_fraction": t.device_seconds_measured / held if held else None,
        "kernel_fraction": min(1.0, t.device_seconds_kernel / held) if held else None,
        "device_seconds_measured": t.device_seconds_measured,
        "device_seconds_kernel": t.device_seconds_kernel,
        "device_seconds_first_step": t.device_seconds_first_step,
        "first_step_s_median": t.first_step_s_median,
        "first_step_s_max": t.first_step_s_max,
        "trials_without_split": t.timed - t.split,
    }


def _num(x: Any) -> float:
    f = finite(x)
    return 0.0 if f is None else f


#: The parts of a study's held device time (:func:`accounting`), in order.
ACCOUNT_PARTS = (
    ("build", "model builds (parallel state, model, DDP, optimizer)"),
    ("first_step", "first steps (kernel compilation and autotuning, the allocator's growth)"),
    ("warmup", "warm-up steps after the first"),
    ("measured", "measured steps (the figures come from these)"),
    ("in_trial_other", "the rest of the trials' time (process start or hand-off to a warm "
     "worker, set-up before the build, gaps between steps, teardown)"),
    ("between_trials", "held outside any trial (worker start, the controller's work between "
     "trials, idle slots)"),
)  # fmt: skip


def accounting(t: GpuTotals, held: float | None) -> dict[str, Any] | None:
    """Where a study's held device-seconds went, part by part (:data:`ACCOUNT_PARTS`): seconds,
    shares of ``held`` and seconds per trial. The parts add up to ``held``: builds and all
    steps are the trials' own records (``build_s``, ``first_step_s``, the warm-up and
    measured steps), the rest of each trial's wall time is ``in_trial_other``, and what the
    runner held outside its trials is ``between_trials`` (0 where the held time is the trials'
    own, a runner that takes devices per trial). A first step that the measurement kept
    (no warm-up) counts as measured. None without a held time or timed trials."""
    if not held or not t.timed:
        return None
    steps = t.device_seconds_measure
    measured = min(t.device_seconds_measured, steps)
    before = max(0.0, steps - measured)  # first and warm-up steps
    first = min(t.device_seconds_first_step, before)
    build = max(0.0, t.device_seconds_kernel - steps)
    in_trial = max(0.0, t.device_seconds - t.device_seconds_kernel)
    parts = {
        "build": build,
        "first_step": first,
        "warmup": before - first,
        "measured": measured,
        "in_trial_other": in_trial,
        "between_trials": max(0.0, held - t.device_seconds),
    }
    total = max(held, sum(parts.values()))
    return {
        "held_s": held,
        "seconds": parts,
        "shares": {k: v / total for k, v in parts.items()},
        "per_trial_s": {k: v / t.timed for k, v in parts.items()},
        "trials": t.timed,
        "label": "measured: device-seconds of the held time by part (seconds, shares of the "
        "held time, seconds per trial)",
    }


def study_gpu_usage(
    trials: Sequence[TrialRecord],
    attrs: Mapping[str, Any],
    *,
    device: str,
    grid: GridCount | None,
) -> dict[str, Any]:
    """GPU-hours of a study, its GPU-busy fraction and the estimated saving against the
    whole grid (see the module doc), from its trial records: :func:`usage_of_totals` of
    their :func:`gpu_totals`."""
    return usage_of_totals(gpu_totals(trials), attrs, device=device, grid=grid)


def usage_of_totals(
    totals: GpuTotals,
    attrs: Mapping[str, Any],
    *,
    device: str,
    grid: GridCount | None,
) -> dict[str, Any]:
    """GPU-hours of a study, its GPU-busy fraction and the estimated saving against the
    whole grid (see the module doc), from its trials' :class:`GpuTotals`. Figures that
    cannot be known are None; GPU figures are None on CPU (the busy fraction is then of CPU
    ranks)."""
    cuda = device == "cuda"
    # a trial of the sim workload is the cost model's estimate, run on the controller: it
    # spends no GPU time (studies stored before this rule recorded its seconds as if)
    if totals.estimates and not totals.trials:
        return _no_gpu_study(device, totals.estimates, grid)
    spent_s = totals.gpu_seconds
    timed = totals.timed
    dev_measure = totals.device_seconds_measure
    dev_trials = totals.device_seconds
    dev_startup = dev_trials - dev_measure

    runs = [
        v for k, v in attrs.items() if k.startswith(HELD_ATTR_PREFIX) and isinstance(v, Mapping)
    ]
    held: float | None
    if runs and all(finite(r.get("devices")) for r in runs):
        held = sum(max(0.0, _num(r.get("last")) - _num(r.get("started"))) * _num(r.get("devices"))
                   for r in runs)  # fmt: skip
        basis: str | None = "controller"
    elif timed:
        held, basis = dev_trials, "trials"
    else:
        held, basis = None, None
    busy = dev_measure / held if held and timed else None

    mean_s = totals.ran_seconds / totals.ran if totals.ran and cuda else None
    n_grid = grid.configurations if grid is not None else None
    grid_s = mean_s * n_grid if mean_s is not None and n_grid is not None else None
    saved_s = max(grid_s - spent_s, 0.0) if grid_s is not None else None

    def hours(x: float | None) -> float | None:
        return None if x is None or not cuda else x / 3600.0

    return {
        "device": device,
        "gpu_hours": spent_s / 3600.0,
        "gpu_hours_startup": hours(totals.gpu_seconds_startup),
        "gpu_hours_measure": hours(totals.gpu_seconds_measure),
        "held_gpu_hours": hours(held),
        "held_basis": basis,
        "busy_fraction": busy,
        **_shares(totals, held if timed else None),
        "accounting": accounting(totals, held),
        "device_seconds_held": held,
        "device_seconds_startup": dev_startup if timed else None,
        "device_seconds_measure": dev_measure if timed else None,
        "trials_run": totals.ran,
        "trials_timed": timed,
        "mean_gpu_seconds_per_trial": mean_s,
        "grid_configurations": n_grid,
        "grid_complete": None if grid is None else grid.complete,
        "grid_gpu_hours": hours(grid_s),
        "saved_gpu_hours": hours(saved_s),
        "saved_fraction": saved_s / grid_s if saved_s is not None and grid_s else None,
        "label": "measured: GPU-hours, startup/measure split, held time and busy fraction "
        "(device-seconds in training steps / device-seconds held; measured_fraction: in "
        "measured steps only; kernel_fraction: in builds and all steps); estimates: the "
        "grid's GPU-hours (valid configurations x the mean GPU-seconds of a trial) and the "
        "saving",
    }


def _no_gpu_study(device: str, estimates: int, grid: GridCount | None) -> dict[str, Any]:
    """:func:`study_gpu_usage` of a study whose every trial is an estimate (``sim``)."""
    zero = 0.0 if device == "cuda" else None
    return {
        "device": device,
        "gpu_hours": 0.0,
        "gpu_hours_startup": zero,
        "gpu_hours_measure": zero,
        "held_gpu_hours": zero,
        "held_basis": None,
        "busy_fraction": None,
        "device_seconds_held": None,
        "device_seconds_startup": None,
        "device_seconds_measure": None,
        "trials_run": 0,
        "trials_timed": 0,
        "mean_gpu_seconds_per_trial": None,
        "grid_configurations": None if grid is None else grid.configurations,
        "grid_complete": None if grid is None else grid.complete,
        "grid_gpu_hours": None,
        "saved_gpu_hours": None,
        "saved_fraction": None,
        "accounting": None,
        "estimate_trials": estimates,
        "label": f"no GPU time: the study's {estimates} trials are estimates of the cost model "
        "(workload sim), run on the controller; a measured study's GPU-hours and the grid's "
        "are not known from them",
    }


def study_gpu_usage_of(
    storage: StudyReads, study: StudyRecord, records: Sequence[Any] | None = None
) -> dict[str, Any]:
    """:func:`study_gpu_usage` of a stored study (its attributes and grid, and its trials'
    totals: the storage's aggregate of its columns, :meth:`dse.storage.Storage.gpu_totals`,
    or of ``records`` where the caller gives them)."""
    attrs = storage.get_study_attrs(study.id)
    totals = storage.gpu_totals(study.id) if records is None else gpu_totals(records)
    device = str((study.hardware or {}).get("device") or "cpu")
    return usage_of_totals(totals, attrs, device=device, grid=grid_of_study(study, attrs))
