"""Replay of a measured table: trials that answer from measurements instead of training.

A replay table is JSON Lines, one configuration per line (the format, and its reader, are in
:mod:`dse.stats.table`); the replay also needs the metrics and losses of every ok row. The space of
a table is the product of the distinct values of each parameter; a combination without a row
is invalid.

An ok row may also carry ``step_times_s``, the step time of every step (as many as its
``loss`` list): the replayed steps then have those times (and TFLOP/s in proportion), so a
best derives its intervals from them as from a real run. A configuration measured several
times (several rows) answers its ``k``-th run in the study (``workload.repeat`` of the trial
spec: a re-measurement) with its ``k``-th row, cycling. :class:`ReplayTable` answers in-process
(:meth:`ReplayTable.outcome`, used by ``dse bench``); ``python -m dse.workloads.replay
--spec trial.json`` is the trial process (the metrics JSONL contract, ``"source": "replay"``).

The MoE routing a space declares (``semantics.moe_routing``) is accepted as it is: a table
was measured under some routing, which its rows do not record, and the replay answers with
those measurements (it neither applies nor checks a routing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dse.core.exceptions import DSEError, WorkloadError
from dse.core.records import (
    REPLAY_RUNS,
    FailureClass,
    MetricsWriter,
    Outcome,
    StepMetrics,
    TrialSpec,
)
from dse.space.searchspace import SearchSpace, params_key
from dse.space.tablemodel import RowModelError, row_problem
from dse.stats.table import MeasuredRow, read_table

__all__ = ["ReplayRow", "ReplayTable", "main"]

_OK_METRICS = ("tflops_per_gpu", "step_time_s", "peak_mem_gib")

#: One measured configuration of a table.
ReplayRow = MeasuredRow


def _value_key(v: Any) -> tuple[int, Any]:
    if v is None:
        return (0, 0)
    if isinstance(v, bool):
        return (1, int(v))
    if isinstance(v, int | float):
        return (2, v)
    return (3, str(v))


class ReplayTable:
    """A measured table, loaded and checked (see the module docstring)."""

    def __init__(self, rows: Sequence[ReplayRow], path: str | Path | None = None) -> None:
        if not rows:
            raise WorkloadError(f"replay table {path}: no rows")
        self.path = None if path is None else Path(path)
        self.rows: list[ReplayRow] = list(rows)
        self.param_names: list[str] = list(rows[0].params)
        self._index: dict[str, list[ReplayRow]] = {}
        for r in self.rows:
            if set(r.params) != set(self.param_names):
                raise WorkloadError(
                    f"{self.path}:{r.line}: parameters {sorted(r.params)} differ from the "
                    f"first row's {sorted(self.param_names)}"
                )
            # a configuration measured several times: run k answers with row k (cycling)
            self._index.setdefault(params_key(r.params), []).append(r)

    # --- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> ReplayTable:
        """Read a table; a missing file or a malformed line raises :class:`WorkloadError`
        naming the file and the line."""
        p = Path(path)
        rows = read_table(p)
        for r in rows:
            _check_metrics(r, f"{p}:{r.line}")
        return cls(rows, p)

    # --- queries ---------------------------------------------------------------------------
    def space_knobs(self) -> dict[str, list[Any]]:
        """The distinct values of each parameter, sorted (None, then booleans, numbers,
        strings), so a table's space does not depend on the order of its rows."""
        out: dict[str, list[Any]] = {}
        for name in self.param_names:
            seen: dict[str, Any] = {}
            for r in self.rows:
                seen.setdefault(json.dumps(r.params[name]), r.params[name])
            out[name] = sorted(seen.values(), key=_value_key)
        return out

    def lookup(self, params: Mapping[str, Any], repeat: int = 0) -> ReplayRow | None:
        """The row measured for ``params`` (only the table's parameters are compared); its
        ``repeat``-th run (from 0) answers with its ``repeat``-th row, cycling."""
        if any(n not in params for n in self.param_names):
            return None
        rows = self._index.get(params_key({n: params[n] for n in self.param_names}))
        return None if not rows else rows[repeat % len(rows)]

    def runs(self, params: Mapping[str, Any]) -> int:
        """How many rows (runs) the table holds of ``params``' configuration."""
        if any(n not in params for n in self.param_names):
            return 0
        return len(self._index.get(params_key({n: params[n] for n in self.param_names}), ()))

    def outcome(self, params: Mapping[str, Any], repeat: int = 0) -> Outcome:
        """The outcome a trial of ``params`` has in this table (``source="replay"``)."""
        row = self.lookup(params, repeat)
        if row is None:
            return Outcome.failure(
                "invalid", "no measured row for this configuration", source="replay"
            )
        out = row_outcome(row)
        if out.ok:
            out.metrics[REPLAY_RUNS] = self.runs(params)
        return out

    def best(self, metric: str = "tflops_per_gpu", direction: str = "maximize") -> ReplayRow:
        """The ok row with the best ``metric``."""
        ok = [r for r in self.rows if r.status == "ok" and metric in r.metrics]
        if not ok:
            raise WorkloadError(f"replay table {self.path}: no ok row with {metric}")
        sign = 1.0 if direction == "maximize" else -1.0
        return max(ok, key=lambda r: sign * float(r.metrics[metric]))

    # --- space -----------------------------------------------------------------------------
    def to_space(
        self,
        study: str = "replay",
        *,
        agent: Any = None,
        budget: Any = None,
        baseline: Mapping[str, Any] | None = None,
        objectives: Any = None,
        table: str | None = None,
        delay_s: float = 0.0,
    ) -> Any:
        """A :class:`~dse.space.searchspace.SearchSpace` over this table.

        The model, semantics and resources come from the first row; every parameter becomes
        a choice knob over its distinct values (:meth:`space_knobs`), its baseline the first
        row's value (or ``baseline``'s). ``agent``, ``budget`` and ``objectives`` are
        passed through (``AgentSpec`` / ``Budget`` / a list of ``Objective``, or dicts);
        the workload is ``replay`` with ``table`` (default: the path the table was loaded
        from). The model, semantics and resources are read through
        :mod:`dse.space.tablemodel`, the schema every table reader shares; the features are
        the ones the table records, else those its measured configurations needed.
        """
        first = self.rows[0]
        m = first.model
        try:
            model, sem, res = row_problem(
                m, first.world_size, first.hardware, (r.params for r in self.rows)
            )
        except RowModelError as e:
            raise WorkloadError(f"{self.path}:{first.line}: {e}") from e
        base = dict(baseline) if baseline is not None else dict(first.params)
        unknown = sorted(set(base) - set(self.param_names))
        if unknown:
            raise WorkloadError(f"baseline names {unknown}, which are not parameters of the table")
        base = {**first.params, **base}
        ok_losses = [r.losses for r in self.rows if r.status == "ok" and r.losses]
        steps = len(ok_losses[0]) if ok_losses else 6
        data: dict[str, Any] = {
            "study": study,
            "model": model.model_dump(exclude_none=True),
            "semantics": {
                "global_batch_size": sem.global_batch_size,
                "seq_length": sem.seq_length,
                "precision": sem.precision,
                "steps": steps,
                "warmup_steps": min(2, steps - 1),
            },
            "resources": res.model_dump(
                include={"world_size", "gpu", "gpu_memory_gib", "features"}
            ),
            "knobs": {
                name: {"domain": {"type": "choice", "values": values}, "baseline": base[name]}
                for name, values in self.space_knobs().items()
            },
            "workload": {
                "name": "replay",
                "table": table or (str(self.path) if self.path else "table.jsonl"),
                "delay_s": delay_s,
            },
        }
        if agent is not None:
            data["agent"] = agent
        if budget is not None:
            data["budget"] = budget
        if objectives is not None:
            data["objectives"] = objectives
        try:
            return SearchSpace.model_validate(data)
        except ValidationError as e:
            raise WorkloadError(f"replay table {self.path}: not a valid space: {e}") from e


