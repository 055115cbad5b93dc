"""Seeding study databases through the real storage API (factories for the API tests)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

from dse.core.records import Outcome, StepMetrics
from dse.space.searchspace import params_key, parse_space
from dse.storage import Storage, open_storage
from tests.conftest import EXAMPLES

GPU = "NVIDIA H200"


def space_dict(
    name: str,
    *,
    num_layers: int = 4,
    world_size: int = 2,
    seq_length: int = 64,
    global_batch_size: int = 8,
) -> dict[str, Any]:
    """A valid space file (as a mapping) for a small GPT on ``world_size`` H200s."""
    return {
        "version": 1,
        "study": name,
        "model": {
            "num_layers": num_layers,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_query_groups": 2,
            "ffn_hidden_size": 128,
            "vocab_size": 1024,
        },
        "semantics": {
            "global_batch_size": global_batch_size,
            "seq_length": seq_length,
            "steps": 4,
            "warmup_steps": 1,
        },
        "resources": {
            "world_size": world_size,
            "device": "cuda",
            "gpu": GPU,
            "gpu_memory_gib": 141.0,
            "features": [],
        },
        "knobs": {
            "tensor_model_parallel_size": {"values": [1, 2]},
            "micro_batch_size": {"values": [1, 2, 4]},
            "use_distributed_optimizer": {"type": "bool"},
        },
        "objective": {"metric": "tflops_per_gpu", "direction": "maximize"},
    }


def space_yaml(name: str, **kw: Any) -> str:
    return yaml.safe_dump(space_dict(name, **kw), sort_keys=False)


def create_study(storage: Storage, name: str, **kw: Any) -> int:
    """Create a study as ``dse start`` would (space hash, model, hardware); its id."""
    text = space_yaml(name, **kw)
    space = parse_space(yaml.safe_load(text), name)
    rec = storage.create_study(space_yaml=text, **space.study_fields())
    return rec.id


def steps(n: int, *, tflops: float, mem: float, loss0: float = 7.0) -> tuple[StepMetrics, ...]:
    return tuple(
        StepMetrics(
            step=i + 1,
            step_time_s=0.5 + 0.01 * i,
            tflops_per_gpu=tflops,
            peak_mem_gib=mem,
            peak_reserved_gib=mem + 2,
            loss=loss0 - 0.1 * i,
            grad_norm=1.0,
        )
        for i in range(n)
    )


def ok(tflops: float, mem: float, n_steps: int = 4) -> Outcome:
    return Outcome(
        "ok",
        {
            "tflops_per_gpu": tflops,
            "peak_mem_gib": mem,
            "peak_reserved_gib": mem + 2,
            "step_time_s": 0.5,
            "loss": 6.7,
            "losses": [7.0, 6.9, 6.8, 6.7],
            "steps": n_steps,
        },
        steps=steps(n_steps, tflops=tflops, mem=mem),
    )


@dataclass
class Seeded:
    """What :func:`seed` put in the database (for assertions)."""

    study: str
    study_id: int
    trial_ids: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    n_trials: int = 0
    n_failed_markers: int = 0  # failed/infeasible trials + rejections (pareto markers)
    front: list[int] = field(default_factory=list)  # trial numbers on the Pareto front
    best_number: int = -1
    best_value: float = 0.0
    gpu_seconds: float = 0.0


def _run(
    storage: Storage, study_id: int, params: dict[str, Any], outcome: Outcome | None, **kw: Any
) -> int:
    t = storage.claim_trial(
        study_id=study_id, params=params, params_key=params_key(params), budget=1000,
        allow_repeat=True, runner="seed:1:x",
    )  # fmt: skip
    assert t is not None
    if outcome is None and kw.get("queued"):
        return t.id
    storage.start_trial(
        t.id, runner="seed:1:x", host="node-1", log_path=f"/runs/{t.number}/log.txt",
        metrics_path=f"/runs/{t.number}/metrics.jsonl",
    )  # fmt: skip
    if outcome is not None:
        value = outcome.metrics.get("tflops_per_gpu") if outcome.ok else None
        storage.finish_trial(t.id, outcome, value=value, gpu_seconds=kw.get("gpu_seconds"))
    return t.id


def seed(storage: Storage, name: str = "llama-seeded") -> Seeded:
    """A study with complete, failed (oom, error, nan), infeasible, running and queued trials
    and two pre-launch rejections (a rule, a predicted OOM)."""
    sid = create_study(storage, name)
    s = Seeded(study=name, study_id=sid)

    def p(tp: int, mbs: int, dist: bool = False) -> dict[str, Any]:
        return {
            "tensor_model_parallel_size": tp,
            "micro_batch_size": mbs,
            "use_distributed_optimizer": dist,
        }

    ids = s.trial_ids
    ids["c0"] = _run(storage, sid, p(1, 1), ok(300.0, 60.0), gpu_seconds=120.0)
    ids["c1"] = _run(storage, sid, p(1, 2), ok(350.0, 80.0), gpu_seconds=150.0)
    ids["c2"] = _run(storage, sid, p(2, 1), ok(280.0, 90.0), gpu_seconds=100.0)
    ids["oom"] = _run(
        storage, sid, p(1, 4),
        Outcome.failure(
            "oom", "CUDA out of memory. Tried to allocate 2.00 GiB",
            metrics={"peak_mem_gib": 139.5}, steps=steps(1, tflops=0.0, mem=139.5),
        ),
        gpu_seconds=30.0,
    )  # fmt: skip
    ids["error"] = _run(
        storage, sid, p(2, 2),
        Outcome.failure("error", "NCCL watchdog timeout on rank 1"),
        gpu_seconds=40.0,
    )  # fmt: skip
    ids["invalid"] = _run(
        storage, sid, p(2, 4),
        Outcome.failure("invalid", "Megatron refused the configuration at build"),
    )  # fmt: skip
    nan_steps = (
        *steps(2, tflops=200.0, mem=50.0),
        StepMetrics(3, 0.5, 200.0, 50.0, 52.0, math.nan, None),
    )
    ids["nan"] = _run(
        storage, sid, p(1, 1, True),
        Outcome.failure("nan", "loss became NaN at step 3", metrics={"loss": math.nan},
                        steps=nan_steps),
        gpu_seconds=10.0,
    )  # fmt: skip
    ids["running"] = _run(storage, sid, p(1, 2, True), None)
    ids["queued"] = _run(storage, sid, p(2, 1, True), None, queued=True)
    storage.add_rejection(
        study_id=sid, params=p(2, 4, True), params_key=params_key(p(2, 4, True)),
        kind="invalid", rule="tp_divides_query_groups",
        reason="num_query_groups must be a multiple of tensor_model_parallel_size",
        values={"num_query_groups": 2, "tensor_model_parallel_size": 4},
    )  # fmt: skip
    storage.add_rejection(
        study_id=sid, params=p(1, 4, True), params_key=params_key(p(1, 4, True)),
        kind="predicted_oom", rule="costmodel",
        reason="predicted peak 180.0 GiB > 141.0 GiB x (1 + margin 0.25)",
        values={"predicted_peak_mem_gib": 180.0, "margin": 0.25},
    )  # fmt: skip
    s.counts = {
        "complete": 3, "failed": 2, "infeasible": 2, "pruned": 0, "running": 1, "queued": 1,
        "total": 9,
    }  # fmt: skip
    s.n_trials = 9
    s.n_failed_markers = 4 + 2  # oom, error, invalid, nan + two rejections
    s.front = [0, 1]
    s.best_number = 1
    s.best_value = 350.0
    s.gpu_seconds = 120.0 + 150.0 + 100.0 + 30.0 + 40.0 + 10.0
    return s


def seed_all(storage: Storage) -> dict[str, Seeded]:
    """The main seeded study plus: a study of the same model and hardware with a better
    trial, one of another model, and one without any complete trial."""
    main = seed(storage)
    out = {"main": main}
    sid = create_study(storage, "llama-seeded-b")
    b = Seeded(study="llama-seeded-b", study_id=sid)
    params = {"tensor_model_parallel_size": 1, "micro_batch_size": 1,
              "use_distributed_optimizer": True}  # fmt: skip
    b.trial_ids["c0"] = _run(storage, sid, params, ok(360.0, 70.0), gpu_seconds=60.0)
    b.best_number, b.best_value = 0, 360.0
    out["b"] = b
    sid = create_study(storage, "other-model", num_layers=8)
    o = Seeded(study="other-model", study_id=sid)
    o.trial_ids["c0"] = _run(storage, sid, params, ok(999.0, 70.0))
    out["other"] = o
    sid = create_study(storage, "empty-study")
    out["empty"] = Seeded(study="empty-study", study_id=sid)
    return out


def create_from_dict(storage: Storage, data: dict[str, Any]) -> int:
    """Create the study of a space file given as a mapping (its ``study`` names it); its id."""
    text = yaml.safe_dump(data, sort_keys=False)
    space = parse_space(yaml.safe_load(text), data["study"])
    return storage.create_study(space_yaml=text, **space.study_fields()).id


def seed_cpu_demo(storage: Storage, name: str = "cpu-demo") -> None:
    """The CPU demo's space (examples/tiny_gpt_cpu.yaml, few knobs) at its scale: thousandths
    of a TFLOP/s, a fraction of a GiB, no GPU memory."""
    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    d["study"] = name
    sid = create_from_dict(storage, d)
    base = {"tensor_model_parallel_size": 1, "micro_batch_size": 1, "recompute": "none",
            "attention_backend": "unfused", "use_distributed_optimizer": False}  # fmt: skip
    for mbs, tflops, mem in [(1, 0.00213, 0.118), (2, 0.00347, 0.152), (4, 0.00291, 0.209)]:
        _run(storage, sid, {**base, "micro_batch_size": mbs}, ok(tflops, mem), gpu_seconds=3.0)


T = TypeVar("T")


def seed_database(url: str, fill: Callable[[Storage], T]) -> T:
    """Fill the database at ``url`` through the storage API with ``fill``; what it returned."""
    with open_storage(url) as storage:
        return fill(storage)


def seed_cpu_clock(storage: Storage, name: str = "demo-cpu-clock", *, clock: str = "cpu") -> None:
    """The README demo's space (examples/demo_cpu.yaml) with three trials whose steps were
    timed by CPU time (``measurement.clock: cpu``: metrics ``step_clock`` "cpu" and
    ``step_wall_time_s`` beside ``step_time_s``), as dse/workloads/megatron/trainer.py writes
    them; ``clock="wall"``: the same study timed by wall time (neither key)."""
    d = yaml.safe_load((EXAMPLES / "demo_cpu.yaml").read_text())
    d["study"] = name
    if clock == "wall":
        d.pop("measurement", None)
    sid = create_from_dict(storage, d)
    base = {"micro_batch_size": 1, "recompute": "none", "attention_backend": "unfused"}
    for mbs, cpu_s, wall_s in [(1, 0.4047, 0.4414), (8, 0.1918, 0.1998), (16, 0.2057, 0.2152)]:
        tflops = 9.663676416e9 / cpu_s / 1e12
        o = ok(tflops, 0.45)
        metrics = {**o.metrics, "step_time_s": cpu_s,
                   "step_time_ci_s": [0.9 * cpu_s, 1.1 * cpu_s]}  # fmt: skip
        if clock == "cpu":
            metrics.update(step_clock="cpu", step_wall_time_s=wall_s)
        outcome = Outcome("ok", metrics, steps=o.steps)
        _run(storage, sid, {**base, "micro_batch_size": mbs}, outcome, gpu_seconds=30.0)
