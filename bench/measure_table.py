"""Measure a replay table on a GPU node: one torchrun of the built-in trainer per configuration.

    python bench/measure_table.py SPACE.yaml OUT.jsonl --world-size 2 \
        --grid tensor_model_parallel_size=1,2 --grid micro_batch_size=1,2,4,8 ...

Every combination of the ``--grid`` values (on top of the space's baseline) that passes
:func:`dse.model.rules.check` is run once as a separate trial process; each becomes one row of
the replay format (see the shared data README): ``ok`` with the summary's figures, ``oom``
with the peak reached, ``invalid`` or ``error`` with the reason. Rows are appended as they
finish, so a run cut short keeps what it measured.

``--warm`` (one-rank trials) runs the configurations one after another in a warm trial
worker (:mod:`dse.workloads.megatron.worker`, as the local runner's ``warm_workers`` do):
imports, the device and compiled kernels (Triton's, for Mamba layers) are set up once; the
worker is replaced after a failed trial (an OOM) or a memory-baseline breach. Each row says
how it ran (``metrics.process``: ``warm`` or ``torchrun``) and its first-step and build
seconds where the trial reports them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dse.core.records import MetricsWriter, Outcome, TrialSpec, read_metrics
from dse.model.rules import check
from dse.space.searchspace import load_space
from dse.space.tablemodel import model_row as model_row_of


def model_row(space: Any) -> dict[str, Any]:
    """A row's ``model``: every field of the space's ``ModelSpec`` through the one schema every
    table reader shares (:mod:`dse.space.tablemodel`: the hybrid pattern, the MoE and Mamba
    sizes, the activation, ... so that a reader rebuilds the same model from the row), the
    gated linear unit the activation implies, and the semantics a replay and the cost model
    need (sequence length, global batch size, precision)."""
    row = model_row_of(space.model, space.semantics)
    row["gated_linear_unit"] = space.model.activation == "swiglu"
    return row


class _WarmWorker:
    """One warm trial worker process (``python -m dse.workloads.megatron.worker``)."""

    def __init__(self, device: str, timeout_s: float, wait: bool = True,
                 extra: tuple[str, ...] = ()) -> None:  # fmt: skip
        r, w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dse.workloads.megatron.worker", "--device", device,
             "--reply-fd", str(w), "--parent", str(os.getpid()), *extra],
            stdin=subprocess.PIPE, pass_fds=(w,), text=True, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        os.close(w)
        self.replies = os.fdopen(r)
        self.seq = 0
        self.init_s: float | None = None
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the worker's ``ready`` (once); RuntimeError when it does not come."""
        if self.init_s is not None:
            return
        ready = self._reply(timeout_s)
        if ready is None or ready.get("event") != "ready":
            self.close()
            raise RuntimeError(f"the warm worker did not start: {ready}")
        self.init_s = float(ready.get("init_s", 0.0))

    def _reply(self, timeout_s: float) -> dict[str, Any] | None:
        ready, _, _ = select.select([self.replies], [], [], timeout_s)
        if not ready:
            return None
        line = self.replies.readline()
        return json.loads(line) if line.strip() else None

    def run(self, tdir: Path, timeout_s: float) -> tuple[bool, str | None]:
        """Run the trial of ``tdir``; (finished, recycle reason or None)."""
        self.seq += 1
        job = {"seq": self.seq, "spec": str(tdir / "trial.json"), "log": str(tdir / "log.txt"),
               "cwd": str(tdir)}  # fmt: skip
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._reply(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return False, "timeout or worker exit"
            if msg.get("event") == "done" and msg.get("seq") == self.seq:
                return True, msg.get("recycle")

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.replies.close()


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("space")
    ap.add_argument("out")
    ap.add_argument("--world-size", type=int, default=None)
    ap.add_argument("--grid", action="append", default=[], metavar="KNOB=V1,V2")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="default: the space's device"
    )
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--skip", type=int, default=0, help="skip the first N configurations")
    ap.add_argument("--limit", type=int, default=None, help="run at most N configurations")
    ap.add_argument(
        "--stop-at", type=float, default=None, help="start no configuration after this epoch time"
    )
    ap.add_argument(
        "--warm", action="store_true", help="one-rank trials in a warm worker (see above)"
    )
    ap.add_argument(
        "--memory-slack-mib", type=float, default=None,
        help="with --warm: the worker's --memory-slack-mib (replaced when its memory after a "
        "row stays this far above its baseline; default: the worker's)",
    )  # fmt: skip
    ap.add_argument(
        "--spare", action="store_true",
        help="with --warm: start the next worker while a row runs, so that a replaced worker "
        "(after a failure or a memory-baseline breach) costs no start-up between rows",
    )  # fmt: skip
    args = ap.parse_args(argv)

    space = load_space(args.space)
    if args.device is None:
        args.device = space.resources.device
    if args.world_size is not None:
        res = space.resources.model_copy(update={"world_size": args.world_size})
        space = space.model_copy(update={"resources": res})
    sem = space.semantics
    if args.steps is not None:
        sem = sem.model_copy(update={"steps": args.steps, "warmup_steps": args.steps // 2})
    names = [g.split("=", 1)[0] for g in args.grid]
    values = [[_value(v) for v in g.split("=", 1)[1].split(",")] for g in args.grid]
    configs = []
    for combo in itertools.product(*values):
        p = space.full_params({**space.baseline(), **dict(zip(names, combo, strict=True))})
        if not check(space, p):
            configs.append(p)
    configs = configs[args.skip : None if args.limit is None else args.skip + args.limit]
    world = space.resources.world_size
    row_model = model_row(space.model_copy(update={"semantics": sem}))
    hw = {"gpu": space.resources.gpu, "gpu_memory_gib": space.resources.gpu_memory_gib}
    out = Path(args.out)
    tmp = Path(tempfile.mkdtemp(prefix="dse_measure_"))
    print(f"{len(configs)} configurations, world size {world}", flush=True)
    if args.warm and world != 1:
        ap.error(f"--warm runs one-rank trials (world size {world})")
    worker: _WarmWorker | None = None
    spare: _WarmWorker | None = None
    extra = (
        () if args.memory_slack_mib is None else ("--memory-slack-mib", str(args.memory_slack_mib))
    )
    for i, params in enumerate(configs):
        if args.stop_at is not None and time.time() > args.stop_at:
            print(f"stopped at the deadline: {len(configs) - i} configurations not run")
            break
        tdir = tmp / f"c{i}"
        tdir.mkdir()
        spec = TrialSpec(
            study="measure",
            trial_number=i,
            params=params,
            model=space.model.model_dump(),
            semantics=sem.model_dump(),
            world_size=world,
            device=args.device,
            metrics_path=str(tdir / "metrics.jsonl"),
            gpu=space.resources.gpu,
            gpu_memory_gib=space.resources.gpu_memory_gib,
        )
        (tdir / "trial.json").write_text(spec.model_dump_json())
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world}", "-m", "dse.workloads.megatron.trainer",
            "--spec", str(tdir / "trial.json"),
        ]  # fmt: skip
        t0 = time.monotonic()
        recycle: str | None = None
        if args.warm:
            try:
                if worker is None and spare is not None:
                    worker, spare = spare, None
                    worker.wait_ready(args.timeout_s)
                if worker is None:
                    worker = _WarmWorker(args.device, args.timeout_s, extra=extra)
                if args.spare and spare is None and i + 1 < len(configs):
                    # its imports and device set-up overlap this row's steps (one more CUDA
                    # context on the device, about 0.5 GiB, while both live)
                    spare = _WarmWorker(args.device, args.timeout_s, wait=False, extra=extra)
            except RuntimeError as e:  # the row says so; the next configuration tries again
                MetricsWriter(tdir / "metrics.jsonl").failure("error", str(e)[:300])
            else:
                finished, recycle = worker.run(tdir, args.timeout_s)
                if not finished or recycle is not None:
                    worker.close()
                    worker = None
        else:
            try:
                with open(tdir / "log.txt", "w") as log:
                    subprocess.run(
                        cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False,
                    )  # fmt: skip
            except subprocess.TimeoutExpired:
                pass
        oc = read_metrics(tdir / "metrics.jsonl")
        if oc is None:
            oc = Outcome.failure("error", f"no final metrics line (timeout {args.timeout_s} s)")
        metrics: dict[str, Any] = {}
        if oc.ok:
            status = "ok"
            m = oc.metrics
            metrics = {
                k: m.get(k)
                for k in ("tflops_per_gpu", "step_time_s", "peak_mem_gib", "peak_reserved_gib")
            }
            metrics["loss"] = [s.loss for s in oc.steps]
            # the measurement and its intervals (dse.stats.measure), which the replay passes on;
            # where the time went apart from the measured steps; the Mamba kernels used
            for k in ("measurement", "step_time_ci_s", "tflops_per_gpu_ci", "first_step_s",
                      "build_s", "mamba_kernels", "model_flops_per_step",
                      "triton_autotune"):  # fmt: skip
                if k in m:
                    metrics[k] = m[k]
        else:
            fc = oc.failure_class or "error"
            status = fc if fc in ("oom", "invalid") else "error"
            metrics = {k: v for k, v in oc.metrics.items() if k.startswith("peak_")}
            metrics["error"] = (oc.reason or "")[:300]
        metrics["process"] = "warm" if args.warm else "torchrun"
        row = {
            "params": {k: params[k] for k in sorted(params)},
            "status": status,
            "metrics": metrics,
            "world_size": world,
            "model": row_model,
            "hardware": hw,
        }
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"[{i + 1}/{len(configs)}] {time.monotonic() - t0:5.1f}s {status} "
            f"{metrics.get('peak_mem_gib')} first step {metrics.get('first_step_s')} "
            f"{json.dumps(params, sort_keys=True)}"
            + (f" (worker replaced: {recycle})" if recycle else ""),
            flush=True,
        )
    for w in (worker, spare):
        if w is not None:
            w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
