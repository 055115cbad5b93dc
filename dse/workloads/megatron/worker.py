"""A warm trial worker: one long-lived process per slot of the local runner that runs
one-rank trials of the built-in trainer one after another.

Started by :class:`dse.runners.local.LocalRunner` (``runner.options.warm_workers``)::

    python -m dse.workloads.megatron.worker --device cuda --reply-fd 5 --parent PID

It imports torch and megatron-core, sets its device, initialises the default process group
(one rank: NCCL on CUDA, gloo on CPU) and warms it up once, measures its memory baseline and
says ``ready``. Then it reads trial jobs from stdin, one JSON object a line, and runs each
exactly as a trial process would (:func:`dse.workloads.megatron.trainer.run_spec`: the same
metrics file, the same final line), with the trial's log as its stdout/stderr and the trial's
folder as its working directory. After a trial it frees what the trial left
(:func:`~dse.workloads.megatron.trainer.release_trial_state`: Megatron's parallel state and
its process groups, the model and optimizer, the device caches; compiled kernels stay) and
measures its memory again.

It leaves (exits, and the runner starts a fresh one) after a trial that failed in any way,
when its memory stayed more than ``--memory-slack-mib`` above the baseline, after
``--max-trials`` trials, at the end of its input (the runner closed it or died), and when its
parent dies (``PR_SET_PDEATHSIG``). A timeout, a hang or a stop is the runner's: it kills
the worker's whole process group, as it does a trial process.

Replies, one JSON object a line on ``--reply-fd``::

    {"event": "ready", "pid": 123, "baseline_mib": 0.0, "init_s": 9.1}
    {"event": "started", "seq": 7}
    {"event": "done", "seq": 7, "exit": 0, "memory_mib": 2.0, "baseline_mib": 0.0,
     "trials": 3, "release_s": 0.2, "release": {...}, "recycle": null}
                                                 # recycle: or "failed", "memory ...", ...

``release`` holds the seconds of each part of the release, on CUDA the allocated MiB left
(``allocated_mib``; ``memory_mib`` is the allocator's reserved MiB), and with
``--count-tensors`` the tensors still reachable (``live_cuda_n``, ``live_cuda_mib``, ...).

A job: ``{"seq": 7, "spec": "<trial dir>/trial.json", "log": "<trial dir>/log.txt",
"cwd": "<trial dir>"}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from dse.core.records import MetricsWriter, TrialSpec
from dse.workloads.megatron import _autotune_cache, _compat, _cpu_shims, trainer
from dse.workloads.megatron._plan import EXIT_FAILURE
from dse.workloads.megatron._speed import live_tensors

__all__ = ["main", "memory_mib"]

_MIB = float(2**20)


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); leave at once
    if the parent is already gone."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent and os.getppid() != parent:
        os._exit(0)


def memory_mib(device: str) -> float:
    """This process's memory that a trial may leave behind: on CUDA the caching allocator's
    reserved bytes (where tensors live), on CPU the resident set."""
    if device == "cuda":
        import torch

        return float(torch.cuda.memory_reserved()) / _MIB
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / _MIB
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _reset_peak_memory(device: str) -> None:
    """Start the trial's peak-memory figures from now (per trial, as in a fresh process)."""
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
        return
    try:  # resets VmHWM, which getrusage's ru_maxrss reads (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _preload() -> None:
    """Import what every trial uses (the cost a trial process pays at each start)."""
    import torch  # noqa: F401
    from megatron.core import parallel_state, tensor_parallel  # noqa: F401
    from megatron.core.distributed import DistributedDataParallel  # noqa: F401
    from megatron.core.models.gpt import GPTModel  # noqa: F401
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: F401
    from megatron.core.optimizer import get_megatron_optimizer  # noqa: F401
    from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: F401
    from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: F401

    from dse.workloads.megatron import _data, _init, _sdpa  # noqa: F401


class _GroupPool:
    """``torch.distributed.new_group`` for Megatron's parallel state in a warm worker: the
    torch process groups (and their communicators) one trial asked for are handed out again
    to the next trial that asks for the same ones (ranks, backend, options, name), instead of
    being destroyed and created again (about 50 ms each, 17 per one-rank trial). Megatron's
    own state is still destroyed and initialised for every trial; a group no trial reused is
    destroyed after the next trial; a failed trial ends the worker, groups and all."""

    def __init__(self) -> None:
        import torch.distributed as tdist

        self._new_group = tdist.new_group
        self._free: dict[str, list[Any]] = {}
        self.used: list[tuple[str, Any]] = []
        self.reused = 0
        tdist.new_group = self.new_group  # type: ignore[assignment]

    def new_group(self, ranks: Any = None, *args: Any, **kw: Any) -> Any:
        from torch.distributed import distributed_c10d as c10d

        key = repr((None if ranks is None else list(ranks), args, sorted(kw.items())))
        pool = self._free.get(key) or []
        while pool:
            pg = pool.pop(0)
            if pg in c10d._world.pg_map:  # Megatron destroys its gloo groups itself
                self.used.append((key, pg))
                self.reused += 1
                return pg
        pg = self._new_group(ranks, *args, **kw)
        self.used.append((key, pg))
        return pg

    def end_trial(self) -> list[Any]:
        """The groups this trial used: kept for the next one (the others are released)."""
        self._free = {}
        for key, pg in self.used:
            self._free.setdefault(key, []).append(pg)
        kept = [pg for _, pg in self.used]
        self.used = []
        return kept


