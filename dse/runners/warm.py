"""Warm trial workers of the local runner: one long-lived worker process per slot
(``dse.workloads.megatron.worker``) that runs one-rank trials one after another.

A trial process spends its first seconds on what is the same for every trial (interpreter
start, importing torch and megatron-core, device and process-group set-up, the first
compilation of fused kernels); a warm worker pays that once. Isolation stays what it is with a
process per trial:

* a worker leaves after a trial that failed in any way, after a trial that left its memory
  above its baseline, and after ``max_trials`` trials (it says why; the runner records it in
  ``<workdir>/workers/events.jsonl``), and the runner starts another;
* a timeout, a hang or a stop kills the worker's whole process group, as it kills a trial
  process's, and the trial ends classified (its metrics file, else its log);
* a worker dies with the controller (``PR_SET_PDEATHSIG``) and at the end of its input.

What needs no GPU overlaps with what does: a spare worker per slot (``spare``) is started
while the slot's worker runs trials, so that a recycle costs no start-up; a trial counts as
finished as soon as its final metrics line is written, so that the controller records it and
proposes the next one while the worker frees the last trial's memory (the next job waits in
the worker's input).

The protocol (JSON lines: jobs on the worker's stdin, replies on a pipe) is described in
:mod:`dse.workloads.megatron.worker`; this module never imports it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dse.core.exceptions import TrialLaunchError
from dse.core.records import Outcome, read_metrics
from dse.runners._base import (
    OWNER_ENV,
    Finished,
    Launch,
    classify_log,
    compile_cache_env,
    log_tail,
)

__all__ = ["WarmSettings", "WarmPool", "WORKER_MODULE"]

#: The worker's module (run as ``python -m``).
WORKER_MODULE = "dse.workloads.megatron.worker"
#: Seconds a worker may take to free a finished trial before it is killed and replaced.
RELEASE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class WarmSettings:
    """How the local runner keeps its warm workers (``runner.options`` of the space)."""

    python: str
    workdir: Path
    spare: bool = False
    max_trials: int = 50
    memory_slack_mib: float = 512.0
    #: the environment the first workers start with (a trial with another one gets a fresh
    #: worker): the space's trial environment of its baseline
    env: dict[str, str] = field(default_factory=dict)


class _Worker:
    """One worker process: its input (jobs), its reply pipe and what it said."""

    def __init__(
        self, argv: list[str], env: dict[str, str], launch_env: dict[str, str], log: Path
    ) -> None:
        read_fd, write_fd = os.pipe()
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log
        logf = open(log, "ab")  # noqa: SIM115 - closed in kill()
        try:
            self.popen: subprocess.Popen[bytes] = subprocess.Popen(
                [*argv, "--reply-fd", str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=log.parent,
                start_new_session=True,
                pass_fds=(write_fd,),
            )
        except OSError as e:
            os.close(read_fd)
            logf.close()
            raise TrialLaunchError(f"cannot start a warm worker {argv[0]!r}: {e}") from e
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._logf = logf
        self._reply = read_fd
        self._buf = b""
        self.launch_env = dict(launch_env)
        self.spawned = time.monotonic()
        self.ready_at: float | None = None
        self.trials = 0  # jobs it acknowledged
        self.draining: int | None = None  # seq of a reported trial it is still freeing
        self.drain_since = 0.0
        self.exit_reason: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def ready(self) -> bool:
        return self.ready_at is not None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, job: dict[str, Any]) -> bool:
        """Queue a job in the worker's input; False when the worker is gone."""
        stdin = self.popen.stdin
        if stdin is None:
            return False
        try:
            stdin.write((json.dumps(job) + "\n").encode())
            stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def replies(self) -> list[dict[str, Any]]:
        """Replies that arrived since the last call."""
        while True:
            try:
                chunk = os.read(self._reply, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            if not chunk:
                break
            self._buf += chunk
        out: list[dict[str, Any]] = []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                out.append(msg)
        return out

    def close_input(self) -> None:
        stdin = self.popen.stdin
        if stdin is not None:
            try:
                stdin.close()
            except OSError:
                pass

    def kill(self, grace_s: float = 2.0) -> None:
        """End the worker's whole process group (SIGTERM, then SIGKILL) and reap it."""
        self.close_input()
        pgid = self.popen.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()
        self.release_fds()

    def release_fds(self) -> None:
        if self._reply >= 0:
            os.close(self._reply)
            self._reply = -1
        self._logf.close()


@dataclass
class _Trial:
    launch: Launch
    seq: int
    started: float
    last_progress: float
    last_size: int = 0
    #: pid of the worker that acknowledged it (None: still in a worker's input)
    worker_pid: int | None = None
    trial_in_worker: int = 0
    waited_for_worker_s: float = 0.0


@dataclass
class _Slot:
    index: int
    devices: list[int]
    worker: _Worker | None = None
    spare: _Worker | None = None
    trial: _Trial | None = None
    spawned: int = 0


class WarmPool:
    """The warm workers of a local runner's slots (see the module doc).

    Args:
        slots: the devices of each slot (``[[0], [1]]`` on two GPUs; ``[[], ...]`` on CPU).
        device: ``cuda`` or ``cpu``.
        base_env: the environment every worker starts from (the runner's, without what a
            trial never inherits).
        host: this machine's name (for the trials' GPU slot labels).
    """

    def __init__(
        self,
        settings: WarmSettings,
        *,
        slots: list[list[int]],
        device: str,
        base_env: dict[str, str],
        host: str,
    ) -> None:
        self.settings = settings
        self.device = device
        self.base_env = base_env
        self.host = host
        self.slots = [_Slot(i, list(d)) for i, d in enumerate(slots)]
        self.workers_dir = settings.workdir / "workers"
        self._seq = 0
        self._done: list[Finished] = []

    # --- workers -----------------------------------------------------------------------------
    def _event(self, **rec: Any) -> None:
        try:
            self.workers_dir.mkdir(parents=True, exist_ok=True)
            with open(self.workers_dir / "events.jsonl", "a") as f:
                f.write(json.dumps({"t": time.time(), **rec}) + "\n")
        except OSError:
            pass

    def _spawn(self, slot: _Slot, launch_env: dict[str, str], spare: bool = False) -> _Worker:
        s = self.settings
        env = dict(self.base_env)
        env.update(launch_env)
        env.update(compile_cache_env(s.workdir, self.host, env))  # the study's, per node
        threads = max(1, (os.cpu_count() or 1) // max(1, len(self.slots)))
        env.setdefault("OMP_NUM_THREADS", str(threads))
        if self.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot.devices))
        argv = [
            s.python, "-m", WORKER_MODULE, "--device", self.device,
            "--parent", str(os.getpid()), "--max-trials", str(s.max_trials),
            "--memory-slack-mib", str(s.memory_slack_mib),
        ]  # fmt: skip
        if spare:  # no device memory until it takes a trial (the slot's trials have it all)
            argv.append("--defer-device")
        slot.spawned += 1
        log = self.workers_dir / f"slot{slot.index}-{slot.spawned:03d}.log"
        w = _Worker(argv, env, launch_env, log)
        self._event(event="spawn", slot=slot.index, pid=w.pid, log=log.name, spare=spare)
        return w

    def prepare(self, owner: str) -> None:
        """Start every slot's worker with the expected trial environment."""
        env = {**self.settings.env, OWNER_ENV: owner}
        for slot in self.slots:
            if slot.worker is None:
                slot.worker = self._spawn(slot, env)

    def _retire(self, slot: _Slot, why: str, grace_s: float = 2.0) -> None:
        """Kill the slot's worker (its whole process group) and promote the spare."""
        w = slot.worker
        if w is not None:
            w.kill(grace_s=grace_s)
            self._event(event="recycle", slot=slot.index, pid=w.pid, why=why,
                        trials=w.trials)  # fmt: skip
        slot.worker = None
        if slot.spare is not None and slot.spare.alive():
            slot.worker, slot.spare = slot.spare, None
        elif slot.spare is not None:
            slot.spare.kill(grace_s=0.5)
            slot.spare = None

    def _ensure_worker(self, slot: _Slot, launch_env: dict[str, str]) -> _Worker:
        """The slot's worker for a trial with ``launch_env``: the current one, else the
        spare, else a fresh one (a worker that started with another environment or is gone
        is retired)."""

        def fits(w: _Worker | None) -> bool:
            return w is not None and w.alive() and w.launch_env == launch_env

        if fits(slot.worker):
            assert slot.worker is not None
            return slot.worker
        if slot.worker is not None:
            gone = not slot.worker.alive()
            self._retire(slot, "exited" if gone else "the trial's environment differs", 0.5)
        if not fits(slot.worker) and slot.worker is not None:
            self._retire(slot, "the trial's environment differs", 0.5)
        if slot.worker is None:
            slot.worker = self._spawn(slot, launch_env)
        return slot.worker

    # --- the runner's calls ------------------------------------------------------------------
    def free_slots(self) -> int:
        return sum(1 for s in self.slots if s.trial is None)

    def running(self) -> list[int]:
        return [s.trial.launch.trial_id for s in self.slots if s.trial is not None]

    def submit(self, launch: Launch) -> None:
        slot = next((s for s in self.slots if s.trial is None), None)
        if slot is None:
            raise RuntimeError("submit() called without a free slot")
        try:
            launch.trial_dir.mkdir(parents=True, exist_ok=True)
            with open(launch.log_path, "ab"):
                pass
        except OSError as e:
            raise TrialLaunchError(
                f"trial {launch.number}: cannot write {launch.log_path}: {e}"
            ) from e
        w = self._ensure_worker(slot, dict(launch.env))
        self._seq += 1
        now = time.monotonic()
        slot.trial = _Trial(launch, self._seq, now, now)
        owner = launch.env.get(OWNER_ENV, "")
        (launch.trial_dir / "pgid").write_text(json.dumps({"pgid": w.pid, "owner": owner}))
        if not w.send(self._job(slot.trial)):
            self._retire(slot, "its input is closed", grace_s=0.5)
            self._resend(slot)

    def _job(self, t: _Trial) -> dict[str, Any]:
        d = t.launch.trial_dir
        return {"seq": t.seq, "spec": str(d / "trial.json"), "log": str(t.launch.log_path),
                "cwd": str(d)}  # fmt: skip

    def _resend(self, slot: _Slot) -> None:
        """Give the slot's unacknowledged trial to its (new) worker."""
        t = slot.trial
        if t is None or t.worker_pid is not None:
            return
        w = self._ensure_worker(slot, dict(t.launch.env))
        d = t.launch.trial_dir
        (d / "pgid").write_text(
            json.dumps({"pgid": w.pid, "owner": t.launch.env.get(OWNER_ENV, "")})
        )
        if not w.send(self._job(t)):
            self._retire(slot, "its input is closed", grace_s=0.5)
            self._finish(slot, Outcome.failure("error", "no warm worker could take the trial"))

    def _finish(self, slot: _Slot, outcome: Outcome) -> None:
        t = slot.trial
        if t is None:
            return
        slot.trial = None
        labels = tuple(f"{self.host}:{g}" for g in slot.devices)
        info = {"warm": True, "pid": t.worker_pid, "trial_in_worker": t.trial_in_worker,
                "waited_for_worker_s": round(t.waited_for_worker_s, 3)}  # fmt: skip
        ndev = len(slot.devices) or t.launch.world_size
        self._done.append(
            Finished(
                t.launch.trial_id,
                outcome,
                time.monotonic() - t.started,
                ndev,
                gpu_slots=labels,
                worker=info,
            )
        )

    def poll(self) -> list[Finished]:
        now = time.monotonic()
        for slot in self.slots:
            self._poll_slot(slot, now)
        done, self._done = self._done, []
        return done

    def _poll_slot(self, slot: _Slot, now: float) -> None:
        w = slot.worker
        if w is not None:
            for msg in w.replies():
                self._on_reply(slot, w, msg, now)
        if slot.spare is not None:
            for msg in slot.spare.replies():
                if msg.get("event") == "ready":
                    slot.spare.ready_at = now
            if not slot.spare.alive():
                slot.spare.kill(grace_s=0.1)
                self._event(event="spare_exited", slot=slot.index, pid=slot.spare.pid)
                slot.spare = None
        w = slot.worker
        t = slot.trial
        if w is not None and not w.alive() and slot.worker is w:
            # the worker is gone: its trial (if it had taken one) ends classified; one it had
            # not taken goes to the next worker
            w.replies()
            rc = w.popen.returncode
            if t is not None and t.worker_pid == w.pid:
                self._finish(slot, self._outcome_after_exit(t, rc))
            elif t is not None and not w.ready:
                # it could not start: the trial fails with the worker's own words (no
                # endless restarts; the next trial gets a fresh worker)
                tail = log_tail(w.log_path).strip().splitlines()
                self._finish(slot, Outcome.failure(
                    "error", f"the warm worker exited with code {rc} before it was ready: "
                    f"{(tail[-1] if tail else '')[-300:]}"))  # fmt: skip
            self._retire(slot, f"exited with code {rc}", grace_s=0.2)
            if slot.trial is not None:
                self._resend(slot)
            w = slot.worker
        if w is not None and w.draining is not None and now - w.drain_since > RELEASE_TIMEOUT_S:
            self._retire(slot, f"did not free its trial within {RELEASE_TIMEOUT_S:.0f} s")
            self._resend(slot)
        if (
            self.settings.spare
            and slot.spare is None
            and slot.worker is not None
            and slot.worker.ready
        ):
            slot.spare = self._spawn(slot, slot.worker.launch_env, spare=True)
        t = slot.trial
        if t is None:
            return
        mp = t.launch.metrics_path
        size = mp.stat().st_size if mp.exists() else 0
        if size != t.last_size:
            t.last_size, t.last_progress = size, now
            out = read_metrics(mp)
            if out is not None:  # the final line: the trial is over; the worker frees it
                if slot.worker is not None and t.worker_pid == slot.worker.pid:
                    slot.worker.draining, slot.worker.drain_since = t.seq, now
                self._finish(slot, out)
                return
        if now - t.started > t.launch.timeout_s:
            self._kill_trial(
                slot,
                Outcome.failure(
                    "timeout", f"trial ran past its timeout of {t.launch.timeout_s:.0f} s"
                ),
                "the trial ran past its timeout",
            )
        elif now - t.last_progress > t.launch.hang_timeout_s:
            self._kill_trial(
                slot,
                Outcome.failure(
                    "hang", f"no progress for {t.launch.hang_timeout_s:.0f} s (hang timeout)"
                ),
                "the trial hung",
            )

    def _on_reply(self, slot: _Slot, w: _Worker, msg: dict[str, Any], now: float) -> None:
        ev = msg.get("event")
        t = slot.trial
        if ev == "ready":
            w.ready_at = now
            self._event(
                event="ready",
                slot=slot.index,
                pid=w.pid,
                init_s=msg.get("init_s"),
                baseline_mib=msg.get("baseline_mib"),
            )
        elif ev == "started":
            w.trials += 1
            if t is not None and msg.get("seq") == t.seq:
                t.worker_pid = w.pid
                t.trial_in_worker = w.trials
                t.waited_for_worker_s = max(0.0, (w.ready_at or now) - t.started)
        elif ev == "done":
            seq = msg.get("seq")
            if w.draining == seq:
                w.draining = None
            if t is not None and seq == t.seq:
                out = read_metrics(t.launch.metrics_path) or Outcome.failure(
                    "error", "the warm worker ended the trial without a result"
                )
                self._finish(slot, out)
            recycle = msg.get("recycle")
            if recycle:
                self._retire(slot, str(recycle), grace_s=5.0)
                self._resend(slot)
            else:
                self._event(
                    event="released",
                    slot=slot.index,
                    pid=w.pid,
                    memory_mib=msg.get("memory_mib"),
                    release_s=msg.get("release_s"),
                    release=msg.get("release"),
                )

    def _outcome_after_exit(self, t: _Trial, rc: int | None) -> Outcome:
        out = read_metrics(t.launch.metrics_path)
        if out is not None:
            return out
        tail = log_tail(t.launch.log_path)
        last = tail.strip().splitlines()[-1] if tail.strip() else ""
        return Outcome.failure(
            classify_log(tail),
            f"the warm worker exited with code {rc} without a result: {last[-300:]}",
        )

    def _kill_trial(self, slot: _Slot, failure: Outcome, why: str) -> None:
        t = slot.trial
        assert t is not None
        self._retire(slot, why, grace_s=5.0)
        self._finish(slot, read_metrics(t.launch.metrics_path) or failure)

    def stop(self) -> list[int]:
        """Kill every worker (whole process groups); the ids of the trials they had."""
        ids = self.running()
        for slot in self.slots:
            slot.trial = None
            for w in (slot.worker, slot.spare):
                if w is not None:
                    w.kill(grace_s=3.0)
                    self._event(event="stopped", slot=slot.index, pid=w.pid)
            slot.worker = slot.spare = None
        return ids

    def close(self) -> None:
        """End the idle workers: their input is closed (they leave), then their groups are
        killed."""
        workers = [w for s in self.slots for w in (s.worker, s.spare) if w is not None]
        for w in workers:
            w.close_input()
        deadline = time.monotonic() + 5.0
        for w in workers:
            try:
                w.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            w.kill(grace_s=0.5)
        for s in self.slots:
            s.worker = s.spare = None

    def pids(self) -> list[int]:
        """Pids of the live workers (tests, benchmarks)."""
        return [w.pid for s in self.slots for w in (s.worker, s.spare) if w is not None]
