"""The built-in Megatron-Core trainer behind a Megatron-LM command line.

``torchrun ... -m dse.workloads.megatron.mlm --num-layers 4 ... --micro-batch-size 2``
reads Megatron-LM flags (:func:`dse.workloads.launchers.megatron_lm.parse_megatron_args`),
trains with the built-in trainer and prints what Megatron-LM's ``pretrain_gpt.py`` prints:
one iteration line per step (``iteration N/ M | ... | elapsed time per iteration (ms): ...
| throughput per GPU (TFLOP/s/GPU): ... | lm loss: ... |``) and a ``report_memory`` line.
A configuration Megatron refuses ends in ``AssertionError: <Megatron's message>``. It lets
the ``megatron_lm`` launcher, its override rendering, environment, log parsing and failure
classification run end to end where no Megatron-LM checkout is installed (CPU here).

Numbers are printed with more digits than Megatron-LM's ``.1f`` (a CPU step is a tiny
fraction of a TFLOP/s); the line structure is Megatron-LM's. Extra flag:
``--dse-device {cuda,cpu}`` (Megatron-LM itself is CUDA-only).
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from dse.core.records import MetricsWriter, StepLine, StepMetrics, TrialSpec
from dse.workloads.launchers.megatron_lm import parse_megatron_args
from dse.workloads.megatron._plan import TrialFailure
from dse.workloads.megatron.trainer import _Dist, _exit, _quiet_known_warnings, run_trial

__all__ = ["main"]


class _MegatronLog(MetricsWriter):
    """Prints Megatron-LM's training log instead of metrics lines."""

    def __init__(self, spec: TrialSpec) -> None:
        super().__init__(os.path.join(tempfile.gettempdir(), "dse-mlm-unused.jsonl"))
        self.spec = spec

    def step(self, m: StepMetrics | StepLine | Mapping[str, Any]) -> None:
        record = StepLine.coerce(m).model_dump()
        sem = self.spec.semantics
        it = int(record["step"]) + 1
        now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        gbs = int(sem["global_batch_size"])
        grad = record.get("grad_norm")
        line = (
            f" [{now}] iteration {it:8d}/{int(sem['steps']):8d} |"
            f" consumed samples: {it * gbs:12d} |"
            f" elapsed time per iteration (ms): {record['step_time_s'] * 1000.0:.3f} |"
            f" throughput per GPU (TFLOP/s/GPU): {record['tflops_per_gpu']:.6g} |"
            f" learning rate: {float(sem.get('lr', 1e-4)):.6E} |"
            f" global batch size: {gbs:5d} |"
            f" lm loss: {record['loss']:.6E} |"
            " loss scale: 1.0 |"
            + (f" grad norm: {grad:.3f} |" if grad is not None else "")
            + " number of skipped iterations:   0 | number of nan iterations:   0 |"
        )
        mib = record["peak_mem_gib"] * 1024.0
        reserved = record["peak_reserved_gib"]  # a step line may leave it out: the allocated
        rmib = mib if reserved is None else reserved * 1024.0
        sys.stdout.write(
            f"{line}\n[Rank 0] (after {it} iterations) memory (MB) | allocated: {mib} | "
            f"max allocated: {mib} | reserved: {rmib} | max reserved: {rmib}\n"
        )
        sys.stdout.flush()


def validate_args(failure: TrialFailure) -> None:
    """Megatron-LM refuses a configuration with an assertion in ``validate_args``."""
    raise AssertionError(failure.reason)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    device = "cuda"
    if "--dse-device" in args:
        i = args.index("--dse-device")
        device = args[i + 1]
        del args[i : i + 2]
    model, semantics, params = parse_megatron_args(args)
    semantics["warmup_steps"] = 0
    _quiet_known_warnings()
    dist = _Dist()
    spec = TrialSpec(
        study="megatron_lm",
        trial_number=0,
        params=params,
        model=model,
        semantics=semantics,
        world_size=dist.world_size,
        device=device,  # type: ignore[arg-type]
        metrics_path=os.path.join(tempfile.gettempdir(), "dse-mlm-unused.jsonl"),
    )
    try:
        run_trial(spec, dist, _MegatronLog(spec))
    except TrialFailure as e:
        if e.failure_class == "invalid":
            import traceback

            try:
                validate_args(e)
            except AssertionError:
                traceback.print_exc()
        elif e.failure_class == "oom":
            sys.stderr.write(f"torch.OutOfMemoryError: CUDA out of memory. {e.reason}\n")
        else:
            sys.stderr.write(f"RuntimeError: {e.reason}\n")
        sys.stderr.flush()
        return _exit(1)
    return _exit(0)


if __name__ == "__main__":
    sys.exit(main())
