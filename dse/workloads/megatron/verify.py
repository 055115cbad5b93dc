"""``dse verify``'s long run of one configuration with the built-in trainer, a checkpoint
saved midway and reloaded.

    python -m dse.workloads.megatron.verify --spec trial.json --steps 100 --out verify.json

One rank in this process (the trial process's own build and step loop,
:mod:`dse.workloads.megatron.trainer`). The run trains ``steps // 2`` steps, saves the
model chunks' and the optimizer's state dicts (the trainer's own save, ``torch.save``),
trains the remaining steps (the *continued* run), then loads the checkpoint back into the
model and optimizer and trains the same remaining steps on the same data again (the
*reloaded* run). The checkpoint reload is ok when the reloaded run's losses equal the
continued run's (``RELOAD_RTOL``): a reload that loses or changes state shows as a
different loss.

Test hook: ``DSE_VERIFY_PERTURB_ON_RELOAD=X`` adds X to the first parameter after the
reload (a planted bad reload, which verification must catch).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from dse.core.records import TrialSpec

#: Relative difference of a reloaded step's loss from the continued run's that still counts
#: as the same (CPU fp32 steps repeat bit for bit; the margin is for summation order).
RELOAD_RTOL = 1e-5
#: Steps at the end whose median step time and TFLOP/s the table shows.
FINAL_WINDOW = 10
PERTURB_ENV = "DSE_VERIFY_PERTURB_ON_RELOAD"


def _with_steps(spec: TrialSpec, steps: int) -> TrialSpec:
    sem = dict(spec.semantics)
    sem["steps"] = steps
    sem["warmup_steps"] = min(int(sem.get("warmup_steps", 0)), steps - 1)
    measurement = {**(spec.measurement or {}), "mode": "fixed"}
    return spec.model_copy(update={"semantics": sem, "measurement": measurement})


def run_verify(spec: TrialSpec, steps: int) -> dict[str, Any]:
    """The long run of ``spec`` (one rank): its figures and the checkpoint reload check."""
    if steps < 4:
        raise ValueError(f"--steps must be at least 4 (got {steps})")
    if spec.world_size != 1:
        raise ValueError(
            f"dse verify runs one rank in this process; the configuration has "
            f"world_size={spec.world_size}"
        )
    import torch

    from dse.workloads.megatron import trainer

    half = steps // 2
    first_spec, rest_spec = _with_steps(spec, half), _with_steps(spec, steps - half)
    dist = trainer._Dist()
    if spec.device == "cpu":
        from dse.workloads.megatron import _cpu_shims

        _cpu_shims.install()
    device = dist.init(spec.device)
    from dse.workloads.megatron import _compat

    _compat.apply()
    plan = trainer.make_plan(first_spec, spec.features or [])
    rest_plan = trainer.make_plan(rest_spec, spec.features or [])
    built = trainer.build(plan, device)
    first, _ = trainer.train(plan, built, device, dist, None)
    with tempfile.TemporaryDirectory(prefix="dse-verify-") as tmp:
        ckpt = Path(tmp) / "checkpoint.pt"
        torch.save(
            {
                "model": [c.state_dict() for c in built.chunks],
                "optimizer": built.optimizer.state_dict(),
                "step": half,
            },
            ckpt,
        )
        cont, _ = trainer.train(rest_plan, built, device, dist, None, first_step=half)
        saved = torch.load(ckpt, weights_only=False)
    for c, sd in zip(built.chunks, saved["model"], strict=True):
        c.load_state_dict(sd)
    built.optimizer.load_state_dict(saved["optimizer"])
    perturb = float(os.environ.get(PERTURB_ENV, "0") or 0)
    if perturb:
        with torch.no_grad():
            next(built.chunks[0].parameters()).add_(perturb)
    reloaded, _ = trainer.train(rest_plan, built, device, dist, None, first_step=half)

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
        "checkpoint_step": half,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="trial spec JSON")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", required=True, help="where the result JSON goes")
    args = parser.parse_args(argv)
    spec = TrialSpec.model_validate_json(Path(args.spec).read_text())
    try:
        result = run_verify(spec, args.steps)
    except Exception as e:  # noqa: BLE001 - the failure is the verify result
        result = {"steps": args.steps, "error": f"{type(e).__name__}: {e}", "reload_ok": False}
    Path(args.out).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