def _check_metrics(row: MeasuredRow, where: str) -> None:
    """An ok row must carry what a trial reports: its metrics and its per-step losses."""
    if row.status != "ok":
        return
    m = row.metrics
    missing = [k for k in _OK_METRICS if not isinstance(m.get(k), int | float)]
    if missing:
        raise WorkloadError(f"{where}: an ok row needs numeric metrics {missing}")
    loss = m.get("loss")
    if isinstance(loss, int | float):
        loss = [loss]
    if not (isinstance(loss, list) and loss and all(isinstance(x, int | float) for x in loss)):
        raise WorkloadError(
            f"{where}: an ok row needs 'loss', a number or a non-empty list of numbers"
        )
    times = m.get("step_times_s")
    if times is not None:
        good = isinstance(times, list) and all(
            isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in times
        )
        if not good or len(times) != len(loss):
            raise WorkloadError(
                f"{where}: 'step_times_s' must be a list of positive numbers, one per step of "
                f"'loss' ({len(loss)})"
            )


def _steps(row: ReplayRow) -> tuple[StepMetrics, ...]:
    m = row.metrics
    peak = float(m["peak_mem_gib"])
    st, tf = float(m["step_time_s"]), float(m["tflops_per_gpu"])
    times = m.get("step_times_s") or [st] * len(row.losses)
    return tuple(
        StepMetrics(
            step=i,
            step_time_s=float(t),
            tflops_per_gpu=tf * st / float(t),  # the same work in that step's time
            peak_mem_gib=peak,
            peak_reserved_gib=float(m.get("peak_reserved_gib", peak)),
            loss=loss,
        )
        for i, (loss, t) in enumerate(zip(row.losses, times, strict=True), start=1)
    )