def _init_device(device: str) -> Any:
    """Device, default process group and a first collective, once for the worker's life."""

    if device == "cpu":
        _cpu_shims.install()
    else:
        os.environ.update(trainer.cuda_environment(os.environ))

        _autotune_cache.install()  # before any trial imports an autotuned kernel
    dist = trainer._Dist()
    dev = dist.init(device)
    _compat.apply()
    import torch
    import torch.distributed as tdist

    x = torch.ones(64, 64, device=dev)
    tdist.all_reduce(x)  # sets up the default group's communicator
    (x @ x).sum().item()
    del x
    trainer.release_trial_state(device)
    return dist


class _Replies:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, **msg: Any) -> None:
        data = (json.dumps(msg) + "\n").encode()
        try:
            os.write(self.fd, data)
        except OSError:  # the runner is gone: nothing more to do
            os._exit(0)


class _Redirect:
    """The trial's log as fds 1 and 2 for the duration of a trial."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.saved: list[int] = []

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.saved = [os.dup(1), os.dup(2)]
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)


def _run_job(job: dict[str, Any], device: str, dist: Any) -> int:
    """One trial: its spec, log and folder; returns the trial's exit status."""

    os.chdir(job["cwd"])
    with _Redirect(job["log"]):
        sys.stdout.write(f"[dse warm worker {os.getpid()}] trial spec {job['spec']}\n")
        sys.stdout.flush()
        try:
            with open(job["spec"]) as f:
                spec = TrialSpec.model_validate_json(f.read())
        except (OSError, ValueError) as e:
            sys.stderr.write(f"cannot read the trial spec: {e}\n")
            sys.stderr.flush()
            return EXIT_FAILURE
        _reset_peak_memory(device)
        try:
            return trainer.run_spec(spec, dist)
        except BaseException as e:  # noqa: BLE001 - SystemExit and the like: still a failure line
            traceback.print_exc()
            MetricsWriter(spec.metrics_path).failure(
                "error", f"{type(e).__name__}: {e} (in a warm trial worker)"
            )
            return EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--reply-fd", type=int, required=True)
    p.add_argument("--parent", type=int, default=0, help="the runner's pid")
    p.add_argument("--max-trials", type=int, default=50)
    p.add_argument("--memory-slack-mib", type=float, default=512.0)
    p.add_argument(
        "--count-tensors",
        action="store_true",
        default=os.environ.get("DSE_WORKER_COUNT_TENSORS") == "1",
        help="after each release, count the tensors still reachable (release.live_*; a "
        "diagnosis of leaks, about 0.1 s a trial; env DSE_WORKER_COUNT_TENSORS=1)",
    )
    p.add_argument(
        "--defer-device",
        action="store_true",
        help="a spare: import now, set up the device at the first job (no GPU memory before)",
    )
    args = p.parse_args(argv)
    _die_with_parent(args.parent)
    replies = _Replies(args.reply_fd)
    t0 = time.monotonic()

    trainer._quiet_known_warnings()
    _preload()
    dist: Any = None
    baseline = 0.0
    if not args.defer_device:
        dist = _init_device(args.device)
        baseline = memory_mib(args.device)
    pool = _GroupPool()
    gc.collect()
    gc.freeze()  # what the imports made is never garbage: later collections skip it
    replies.send(
        event="ready",
        pid=os.getpid(),
        baseline_mib=baseline,
        init_s=time.monotonic() - t0,
        device_ready=dist is not None,
    )
    trials = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        replies.send(event="started", seq=job["seq"])
        if dist is None:
            dist = _init_device(args.device)
            baseline = memory_mib(args.device)
        code = _run_job(job, args.device, dist)
        trials += 1
        t1 = time.monotonic()
        recycle: str | None = None
        mem: float | None = None
        took: dict[str, float] = {}
        if code != 0:
            recycle = "the trial failed"
        else:
            took = trainer.release_trial_state(args.device, keep_groups=pool.end_trial())
            took["groups_reused"] = float(pool.reused)
            mem = memory_mib(args.device)
            if args.count_tensors:
                took.update({f"live_{k}": v for k, v in live_tensors().items()})
            if args.device == "cuda":
                import torch

                took["allocated_mib"] = float(torch.cuda.memory_allocated()) / _MIB
            if mem - baseline > args.memory_slack_mib:
                recycle = (
                    f"memory {mem:.0f} MiB after the trial, baseline {baseline:.0f} MiB "
                    f"(slack {args.memory_slack_mib:g} MiB)"
                )
            elif trials >= args.max_trials:
                recycle = f"{trials} trials run (warm_max_trials)"
        replies.send(
            event="done",
            seq=job["seq"],
            exit=code,
            memory_mib=mem,
            baseline_mib=baseline,
            trials=trials,
            release_s=time.monotonic() - t1,
            release=took,
            recycle=recycle,
        )
        if recycle is not None:
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no teardown: a failed trial may have left a collective or memory behind


if __name__ == "__main__":
    sys.exit(main())
