"""``dse verify``'s long run of one configuration in the trial process, a checkpoint saved
midway with Megatron-Core's distributed checkpointing and reloaded.

The trial process (:func:`dse.workloads.megatron.trainer.run_spec`, every rank of the
trial's ``torchrun``, launched by the study's own runner) runs it instead of a timed trial
when the trial spec's ``workload`` carries ``verify`` (``{"steps": N}``, set by
:mod:`dse.loop.verify`). Every rank trains ``N // 2`` steps, saves the model chunks' and the
optimizer's *sharded* state dicts with ``megatron.core.dist_checkpointing.save`` (the format
Megatron-LM and Megatron-Bridge checkpoint in: each rank writes its shards, PyTorch
Distributed Checkpoint underneath; gloo on CPU, NCCL on GPU) into ``<trial dir>/checkpoint``,
trains the remaining steps (the *continued* run), then loads the checkpoint back with
``dist_checkpointing.load`` into the model and optimizer and trains the same remaining steps
on the same data again (the *reloaded* run). The reload is ok when the reloaded run's losses
equal the continued run's (:data:`RELOAD_RTOL`): a reload that loses or changes state shows
as a different loss. Rank 0 writes the result as the summary line's ``verify`` field.

Test hook: ``DSE_VERIFY_PERTURB_ON_RELOAD=X`` adds X to the first parameter after the
reload (a planted bad reload, which verification must catch).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dse.core.records import StepMetrics, TrialSpec
from dse.workloads.megatron._plan import TrialPlan, make_plan

#: The trainer's step loop (:func:`dse.workloads.megatron.trainer.train`), handed in by the
#: trainer (which imports this module): ``train(plan, built, device, dist, writer,
#: first_step=...) -> (steps, series)``.
TrainFn = Callable[..., tuple[list[StepMetrics], Any]]

#: Relative difference of a reloaded step's loss from the continued run's that still counts
#: as the same (CPU fp32 steps repeat bit for bit; the margin is for summation order).
RELOAD_RTOL = 1e-5
#: Steps at the end whose median step time and TFLOP/s the table shows.
FINAL_WINDOW = 10
PERTURB_ENV = "DSE_VERIFY_PERTURB_ON_RELOAD"
#: The checkpoint's format: Megatron-Core's distributed checkpoint, PyTorch DCP backend.
CHECKPOINT_FORMAT = "megatron.core.dist_checkpointing (torch_dist)"


def verify_steps(spec: TrialSpec) -> int | None:
    """The long run's step count when ``spec`` is a verify run (None: a timed trial)."""
    v = (spec.workload or {}).get("verify")
    return None if not v else int(v["steps"])


def _with_steps(spec: TrialSpec, steps: int) -> TrialSpec:
    sem = dict(spec.semantics)
    sem["steps"] = steps
    sem["warmup_steps"] = min(int(sem.get("warmup_steps", 0)), steps - 1)
    measurement = {**(spec.measurement or {}), "mode": "fixed", "prune": False}
    return spec.model_copy(update={"semantics": sem, "measurement": measurement, "prune": None})


def _sharded_state_dict(built: Any, is_loading: bool) -> dict[str, Any]:
    """The model chunks' and the optimizer's sharded state dicts, keyed as Megatron-LM
    keys its checkpoints (``model`` or ``model0``, ``model1``... with virtual stages)."""
    chunks = [c.module for c in built.chunks]  # below DDP: GPTModel (or Float16Module)
    sd: dict[str, Any] = {}
    if len(chunks) == 1:
        sd["model"] = chunks[0].sharded_state_dict()
    else:
        for i, c in enumerate(chunks):
            sd[f"model{i}"] = c.sharded_state_dict()
    sd["optimizer"] = built.optimizer.sharded_state_dict(sd, is_loading=is_loading)
    return sd


def save_checkpoint(built: Any, ckpt: Path, dist: Any) -> None:
    """Every rank writes its shards of the model and optimizer state into ``ckpt``."""
    import torch.distributed as tdist
    from megatron.core import dist_checkpointing

    if dist.rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)
        ckpt.mkdir(parents=True)
    tdist.barrier()
    dist_checkpointing.save(_sharded_state_dict(built, is_loading=False), str(ckpt))


def load_checkpoint(built: Any, ckpt: Path) -> None:
    """Load ``ckpt`` back into the model chunks and the optimizer (every rank its shards)."""
    from megatron.core import dist_checkpointing

    state = dist_checkpointing.load(_sharded_state_dict(built, is_loading=True), str(ckpt))
    if "model" in state:
        built.chunks[0].module.load_state_dict(state["model"])
    else:
        for i, c in enumerate(built.chunks):
            c.module.load_state_dict(state[f"model{i}"])
    built.optimizer.load_state_dict(state["optimizer"])


def run_verify(
    train: TrainFn,
    spec: TrialSpec,
    steps: int,
    features: list[str],
    built: Any,
    device: Any,
    dist: Any,
    writer: Any = None,
) -> dict[str, Any]:
    """The long run of a built trial (``built``: the trainer's model chunks and optimizer):
    its figures and the checkpoint reload check, the same on every rank. ``writer`` (rank
    0's) gets a step line per step of the three parts (the runner sees the run progress)."""
    if steps < 4:
        raise ValueError(f"verify steps must be at least 4 (got {steps})")
    import torch
    import torch.distributed as tdist

    half = steps // 2
    first_plan: TrialPlan = make_plan(_with_steps(spec, half), features)
    rest_plan = make_plan(_with_steps(spec, steps - half), features)
    ckpt = Path(spec.metrics_path).resolve().parent / "checkpoint"
    first, _ = train(first_plan, built, device, dist, writer)
    # a rank that fails raises out of here at once (no barrier): the trial process exits
    # and torchrun ends its peers
    save_checkpoint(built, ckpt, dist)
    cont, _ = train(rest_plan, built, device, dist, writer, first_step=half)
    load_checkpoint(built, ckpt)
    perturb = float(os.environ.get(PERTURB_ENV, "0") or 0)
    if perturb:
        with torch.no_grad():
            next(built.chunks[0].parameters()).add_(perturb)
    reloaded, _ = train(rest_plan, built, device, dist, writer, first_step=half)
    tdist.barrier()
    if dist.rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)

    losses = [s.loss for s in first] + [s.loss for s in cont]
    mismatch = [
        (half + i, a.loss, b.loss)
        for i, (a, b) in enumerate(zip(cont, reloaded, strict=True))
        if not math.isclose(a.loss, b.loss, rel_tol=RELOAD_RTOL, abs_tol=0.0)
    ]
    tail = (first + cont)[-FINAL_WINDOW:]
    reload_reason = None
    if mismatch:
        step, a, b = mismatch[0]
        reload_reason = (
            f"checkpoint reload changed the loss: step {step} loss {b:.6g} after the reload "
            f"against {a:.6g} without it ({len(mismatch)} of {len(cont)} steps differ)"
        )
    return {
        "steps": steps,
        "world_size": dist.world_size,
        "checkpoint_step": half,
        "checkpoint_format": CHECKPOINT_FORMAT,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "losses": losses,
        "reloaded_losses": [s.loss for s in reloaded],
        "final_step_time_s": statistics.median(s.step_time_s for s in tail),
        "final_tflops_per_gpu": statistics.median(s.tflops_per_gpu for s in tail),
        "final_window": len(tail),
        "step_clock": (spec.measurement or {}).get("clock", "wall"),
        "peak_mem_gib": max(s.peak_mem_gib for s in first + cont + reloaded),
        "reload_ok": not mismatch,
        "reload_reason": reload_reason,
    }