#: Measurement fields a row may carry (``bench/measure_table.py`` records them), passed on.
_MEASUREMENT_FIELDS = ("step_time_ci_s", "tflops_per_gpu_ci")


def _measurement(row: ReplayRow) -> dict[str, Any]:
    """The row's ``measurement`` and intervals (trial contract names): as measured when the
    row has them; otherwise a fixed window over the row's logged steps labelled ``series:
    table``, without an interval. Its warm-up is the row's ``warmup_steps`` when the table
    records one, else left out: a reader then takes the space's ``semantics.warmup_steps``
    (:mod:`dse.results.noise`), as for a trial of that space, instead of counting warm-up steps as
    measured ones."""
    m = row.metrics
    out: dict[str, Any] = {
        k: list(m[k]) for k in _MEASUREMENT_FIELDS if isinstance(m.get(k), list)
    }
    given = m.get("measurement")
    if isinstance(given, dict):
        out["measurement"] = dict(given)
    else:
        warmup = row.model.get("warmup_steps")
        out["measurement"] = {
            "mode": "fixed",
            "measured_steps": len(row.losses),
            "stop_reason": "fixed",
            "series": "table",
        }
        if isinstance(warmup, int) and not isinstance(warmup, bool) and 0 <= warmup:
            out["measurement"]["warmup_steps"] = warmup
            out["measurement"]["measured_steps"] = max(len(row.losses) - warmup, 0)
    return out


def _summary(row: ReplayRow) -> dict[str, Any]:
    m = row.metrics
    peak = float(m["peak_mem_gib"])
    losses = row.losses
    return {
        "tflops_per_gpu": float(m["tflops_per_gpu"]),
        "step_time_s": float(m["step_time_s"]),
        "peak_mem_gib": peak,
        "peak_reserved_gib": float(m.get("peak_reserved_gib", peak)),
        "loss": losses[-1],
        "losses": losses,
        "steps": len(losses),
        **_measurement(row),
    }


def _failure(row: ReplayRow) -> tuple[FailureClass, str, dict[str, Any]]:
    m = row.metrics
    err = str(m.get("error") or "")
    if row.status == "oom":
        metrics: dict[str, Any] = {}
        if isinstance(m.get("peak_mem_gib"), int | float):
            metrics["peak_mem_gib"] = float(m["peak_mem_gib"])
        cap = row.hardware.get("gpu_memory_gib")
        if isinstance(cap, int | float):
            metrics["gpu_memory_gib"] = float(cap)
        return "oom", err or "CUDA out of memory", metrics
    if row.status == "invalid":
        return "invalid", err or "rejected at build (measured table)", {}
    return "error", err or "the trial failed (measured table)", {}


def row_outcome(row: ReplayRow) -> Outcome:
    """The outcome of a row, as the trial process would report it."""
    if row.status == "ok":
        return Outcome("ok", _summary(row), steps=_steps(row), source="replay")
    cls, reason, metrics = _failure(row)
    return Outcome.failure(cls, reason, metrics=metrics, source="replay")


# --- the trial process ---------------------------------------------------------------------


def run_trial(spec: TrialSpec, *, sleep: Any = time.sleep) -> int:
    """Answer one trial from its table: sleep ``delay_s`` (step lines spread over it), then
    write the steps and the summary, or the failure line. Returns the exit status."""
    writer = MetricsWriter(spec.metrics_path, source="replay")
    delay = float(spec.workload.get("delay_s") or 0.0)
    try:
        table_path = spec.workload.get("table")
        if not table_path:
            raise WorkloadError("the replay workload needs workload.table")
        table = ReplayTable.load(table_path)
    except DSEError as e:
        writer.failure("error", str(e))
        return 1
    repeat = spec.workload.get("repeat")
    row = table.lookup(spec.params, repeat if isinstance(repeat, int) else 0)
    if row is None or row.status != "ok":
        metrics: dict[str, Any] = {}
        cls: FailureClass
        if row is None:
            cls, reason = "invalid", "no measured row for this configuration"
        else:
            cls, reason, metrics = _failure(row)
        sleep(delay)
        writer.failure(cls, reason, metrics)
        return 0
    steps = _steps(row)
    for s in steps:
        sleep(delay / len(steps))
        writer.step(s)
    writer.summary({**_summary(row), REPLAY_RUNS: table.runs(spec.params)})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dse.workloads.replay --spec trial.json``."""
    ap = argparse.ArgumentParser(prog="python -m dse.workloads.replay", description=__doc__)
    ap.add_argument("--spec", required=True, help="trial spec (JSON, dse.core.records.TrialSpec)")
    args = ap.parse_args(argv)
    try:
        spec = TrialSpec.model_validate_json(Path(args.spec).read_text())
    except (OSError, ValueError) as e:
        sys.stderr.write(f"replay: bad trial spec {args.spec}: {e}\n")
        return 2
    return run_trial(spec)


if __name__ == "__main__":
    sys.exit(main())
