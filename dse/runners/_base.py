"""The runner interface: where trial processes run.

Failure contract: a trial that fails in an expected way (OOM, invalid, hang, timeout, crash of
the trial process) is reported by :meth:`BaseRunner.poll` as an :class:`Outcome` value; a
runner raises only when it cannot work at all (:class:`dse.core.exceptions.TrialLaunchError`).
"""

from __future__ import annotations

import os
import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dse.core.records import Outcome, TrialSpec
from dse.workloads.logs import LOG_PATTERNS, classify_log
from dse.workloads.procgroup import OWNER_ENV, kill_owned_group

__all__ = [
    "TRIAL_ENV_DROP",
    "trial_environ",
    "compile_cache_env",
    "COMPILE_CACHE_VARS",
    "BaseRunner",
    "Launch",
    "Finished",
    "classify_log",
    "LOG_PATTERNS",
    "OWNER_ENV",
    "log_tail",
    "exit_words",
    "last_lines",
]


#: Variables of the controller's environment that trial processes never inherit, whatever
#: runs them (the API's write token; a storage URL that may hold a password): a trial needs
#: neither, and it runs the space's code.
TRIAL_ENV_DROP: tuple[str, ...] = ("DSE_API_TOKEN", "DSE_STORAGE")


#: Where compiled kernels are kept on disk, per study and node (:func:`compile_cache_env`).
COMPILE_CACHE_VARS: tuple[tuple[str, str], ...] = (
    ("TRITON_CACHE_DIR", "triton"),  # Triton kernels (torch.compile, Mamba's SSD kernels)
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),  # torch.compile's generated code
    ("TORCH_EXTENSIONS_DIR", "torch_extensions"),  # JIT-built C++/CUDA extensions
    ("CUDA_CACHE_PATH", "cuda"),  # the driver's PTX-to-binary cache
)


def compile_cache_env(study_dir: Path, host: str, environ: Any = None) -> dict[str, str]:
    """The compile caches of a study's trials on this node: ``<study dir>/cache/<host>/...``
    for each of :data:`COMPILE_CACHE_VARS` the environment (``environ``: the trial's) does not
    set already. Every trial of the study on this node, a process of its own or a warm
    worker, compiles a kernel once and finds it there afterwards (first steps after the
    first trial's pay no Triton compilation and autotuning); another study starts clean. In
    memory-only caches (TorchScript's fused kernels) live as long as a warm worker."""
    env = os.environ if environ is None else environ
    root = Path(study_dir) / "cache" / (host or "node")
    return {var: str(root / sub) for var, sub in COMPILE_CACHE_VARS if var not in env}


def trial_environ(environ: Any = None) -> dict[str, str]:
    """``environ`` (default: this process's) less :data:`TRIAL_ENV_DROP`: what a trial
    process starts with before its own variables."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k not in TRIAL_ENV_DROP}


@dataclass(frozen=True)
class Launch:
    """One trial to start: its id, command line, folder and the devices it needs."""

    trial_id: int
    number: int
    argv: list[str]
    trial_dir: Path
    metrics_path: Path
    log_path: Path
    world_size: int
    device: str  # "cuda" | "cpu"
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 900.0
    hang_timeout_s: float = 300.0
    #: the trial spec itself (runners that answer in-process read it; others run ``argv``)
    spec: TrialSpec | None = None


@dataclass(frozen=True)
class Finished:
    trial_id: int
    outcome: Outcome
    wall_s: float
    devices: int
    #: where it ran, e.g. ``node1:gpu0,1,node2:gpu0,1`` (cluster runners; None: this host)
    placement: str | None = None
    #: the GPU slots it held, ``host:gpu`` each (empty: not known, or a CPU trial)
    gpu_slots: tuple[str, ...] = ()
    #: how the local runner ran it (``{"warm": true, "pid": ..., "trial_in_worker": ...}``)
    worker: dict[str, Any] | None = None


class BaseRunner(ABC):
    """Runs trial processes; the study loop asks for free slots, submits, polls."""

    name = "base"
    #: whether trials read a spec file and write metrics/log files in ``trial_dir``
    uses_files = True

    @abstractmethod
    def free_slots(self) -> int:
        """How many more trials can start now."""

    @abstractmethod
    def submit(self, launch: Launch) -> None:
        """Start a trial (non-blocking)."""

    @abstractmethod
    def poll(self) -> list[Finished]:
        """Trials that finished since the last poll (with their outcomes)."""

    @abstractmethod
    def running(self) -> list[int]:
        """Ids of the trials still running (for heartbeats)."""

    @abstractmethod
    def stop(self) -> list[int]:
        """Kill every running trial (whole process groups); returns their ids."""

    def prepare(self, owner: str) -> None:  # noqa: B027 - optional hook
        """Start what can start before the first trial (the local runner's warm workers), on
        behalf of the controller ``owner``. Optional; by default nothing."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the runner keeps between trials (warm workers) once the study's
        loop is over; running trials are :meth:`stop`'s. By default nothing."""

    @property
    def devices_held(self) -> int | None:
        """Devices (GPUs; CPU ranks on CPU) this runner holds for the whole study, whether
        trials run on them or not; None for runners that take devices per trial (a cluster
        scheduler's jobs), whose held time is their trials' own."""
        return None

    def kill_leftover(self, trial_dir: Path, owner: str) -> bool:
        """End what a dead controller's trial left running: by default its process group,
        only if this installation started it for ``owner`` (the trial row's owner). Returns
        whether something was signalled."""
        return kill_owned_group(trial_dir, owner)

    @property
    def host(self) -> str:
        import socket

        return socket.gethostname()


def last_lines(text: str, n: int = 3, width: int = 400) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-width:]


def exit_words(argv: list[str], rc: int) -> str:
    """How a trial's process ended, in words: ``the trial's process (torchrun) was killed by
    SIGKILL`` for a negative return code, ``... exited with code 3`` otherwise."""
    prog = os.path.basename(argv[0]) if argv else "?"
    if len(argv) > 2 and argv[1] == "-m":
        prog = "torchrun" if argv[2] == "torch.distributed.run" else argv[2]
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return f"the trial's process ({prog}) was killed by {name}"
    return f"the trial's process ({prog}) exited with code {rc}"


def log_tail(path: Path, n: int = 8000) -> str:
    """The last ``n`` bytes of a trial's log as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
