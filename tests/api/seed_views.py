"""Studies for the decision views (timeline, loss curves, comparison) and the measurement
fields of issue 15 (intervals, the numerics check, the ``pruned`` state), seeded through the
storage API's export and import (which keep trial timings, hosts and steps as given).

Three studies of one model on other hardware or recipes, and one of another model:

- ``gpt-h200``: GPU slots recorded per trial (``metrics.gpu_slots``), 2 GPUs per trial on 4
  GPUs: 4 lanes, 6 trials that started (12 bars), idle gaps; a baseline, a best with
  intervals, a ``numerics-changed`` trial, a pruned one, a running one and a queued one.
- ``gpt-h100``: a local runner that recorded no GPU indices: lanes inferred from overlaps
  (3 lanes: 4 trials and two interrupted attempts, one of a trial waiting in the queue).
- ``gpt-bridge-h200``: a cluster runner's placement ``node-1:gpu0,1,node-2:gpu0,1``: 4 lanes,
  2 trials (8 bars).
- ``gpt-other``: another model (8 layers): not comparable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dse.space.searchspace import params_key, parse_space
from dse.storage import Storage
from tests.api.seed import create_study, space_dict

#: When the seeded trials start: 300 s before the seeding, so that the running trial (started
#: at 230 s) runs until now (its bar ends at the time of the request).
T0 = time.time() - 300.0


def p(tp: int, mbs: int, dist: bool = False) -> dict[str, Any]:
    return {"tensor_model_parallel_size": tp, "micro_batch_size": mbs,
            "use_distributed_optimizer": dist}  # fmt: skip


def losses(n: int, start: float, slope: float) -> list[float]:
    return [round(start - slope * i, 6) for i in range(n)]


def trial(
    number: int,
    params: dict[str, Any],
    state: str,
    start: float | None,
    end: float | None,
    *,
    tflops: float | None = None,
    loss: list[float] | None = None,
    host: str | None = "gpu-node-a",
    failure_class: str | None = None,
    reason: str | None = None,
    history: list[dict[str, Any]] | None = None,
    **metrics: Any,
) -> dict[str, Any]:
    """One trial as a study export holds it (times in seconds after :data:`T0`)."""
    m: dict[str, Any] = dict(metrics)
    if tflops is not None:
        m.update(tflops_per_gpu=tflops, peak_mem_gib=40.0 + tflops / 10, step_time_s=100 / tflops)
    loss = loss or []
    if loss:
        m["loss"] = loss[-1]
    gpu_s = None if start is None or end is None else 2 * (end - start)
    return {
        "number": number, "state": state, "params": params, "params_key": params_key(params),
        "metrics": m, "value": tflops if state in ("complete", "pruned") else None,
        "failure_class": failure_class, "reason": reason,
        "source": "measured" if state != "queued" else None, "runner": "seed:1:x",
        "host": None if start is None else host,
        "queued_at": T0 - 5, "started_at": None if start is None else T0 + start,
        "finished_at": None if end is None else T0 + end,
        "heartbeat_at": None if start is None else T0 + (end or start),
        "gpu_seconds": gpu_s, "attempts": len(history or []), "history": history or [],
        "steps": [
            {"step": i + 1, "step_time_s": m.get("step_time_s"), "tflops_per_gpu": tflops,
             "peak_mem_gib": m.get("peak_mem_gib"), "peak_reserved_gib": None, "loss": v}
            for i, v in enumerate(loss)
        ],
    }  # fmt: skip


@dataclass
class ViewSeed:
    """What :func:`seed_views` put in the database (for assertions)."""

    studies: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> expectations
    pruned: list[tuple[str, int]] = field(default_factory=list)
    url: str = ""  # the database (set by the fixture that seeded it)


def _import(storage: Storage, name: str, trials: list[dict[str, Any]], **kw: Any) -> None:
    create_study(storage, name, **kw)
    _reimport(storage, name, trials)


def _with_recipe(storage: Storage, name: str, recipe: str, **kw: Any) -> None:
    """Create ``name`` whose space names ``recipe``."""
    import yaml

    d = space_dict(name, **kw)
    d["recipe"] = recipe
    text = yaml.safe_dump(d, sort_keys=False)
    space = parse_space(yaml.safe_load(text), name)
    storage.create_study(space_yaml=text, **space.study_fields())


def seed_views(storage: Storage) -> ViewSeed:
    out = ViewSeed()
    slot = {k: [f"gpu-node-a:{i}" for i in g] for k, g in (("A", (0, 1)), ("B", (2, 3)))}
    h200 = [
        trial(0, p(1, 1), "complete", 0, 100, tflops=300.0, loss=losses(8, 7.0, 0.1),
              gpu_slots=slot["A"],
              numerics={"status": "baseline", "drift": None, "tolerance": 0.02,
                        "baseline_trial": None, "steps_compared": 0}),
        trial(1, p(1, 2), "complete", 0, 120, tflops=350.0, loss=losses(8, 7.0, 0.1005),
              gpu_slots=slot["B"], tflops_per_gpu_ci=[340.0, 358.0],
              step_time_ci_s=[0.2793, 0.2941],
              measurement={"mode": "adaptive", "warmup_steps": 2, "measured_steps": 6,
                           "stop_reason": "converged"},
              numerics={"status": "ok", "drift": 0.001, "tolerance": 0.02,
                        "baseline_trial": 0, "steps_compared": 8}),
        trial(2, p(2, 1), "complete", 130, 220, tflops=280.0, loss=losses(8, 7.3, 0.05),
              gpu_slots=slot["A"],
              numerics={"status": "changed", "drift": 0.08, "tolerance": 0.02,
                        "baseline_trial": 0, "steps_compared": 8}),
        trial(3, p(1, 4), "infeasible", 125, 140, gpu_slots=slot["B"], failure_class="oom",
              reason="CUDA out of memory. Tried to allocate 2.00 GiB", peak_mem_gib=139.5),
        trial(4, p(2, 2), "complete", 150, 180, tflops=200.0, loss=losses(3, 7.0, 0.1),
              gpu_slots=slot["B"], tflops_per_gpu_ci=[190.0, 210.0],
              reason="pruned: the interval lies below the best"),
        trial(5, p(1, 1, True), "running", 230, None, gpu_slots=slot["A"]),
        trial(6, p(2, 4, True), "queued", None, None),
    ]  # fmt: skip
    _import(storage, "gpt-h200", h200)
    out.pruned.append(("gpt-h200", 4))
    out.studies["gpt-h200"] = {
        "lanes": ["gpu-node-a:0", "gpu-node-a:1", "gpu-node-a:2", "gpu-node-a:3"],
        "bars": 12, "runs": 6, "ran": 6, "gaps": 8, "baseline": 0, "best": 1, "tflops": 350.0,
        "slots_from": ["gpu_slots"], "gpu": "NVIDIA H200", "world_size": 2,
    }  # fmt: skip

    interrupted = {"at": T0 + 40, "reason": "controller lost", "state": "running",
                   "runner": "seed:1:x", "host": "box-1", "started_at": T0 + 20,
                   "log_path": None}  # fmt: skip
    h100 = [
        trial(0, p(1, 1), "complete", 0, 50, tflops=180.0, loss=losses(8, 7.0, 0.1),
              host="box-1"),
        trial(1, p(1, 2), "complete", 10, 70, tflops=210.0, loss=losses(8, 7.0, 0.1),
              host="box-1"),
        trial(2, p(2, 1), "failed", 55, 90, host="box-1", failure_class="error",
              reason="NCCL watchdog timeout on rank 1"),
        trial(3, p(2, 2), "complete", 60, 100, tflops=190.0, loss=losses(8, 7.0, 0.1),
              host="box-1", history=[interrupted]),
        # interrupted from 75 s to 85 s, re-queued, not started again
        trial(4, p(1, 4), "queued", None, None,
              history=[{**interrupted, "started_at": T0 + 75, "at": T0 + 85}]),
    ]  # fmt: skip
    create = {"gpu": "NVIDIA H100"}
    _import_hw(storage, "gpt-h100", h100, **create)
    out.studies["gpt-h100"] = {
        "lanes": ["box-1 · slot 1", "box-1 · slot 2", "box-1 · slot 3"], "bars": 6, "runs": 6,
        "ran": 5,
        "baseline": 0, "best": 1, "tflops": 210.0, "slots_from": ["overlap"],
        "gpu": "NVIDIA H100", "world_size": 2,
    }  # fmt: skip

    placed = "node-1:gpu0,1,node-2:gpu0,1"
    bridge = [
        trial(0, p(1, 1), "complete", 0, 60, tflops=320.0, loss=losses(8, 7.0, 0.1),
              host=placed),
        trial(1, p(2, 2), "complete", 70, 150, tflops=370.0, loss=losses(8, 7.0, 0.1),
              host=placed, tflops_per_gpu_ci=[365.0, 375.0]),
    ]  # fmt: skip
    _import_recipe(storage, "gpt-bridge-h200", bridge, recipe="bridge:gpt_small_pretrain",
                   world_size=4)  # fmt: skip
    out.studies["gpt-bridge-h200"] = {
        "lanes": ["node-1:0", "node-1:1", "node-2:0", "node-2:1"], "bars": 8, "runs": 2, "ran": 2,
        "baseline": 0, "best": 1, "tflops": 370.0, "slots_from": ["placement"],
        "gpu": "NVIDIA H200", "world_size": 4,
    }  # fmt: skip

    create_study(storage, "gpt-other", num_layers=8)
    return out


def _import_hw(storage: Storage, name: str, trials: list[dict[str, Any]], gpu: str) -> None:
    """Like :func:`_import`, on another GPU (80 GiB)."""
    import yaml

    d = space_dict(name)
    d["resources"].update(gpu=gpu, gpu_memory_gib=80.0)
    text = yaml.safe_dump(d, sort_keys=False)
    space = parse_space(yaml.safe_load(text), name)
    storage.create_study(space_yaml=text, **space.study_fields())
    _reimport(storage, name, trials)


def _import_recipe(
    storage: Storage, name: str, trials: list[dict[str, Any]], recipe: str, **kw: Any
) -> None:
    _with_recipe(storage, name, recipe, **kw)
    _reimport(storage, name, trials)


def _reimport(storage: Storage, name: str, trials: list[dict[str, Any]]) -> None:
    """Replace the study ``name`` by its export with ``trials`` (timings kept as given)."""
    doc = storage.export_study(name)
    storage.delete_study(name)
    doc["trials"] = trials
    running = any(t["state"] == "running" for t in trials)
    doc["study"]["state"] = "running" if running else "complete"
    storage.import_study(doc)


def set_pruned(url: str, seeded: ViewSeed) -> None:
    """Mark the seeded pruned trials ``pruned`` (a finished state of issue 15; written with
    SQL because this branch's storage API does not produce it yet)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.begin() as c:
            for study, number in seeded.pruned:
                c.execute(
                    sa.text(
                        "UPDATE trials SET state = 'pruned' WHERE number = :n AND study_id = "
                        "(SELECT id FROM studies WHERE name = :s)"
                    ),
                    {"n": number, "s": study},
                )
    finally:
        engine.dispose()
