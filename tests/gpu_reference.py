"""The GPU-time fold of ``dse.results.gpu_usage`` as it was before the storage kept each trial's
figures as columns (schema 0006), kept here verbatim as the reference the new paths must
match (``study_gpu_usage`` over records, ``Storage.gpu_totals``), and random trials to match
it on: metrics with and without a ``timing`` record and the first-step split, values that
are not numbers, estimates, trials without GPU-seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from dse.core.records import TrialRecord, finite
from dse.results.gpu_usage import (
    HELD_ATTR_PREFIX,
    GridCount,
    _no_gpu_study,
    accounting,
    gpu_totals,
    held_record,
)


def _num(x: Any) -> float:
    f = finite(x)
    return 0.0 if f is None else f


def reference_busy_shares(trials: Sequence[TrialRecord], held: float | None) -> dict[str, Any]:
    """The measured-step and all-kernel shares of ``held`` device-seconds, and the first
    steps' cost (see the module doc): over the trials with a ``timing`` record."""
    measured = kernel = first = 0.0
    firsts: list[float] = []
    without = 0
    for t in trials:
        m = t.metrics
        timing = m.get("timing")
        if not isinstance(timing, Mapping):
            continue
        dev = _num(timing.get("devices"))
        steps = _num(timing.get("measure_s"))
        ms = finite(m.get("measured_steps_s"))
        if ms is None:
            without += 1
            measured += steps * dev
            kernel += steps * dev
            continue
        measured += min(ms, steps or ms) * dev
        kernel += (_num(m.get("build_s")) + steps) * dev
        f = _num(m.get("first_step_s"))
        first += f * dev
        firsts.append(f)
    firsts.sort()
    return {
        "measured_fraction": measured / held if held else None,
        "kernel_fraction": min(1.0, kernel / held) if held else None,
        "device_seconds_measured": measured,
        "device_seconds_kernel": kernel,
        "device_seconds_first_step": first,
        "first_step_s_median": firsts[len(firsts) // 2] if firsts else None,
        "first_step_s_max": firsts[-1] if firsts else None,
        "trials_without_split": without,
    }


def reference_usage(
    trials: Sequence[TrialRecord],
    attrs: Mapping[str, Any],
    *,
    device: str,
    grid: GridCount | None,
) -> dict[str, Any]:
    """GPU-hours of a study, its GPU-busy fraction and the estimated saving against the
    whole grid (see the module doc). Figures that cannot be known are None; GPU figures are
    None on CPU (the busy fraction is then of CPU ranks)."""
    cuda = device == "cuda"
    # a trial of the sim workload is the cost model's estimate, run on the controller: it
    # spends no GPU time (studies stored before this rule recorded its seconds as if)
    estimates = sum(1 for t in trials if t.source == "estimate")
    trials = [t for t in trials if t.source != "estimate"]
    if estimates and not trials:
        return _no_gpu_study(device, estimates, grid)
    spent_s = sum(_num(t.gpu_seconds) for t in trials)
    ran = [t.gpu_seconds for t in trials if t.gpu_seconds]
    startup_s = sum(_num(t.metrics.get("gpu_seconds_startup")) for t in trials)
    measure_s = sum(_num(t.metrics.get("gpu_seconds_measure")) for t in trials)

    timed = [t.metrics["timing"] for t in trials if isinstance(t.metrics.get("timing"), Mapping)]
    dev_measure = sum(_num(x.get("measure_s")) * _num(x.get("devices")) for x in timed)
    dev_trials = sum(_num(x.get("wall_s")) * _num(x.get("devices")) for x in timed)
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

    mean_s = sum(ran) / len(ran) if ran and cuda else None
    n_grid = grid.configurations if grid is not None else None
    grid_s = mean_s * n_grid if mean_s is not None and n_grid is not None else None
    saved_s = max(grid_s - spent_s, 0.0) if grid_s is not None else None

    def hours(x: float | None) -> float | None:
        return None if x is None or not cuda else x / 3600.0

    return {
        "device": device,
        "gpu_hours": spent_s / 3600.0,
        "gpu_hours_startup": hours(startup_s),
        "gpu_hours_measure": hours(measure_s),
        "held_gpu_hours": hours(held),
        "held_basis": basis,
        "busy_fraction": busy,
        **reference_busy_shares(trials, held if timed else None),
        # the parts of the held time, from the records' own fold (the storage's totals must
        # give the same)
        "accounting": accounting(gpu_totals(trials), held),
        "device_seconds_held": held,
        "device_seconds_startup": dev_startup if timed else None,
        "device_seconds_measure": dev_measure if timed else None,
        "trials_run": len(ran),
        "trials_timed": len(timed),
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


def _junk(rng: random.Random) -> Any:
    """A value that is not a finite number (counted as 0 by the fold)."""
    return rng.choice([None, "3.5", True, math.nan, math.inf, -math.inf, [1.0], {"x": 1}])


def _maybe(rng: random.Random, x: float, p_junk: float = 0.1, p_absent: float = 0.1) -> Any:
    r = rng.random()
    return _junk(rng) if r < p_junk else "absent" if r < p_junk + p_absent else x


def random_metrics(rng: random.Random, *, finite_only: bool = False) -> dict[str, Any]:
    """A trial's metrics as the controller writes them (``trial_timing`` and the trainer's
    split), with parts missing or not numbers (``finite_only``: no NaN or infinity, which a
    study export refuses)."""
    p_junk = 0.0 if finite_only else 0.08
    m: dict[str, Any] = {"tflops_per_gpu": rng.uniform(100, 500)}
    if rng.random() < 0.8:
        devices = rng.choice([1, 2, 4, 8, 8.0])
        wall = rng.uniform(0.0, 400.0)
        measure = rng.uniform(0.0, wall)
        timing = {"device": "cuda", "devices": devices, "wall_s": wall,
                  "startup_s": wall - measure, "measure_s": measure}  # fmt: skip
        if rng.random() < 0.05:
            timing["measure_s"] = 0.0  # no steps: the measured share falls back to the split
        for k in ("devices", "wall_s", "measure_s"):
            v = _maybe(rng, timing[k], p_junk, 0.03)
            if v == "absent":
                del timing[k]
            elif not (finite_only and isinstance(v, float) and not math.isfinite(v)):
                timing[k] = v
        m["timing"] = timing if rng.random() < 0.97 else "not a record"
        m["gpu_seconds_startup"] = (wall - measure) * _num(devices)
        m["gpu_seconds_measure"] = measure * _num(devices)
        if rng.random() < 0.6:  # the built-in trainer's split
            m["build_s"] = rng.uniform(0.0, 30.0)
            m["first_step_s"] = rng.choice([rng.uniform(0.0, 60.0), 2.5, 0.0])  # ties, zeros
            m["measured_steps_s"] = rng.uniform(0.0, measure * 1.2 + 1e-9)
            m["warmup_steps_s"] = rng.uniform(0.0, 5.0)
    for k in ("gpu_seconds_startup", "gpu_seconds_measure", "build_s", "first_step_s",
              "measured_steps_s"):  # fmt: skip
        if k in m:
            v = _maybe(rng, m[k], p_junk, 0.05)
            if v == "absent":
                del m[k]
            elif not (finite_only and isinstance(v, float) and not math.isfinite(v)):
                m[k] = v
    return m


def random_source(rng: random.Random) -> str | None:
    return rng.choice(["measured"] * 6 + ["estimate", "replay", None])


def random_gpu_seconds(rng: random.Random) -> float | None:
    return rng.choice([None, 0.0, rng.uniform(0.0, 3000.0), rng.uniform(0.0, 3000.0)])


def random_attrs(rng: random.Random) -> dict[str, Any]:
    """Held-time records of a study: none, of controllers, or of a runner that takes its
    devices per trial."""
    kind = rng.choice(["none", "controller", "per-trial"])
    if kind == "none":
        return {}
    devices = None if kind == "per-trial" else rng.choice([1, 2, 8])
    return {
        f"{HELD_ATTR_PREFIX}c:{i}:x": held_record(1000.0 * i, devices, "cuda",
                                                  last=1000.0 * i + rng.uniform(0, 5000))
        for i in range(rng.randint(1, 3))
    }  # fmt: skip


def random_trials(rng: random.Random, n: int) -> list[TrialRecord]:
    """``n`` trial records of random metrics, sources and GPU-seconds."""
    return [
        TrialRecord(
            id=i,
            study_id=1,
            number=i,
            state="complete",
            params={},
            params_key="",
            metrics=random_metrics(rng),
            gpu_seconds=random_gpu_seconds(rng),
            source=random_source(rng),
        )  # fmt: skip
        for i in range(n)
    ]


GRID = GridCount(120, 120, True)
