"""Local runner: trial processes on this machine, as many at once as free devices allow."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from dse.core.exceptions import TrialLaunchError
from dse.core.records import Outcome, read_metrics
from dse.runners._base import (
    OWNER_ENV,
    TRIAL_ENV_DROP,
    BaseRunner,
    Finished,
    Launch,
    classify_log,
    compile_cache_env,
    exit_words,
    last_lines,
    log_tail,
    trial_environ,
)
from dse.runners.warm import WarmPool, WarmSettings
from dse.workloads.logs import classify_failure
from dse.workloads.procgroup import (
    TRIAL_TAG_ENV,
    kill_group,
    kill_owned_group,
    kill_process_group,
    kill_trial,
    new_trial_tag,
)

__all__ = [
    "LocalRunner",
    "detect_gpus",
    "kill_group",
    "kill_owned_group",
    "kill_process_group",
    "TRIAL_ENV_DROP",
]


def detect_gpus() -> list[int]:
    """GPU ids visible here, from CUDA_VISIBLE_DEVICES or ``nvidia-smi -L`` (no torch)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [int(x) for x in env.split(",") if x.strip().isdigit()]
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [i for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


#: Signals that stop a process on someone's request (a kill, a scheduler, a terminal), as
#: opposed to a crash of the process itself.
_STOP_SIGNALS = frozenset(
    {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
)


@dataclass
class _Proc:
    launch: Launch
    popen: subprocess.Popen[bytes]
    devices: list[int]
    started: float
    last_progress: float
    last_size: int
    log: object
    tag: str = ""  # the trial's tag (TRIAL_TAG_ENV): every process of the trial carries it


class LocalRunner(BaseRunner):
    """Runs each trial as a subprocess in its own process group.

    GPU slots: the visible GPUs are split into groups of ``world_size``; a trial gets one
    group through ``CUDA_VISIBLE_DEVICES``. On CPU, ``max_parallel`` trials at once
    (default 1). A trial is killed (whole process group) after ``timeout_s`` or when its
    metrics file does not grow for ``hang_timeout_s``.

    With ``warm`` (one-rank trials of the built-in trainer), each slot keeps a warm worker
    process that runs the slot's trials one after another (:mod:`.warm`); slot ``i`` is then
    the fixed GPU group ``i``.
    """

    name = "local"

    def __init__(
        self,
        *,
        device: str,
        world_size: int,
        gpus: list[int] | None = None,
        max_parallel: int | None = None,
        warm: WarmSettings | None = None,
    ) -> None:
        self.device = device
        self.world_size = world_size
        if device == "cuda":
            self.gpus = list(gpus) if gpus is not None else detect_gpus()
            slots = len(self.gpus) // world_size
            if slots == 0:
                raise TrialLaunchError(
                    f"the local runner needs {world_size} GPU(s) per trial but sees "
                    f"{len(self.gpus)} (CUDA_VISIBLE_DEVICES / nvidia-smi); set "
                    "resources.device: cpu to train on CPU"
                )
            self.slots = min(slots, max_parallel) if max_parallel else slots
        else:
            self.gpus = []
            self.slots = max_parallel or 1
        self._free_gpus = list(self.gpus)
        self._procs: dict[int, _Proc] = {}
        self._done: list[Finished] = []
        self.warm: WarmPool | None = None
        if warm is not None:
            groups = [
                self.gpus[i * world_size : (i + 1) * world_size] if device == "cuda" else []
                for i in range(self.slots)
            ]
            env = trial_environ()
            self.warm = WarmPool(warm, slots=groups, device=device, base_env=env, host=self.host)

    @property
    def devices_held(self) -> int:
        return self.slots * self.world_size

    def prepare(self, owner: str) -> None:
        if self.warm is not None:
            self.warm.prepare(owner)

    def close(self) -> None:
        if self.warm is not None:
            self.warm.close()

    def free_slots(self) -> int:
        if self.warm is not None:
            return self.warm.free_slots()
        return self.slots - len(self._procs)

    def submit(self, launch: Launch) -> None:
        if self.warm is not None:
            self.warm.submit(launch)
            return
        devices: list[int] = []
        env = trial_environ()
        env.update(launch.env)
        env.update(compile_cache_env(launch.trial_dir.parent, self.host, env))
        # each trial rank gets its share of the cores (torchrun warns and picks 1 otherwise)
        ranks = max(1, self.slots * launch.world_size)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
        tag = env[TRIAL_TAG_ENV] = new_trial_tag()
        if self.device == "cuda":
            if len(self._free_gpus) < launch.world_size:
                raise RuntimeError("submit() called without a free slot")
            devices = self._free_gpus[: launch.world_size]
            del self._free_gpus[: launch.world_size]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        try:
            launch.trial_dir.mkdir(parents=True, exist_ok=True)
            log = open(launch.log_path, "ab")  # noqa: SIM115 - closed when the trial ends
        except OSError as e:
            self._free_gpus = sorted(self._free_gpus + devices)
            raise TrialLaunchError(
                f"trial {launch.number}: cannot write {launch.log_path}: {e}"
            ) from e
        try:
            popen = subprocess.Popen(
                launch.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=launch.trial_dir,
                start_new_session=True,
            )
        except OSError as e:
            log.close()
            self._free_gpus = sorted(self._free_gpus + devices)
            raise TrialLaunchError(
                f"trial {launch.number}: cannot start {launch.argv[0]!r}: {e}"
            ) from e
        owner = launch.env.get(OWNER_ENV, "")
        (launch.trial_dir / "pgid").write_text(
            json.dumps({"pgid": popen.pid, "owner": owner, "tag": tag})
        )
        now = time.monotonic()
        self._procs[launch.trial_id] = _Proc(launch, popen, devices, now, now, 0, log, tag)

    def _finish(self, tid: int, outcome: Outcome) -> None:
        p = self._procs.pop(tid)
        p.log.close()  # type: ignore[attr-defined]
        self._free_gpus.extend(p.devices)
        self._free_gpus.sort()
        ndev = len(p.devices) or p.launch.world_size
        labels = tuple(f"{self.host}:{g}" for g in p.devices)
        self._done.append(
            Finished(
                tid,
                outcome,
                time.monotonic() - p.started,
                ndev,
                gpu_slots=labels,
                worker={"warm": False},
            )
        )

    def poll(self) -> list[Finished]:
        if self.warm is not None:
            return self.warm.poll()
        now = time.monotonic()
        for tid, p in list(self._procs.items()):
            rc = p.popen.poll()
            mp = p.launch.metrics_path
            size = mp.stat().st_size if mp.exists() else 0
            if size != p.last_size:
                p.last_size, p.last_progress = size, now
            if rc is not None:
                # what is left of the trial: its group, torchrun's workers in their own
                # sessions (a torchrun killed leaves them running)
                kill_trial(p.popen.pid, p.tag, grace_s=0.5)
                self._finish(tid, self._outcome_of(p, rc))
            elif now - p.started > p.launch.timeout_s:
                # read before the stop: a stopped trial writes its own ``interrupted`` line
                result = read_metrics(mp)
                kill_process_group(p.popen, tag=p.tag)
                self._finish(
                    tid,
                    result
                    or Outcome.failure(
                        "timeout", f"trial ran past its timeout of {p.launch.timeout_s:.0f} s"
                    ),
                )
            elif now - p.last_progress > p.launch.hang_timeout_s:
                result = read_metrics(mp)
                kill_process_group(p.popen, tag=p.tag)
                self._finish(
                    tid,
                    result
                    or Outcome.failure(
                        "hang",
                        f"no progress for {p.launch.hang_timeout_s:.0f} s (hang timeout)",
                    ),
                )
        done, self._done = self._done, []
        return done

    def _outcome_of(self, p: _Proc, rc: int) -> Outcome:
        """The outcome of a trial whose process ended while the runner did not stop it."""
        out = read_metrics(p.launch.metrics_path)
        if out is not None and out.failure_class != "interrupted":
            return out
        tail = log_tail(p.launch.log_path)
        how = exit_words(p.launch.argv, rc)
        if out is None:
            last = tail.strip().splitlines()[-1] if tail.strip() else ""
            return Outcome.failure(classify_log(tail), f"{how} without a result: {last[-300:]}")
        # The ranks' "interrupted" line says only that they got SIGTERM: here not from the
        # runner but from the runner's clean-up after their launcher was killed, or from the
        # launcher after a rank died, or from outside. Record what happened to the process.
        found = classify_failure(tail)
        if found is not None:  # the log names it (a rank out of memory, a NCCL error, ...)
            cls, why = found[0], f"{how}: {found[1]}"
        elif rc < 0 and -rc in _STOP_SIGNALS:
            cls, why = "cancelled", f"{how}, not by dse; its ranks were ended with it"
        elif rc < 0:  # a crash (SIGSEGV, SIGABRT, ...)
            cls, why = "error", f"{how}; its ranks were ended with it"
        else:
            last = last_lines(tail)
            cls, why = (
                "interrupted",
                f"{how}, not stopped by dse; the trial: {out.reason}"
                + (f"; log: {last}" if last else ""),
            )
        return Outcome.failure(
            cls, f"{why} (after {len(out.steps)} steps)", metrics=out.metrics, steps=out.steps
        )

    def running(self) -> list[int]:
        if self.warm is not None:
            return self.warm.running()
        return list(self._procs)

    def stop(self) -> list[int]:
        if self.warm is not None:
            return self.warm.stop()
        ids = list(self._procs)
        for tid in ids:
            p = self._procs[tid]
            kill_process_group(p.popen, grace_s=3.0, tag=p.tag)
            p.log.close()  # type: ignore[attr-defined]
            self._free_gpus.extend(p.devices)
        self._procs.clear()
        return ids
