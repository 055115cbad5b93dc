"""Slurm runner: one batch job per trial, submitted with ``sbatch``, followed with ``squeue`` /
``scontrol show job``, cancelled with ``scancel``.

The batch script asks for the trial's nodes (``world_size / gpus_per_node``), GPUs per node and
a time limit, takes the rendezvous from its allocation (the first host of
``scontrol show hostnames $SLURM_JOB_NODELIST``) and starts the trial once per node with
``srun`` (``torchrun`` with a c10d rendezvous when the trial spans nodes), inside a pyxis/enroot
container when ``container_image`` is set. The trial writes its metrics into the study's work
directory, which must be on a file system every node shares; the controller reads them there.

A job that ends without a result comes back as a classified failure with the log's last lines
(``timeout``, ``node_fail``, ``preempted``, ``cancelled``, ``oom`` or the log's class), never as
an exception. ``sacct`` is not needed: job states come from ``squeue`` and, once a job left the
queue, from ``scontrol show job`` (kept for the controller's ``MinJobAge``).

A job the cluster can never start is cancelled and recorded ``unschedulable`` (infeasible for
this cluster) with Slurm's own words: sbatch refused it (its message), or Slurm holds it for a
reason that does not clear (:data:`NEVER_STARTS`, e.g. ``PartitionNodeLimit``). A job pending
past ``runner.options.queue_timeout_s`` is cancelled too: ``unschedulable`` when the nodes it
needs are unavailable (:data:`NOT_AVAILABLE`, e.g. ``ReqNodeNotAvail``), else ``timeout`` (the
cluster was busy: the configuration is not to blame).

The controller may itself run inside a Slurm job: the variables Slurm set for that job are
kept out of the trials' jobs (:func:`submission_env`).
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dse.core.envpolicy import IDENTIFIER
from dse.core.exceptions import SpaceError, TrialLaunchError
from dse.core.records import FailureClass, Outcome, TrialSpec, read_metrics
from dse.runners._base import BaseRunner, Finished, Launch, trial_environ
from dse.runners._cluster import (
    PLACEMENT_FILE,
    TrialShape,
    container_python,
    outcome_after_exit,
    read_placement,
    rendezvous_argv,
    runner_options,
    trial_device,
    trial_shape,
)
from dse.space.searchspace import SLURM_NAME, SLURM_TIME, SlurmOptions, slurm_option_problem
from dse.workloads import trial_command
from dse.workloads.launchers._core import shell_word

__all__ = [
    "SlurmOptions",
    "SlurmRunner",
    "make_runner",
    "render_batch_script",
    "failure_class_of_state",
    "pending_class",
    "submission_env",
    "JOB_ID_FILE",
    "NEVER_STARTS",
    "NOT_AVAILABLE",
]

#: The trial folder keeps its job id here (a resumed controller cancels leftover jobs).
JOB_ID_FILE = "slurm_job_id"

#: Slurm job states after which the job is gone for good.
TERMINAL_STATES = frozenset(
    {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
        "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
    }
)  # fmt: skip

_STATE_CLASS: dict[str, FailureClass] = {
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail",
    "PREEMPTED": "preempted",
    "CANCELLED": "cancelled",
    "REVOKED": "cancelled",
    "OUT_OF_MEMORY": "oom",
}


def _base(state: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``COMPLETED+`` -> ``COMPLETED``."""
    return (state.split() or [""])[0].rstrip("+")


def failure_class_of_state(state: str) -> FailureClass | None:
    """The failure class a terminal Slurm job state means (None: ask the log)."""
    return _STATE_CLASS.get(_base(state))


#: Pending reasons (squeue ``%r``) that do not clear while the cluster's configuration
#: stands: the job asks for more than the partition, the QOS or the association allows for
#: one job, or for something no node has. Such a job is cancelled at once.
NEVER_STARTS = frozenset(
    {
        "PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints",
        "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied", "ReservationDeleted",
    }
)  # fmt: skip
#: ... and the per-job limits of a QOS or an association (``QOSMaxGRESPerJob``,
#: ``AssocMaxNodesPerJobLimit``, ``QOSMinGRES``, ...).
_PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)\w*PerJob\w*$|^QOSMin\w+$")
#: Pending reasons that say the nodes the job needs are not available (down, drained,
#: reserved, a partition down): past the queue timeout the job is ``unschedulable``.
NOT_AVAILABLE = frozenset({"ReqNodeNotAvail", "NodeDown", "PartitionDown", "PartitionInactive"})


def pending_class(reason: str, *, timed_out: bool) -> FailureClass | None:
    """The failure class of a job still pending for ``reason`` (squeue's reason code);
    None while it may still start. ``timed_out``: it waited past the queue timeout."""
    code = reason.split(",")[0].strip()
    if code in NEVER_STARTS or _PER_JOB_LIMIT.match(code):
        return "unschedulable"
    if not timed_out:
        return None
    return "unschedulable" if code in NOT_AVAILABLE else "timeout"


#: sbatch messages that say Slurm could not be asked (not that it refused the job): the
#: runner cannot work now (a launch error, counted by the study loop), not the trial's fault.
_SBATCH_UNREACHABLE = re.compile(
    r"Unable to contact|Socket timed out|temporarily unable|Zero Bytes were transmitted"
    r"|Connection refused|Transport endpoint|Communication connection failure"
    r"|Resource temporarily unavailable|job submit limit",
    re.IGNORECASE,
)

#: Variables of the enclosing job that sbatch must still see (the client's configuration).
_KEEP_SLURM = frozenset({"SLURM_CONF"})


def submission_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``sbatch`` runs with. A controller inside a Slurm job of its own
    (``SLURM_JOB_ID`` set) would pass that job's ``SLURM_*`` variables (its memory and CPUs
    per task, its node list, ...) on to every trial job (``--export=ALL``), where ``srun``
    reads them as its own options; they are dropped (``SLURM_CONF`` stays). Outside a job the
    environment is passed on as it is, less the variables no trial inherits
    (:data:`~dse.runners._base.TRIAL_ENV_DROP`: the API token, the storage URL)."""
    env = trial_environ(environ)
    if "SLURM_JOB_ID" not in env:
        return env
    return {
        k: v
        for k, v in env.items()
        if not ((k.startswith("SLURM_") and k not in _KEEP_SLURM) or k.startswith("SRUN_"))
    }


def _time_limit(timeout_s: float) -> str:
    minutes = max(1, math.ceil((timeout_s + 120) / 60))
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _recipe(launch: Launch) -> dict[str, Any] | None:
    """The rendered recipe command of a launcher workload's trial (``workload.rendered`` of
    its spec), or None (a built-in workload, or a configuration the recipe cannot take)."""
    if launch.spec is None:
        return None
    r = launch.spec.workload.get("rendered")
    return r if isinstance(r, dict) and r.get("argv") else None


def _shell_words(argv: list[str]) -> str:
    """``argv`` as shell words, quoted, with the rendezvous placeholders left for the batch
    shell to expand (:func:`~dse.workloads.launchers._core.shell_word`)."""

    return " ".join(shell_word(a) for a in argv)


#: An sbatch option as written on an #SBATCH line: its name, then its value (if any).
_SBATCH_ARG = re.compile(r"(--[A-Za-z][A-Za-z0-9-]*)(?:=(.*))?", re.DOTALL)


def _sbatch_value(value: str, what: str) -> str:
    """``value`` as one word of an ``#SBATCH`` line, always double-quoted. sbatch reads the
    line itself (bash skips it as a comment) and takes ``"..."`` with ``\\`` escapes as one
    word, quotes removed (``--partition="batch"`` is ``--partition=batch``); a line break
    would end the comment and start a shell command, so a value with a control character is
    refused.

    Raises:
        TrialLaunchError: ``value`` holds a control character (names ``what``).
    """
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise TrialLaunchError(f"{what} must not contain control characters: {value!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sbatch_arg(arg: str, what: str) -> str:
    """An ``sbatch_args`` item on an ``#SBATCH`` line: ``--name`` as it is, the value of
    ``--name=value`` quoted (:func:`_sbatch_value`); anything else quoted as one word."""
    m = _SBATCH_ARG.fullmatch(arg)
    if m is None:
        return _sbatch_value(arg, what)
    name, value = m.groups()
    return name if value is None else f"{name}={_sbatch_value(value, what)}"


def _checked(opts: SlurmOptions, env: dict[str, str]) -> None:
    """Check again what goes into the script as shell text (the options model checks it on
    input; this catches options built without validation and the launch's own variables)."""
    problems = [
        f"runner.options.{k}: {why}"
        for k, vals in (("sbatch_args", opts.sbatch_args), ("srun_args", opts.srun_args))
        for v in vals
        if (why := slurm_option_problem(v))
    ]
    for k, v in (("partition", opts.partition), ("account", opts.account), ("qos", opts.qos)):
        if v is not None and not all(SLURM_NAME.fullmatch(p) for p in v.split(",")):
            problems.append(f"runner.options.{k}: {v!r} is not a Slurm name")
    if opts.time_limit is not None and not SLURM_TIME.fullmatch(opts.time_limit):
        problems.append(f"runner.options.time_limit: {opts.time_limit!r} is not a time limit")
    problems += [
        f"environment: {k!r} is not a variable name" for k in env if not IDENTIFIER.fullmatch(k)
    ]
    if problems:
        raise TrialLaunchError("; ".join(problems))


def _interpreter_check(launch: Launch, *, contained: bool) -> list[str]:
    """Lines that stop a trial at once, saying why, where the batch node lacks the
    controller's own interpreter (``runner.python`` unset): the path of the controller's
    virtual environment means something on a node only over a shared file system."""
    py = launch.argv[0] if launch.argv else ""
    if contained or py != sys.executable or not py.startswith("/"):
        return []  # runner.python names the nodes' interpreter; a container has its own
    q = shlex.quote
    say = q(
        f"dse: the trial's interpreter {py} (the controller's own; runner.python names "
        "the nodes' interpreter) is not on "
    )
    return [
        "# runner.python unset: the nodes run the controller's interpreter at the same path",
        f'[ -x {q(py)} ] || {{ echo {say}"$(hostname -s)" >&2; exit 2; }}',
        "",
    ]


def render_batch_script(
    launch: Launch,
    opts: SlurmOptions,
    shape: TrialShape,
    *,
    job_name: str,
    workdir: Path | None = None,
) -> str:
    """The batch script of one trial: the one place that writes a Slurm batch script (the
    runner submits it as it is; ``dse start --dry-run`` prints it).

    Built-in workloads: ``srun`` starts the trial process once per node (its ``torchrun``
    set for the allocation's rendezvous). A recipe launcher's trial (``launch.spec`` holds
    the rendered recipe): its node steps run once per node first, then ``srun`` starts the
    recipe's own command on every node, in the recipe's container image, under dse's trial
    process on the first node, which reads the recipe's output and writes the metrics (so
    the image needs no dse).
    """
    q = shlex.quote
    recipe = _recipe(launch)
    env = {**opts.env, **launch.env}
    _checked(opts, env)
    # tasks per node: 1 (torchrun starts the ranks), or one per GPU for a recipe that takes
    # its ranks from Slurm (NeMo: RenderedTrial.tasks_per_node)
    tasks = max(1, int((recipe or {}).get("tasks_per_node") or 1))
    sb: list[str] = [
        f"--job-name={_sbatch_value(job_name, 'the job name')}",
        f"--nodes={shape.nodes}",
        f"--ntasks-per-node={tasks}",
    ]
    if shape.gpus_per_node:
        sb.append(f"--gpus-per-node={shape.gpus_per_node}")
    if opts.cpus_per_task:
        sb.append(f"--cpus-per-task={opts.cpus_per_task}")
    time_limit = opts.time_limit or _time_limit(launch.timeout_s)
    sb.append(f"--time={_sbatch_value(time_limit, 'runner.options.time_limit')}")
    if opts.exclusive if opts.exclusive is not None else shape.device == "cuda":
        sb.append("--exclusive")
    for flag, val in (("partition", opts.partition), ("account", opts.account), ("qos", opts.qos)):
        if val:
            sb.append(f"--{flag}={_sbatch_value(val, f'runner.options.{flag}')}")
    sb += [
        f"--output={_sbatch_value(str(launch.log_path), 'the trial log path')}",
        "--open-mode=append",
        "--no-requeue",
        f"--chdir={_sbatch_value(str(launch.trial_dir), 'the trial folder')}",
    ]
    sb += [_sbatch_arg(a, "runner.options.sbatch_args") for a in opts.sbatch_args]
    lines = ["#!/bin/bash", *(f"#SBATCH {a}" for a in sb), ""]
    what = f" ({recipe['launcher']} recipe)" if recipe else ""
    lines.append(
        f"# dse trial {launch.number}{what}: {shape.nodes} node(s) x {shape.per_node} rank(s)"
    )
    lines.append("set -uo pipefail")
    lines += [f"export {k}={q(v)}" for k, v in env.items()]
    lines += [
        'NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        'export MASTER_ADDR="${NODES[0]}"',
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        'echo "dse: job $SLURM_JOB_ID on ${NODES[*]}, rendezvous $MASTER_ADDR:$MASTER_PORT"',
        "",
    ]
    lines += _interpreter_check(launch, contained=bool(
        ((recipe or {}).get("container_image") or opts.container_image) and recipe is None
    ))  # fmt: skip
    srun = [
        "srun",
        f"--nodes={shape.nodes}",
        f"--ntasks={shape.nodes * tasks}",
        f"--ntasks-per-node={tasks}",
        "--kill-on-bad-exit=1",
        "--label" if shape.nodes > 1 else "",
    ]
    srun = [a for a in srun if a]
    if shape.gpus_per_node:  # the step's own GPUs, whatever the site's step defaults are
        srun.append(f"--gpus-per-node={shape.gpus_per_node}")
    image = (recipe or {}).get("container_image") or opts.container_image
    if image:
        mounts = list(opts.container_mounts)
        if workdir is not None:
            mounts.insert(0, f"{workdir}:{workdir}")
        srun.append(f"--container-image={q(image)}")
        if mounts:
            srun.append(f"--container-mounts={q(','.join(mounts))}")
        srun.append(f"--container-workdir={q(str(launch.trial_dir))}")
    srun += [q(a) for a in opts.srun_args]
    # each node notes where it runs (node name, its GPUs), then becomes the trial
    note = (
        'echo "$(hostname -s) ${CUDA_VISIBLE_DEVICES:-}" >> '
        + q(str(launch.trial_dir / PLACEMENT_FILE))
        + '; exec "$@"'
    )
    if recipe is not None:
        names = list(recipe.get("node_step_names") or [])
        per_node = [  # node steps: once per node, whatever the recipe's tasks per node
            f"--ntasks={shape.nodes}" if a.startswith("--ntasks=")
            else "--ntasks-per-node=1" if a.startswith("--ntasks-per-node=") else a
            for a in srun
        ]  # fmt: skip
        for name, step in zip(names, recipe.get("node_steps") or [], strict=False):
            cmd = f'{shlex.join(step)} || echo "dse: node step {name} not permitted here; skipped"'
            lines.append(f"{' '.join(per_node)} bash -c {q(cmd)}")
        trial = " ".join(q(a) for a in launch.argv)
        lines.append(
            " \\\n  ".join(
                [
                    f"{trial} --node-steps-done --",
                    " ".join(srun),
                    f"bash -c {q(note)} dse-trial",
                    _shell_words(
                        container_python(list(recipe["argv"])) if image else recipe["argv"]
                    ),
                ]
            )
        )
        lines.append("")
        return "\n".join(lines)
    argv = container_python(list(launch.argv)) if image else list(launch.argv)
    argv = rendezvous_argv(
        argv, shape, master_addr="__ADDR__", master_port="__PORT__", run_id="__RUNID__"
    )
    cmd = " ".join(q(a) for a in argv)
    cmd = (
        cmd.replace("__ADDR__", '"$MASTER_ADDR"')
        .replace("__PORT__", '"$MASTER_PORT"')
        .replace("__RUNID__", '"$SLURM_JOB_ID"')
    )
    lines.append(" \\\n  ".join([" ".join(srun), f"bash -c {q(note)} dse-trial", cmd]))
    lines.append("")
    return "\n".join(lines)


def _run(
    cmd: list[str], timeout: float = 30.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@dataclass
class _Job:
    launch: Launch
    job_id: str
    submitted: float
    started: float | None = None
    state: str = "PENDING"
    reason: str = ""
    nodes: str = ""
    last_size: int = 0
    last_progress: float = 0.0
    killed_for: Outcome | None = None


class SlurmRunner(BaseRunner):
    """Submits each trial as one batch job; ``max_parallel`` jobs at once (queued or running)."""

    name = "slurm"

    def __init__(
        self,
        options: SlurmOptions,
        *,
        device: str,
        world_size: int,
        gpus_per_node: int | None = None,
        max_parallel: int | None = None,
        workdir: Path | None = None,
        job_prefix: str = "dse",
    ) -> None:
        for tool in ("sbatch", "squeue", "scontrol", "scancel"):
            if shutil.which(tool) is None:
                raise TrialLaunchError(
                    f"the slurm runner needs {tool!r} on PATH (run the controller on a login "
                    "node or inside a Slurm job)"
                )
        self.opts = options
        self.device = device
        try:
            shape = trial_shape(world_size, device, options.gpus_per_node or gpus_per_node)
        except ValueError as e:
            raise TrialLaunchError(str(e)) from e
        if options.nodes and device == "cuda" and options.nodes != shape.nodes:
            raise TrialLaunchError(
                f"runner.options.nodes={options.nodes} but world_size {world_size} over "
                f"{shape.per_node} GPUs per node needs {shape.nodes} node(s)"
            )
        self.shape = shape
        self.slots = max_parallel or 1
        self.workdir = workdir
        self.job_prefix = job_prefix
        self._jobs: dict[int, _Job] = {}
        self._done: list[Finished] = []
        self._last_poll = 0.0

    # --- contract --------------------------------------------------------------------------
    def free_slots(self) -> int:
        return self.slots - len(self._jobs)

    def script(self, launch: Launch) -> str:
        return render_batch_script(
            launch,
            self.opts,
            self.shape,
            job_name=f"{self.job_prefix}-{launch.number}",
            workdir=self.workdir,
        )

    def submit(self, launch: Launch) -> None:
        launch.trial_dir.mkdir(parents=True, exist_ok=True)
        (launch.trial_dir / PLACEMENT_FILE).unlink(missing_ok=True)
        path = launch.trial_dir / "job.sbatch"
        path.write_text(self.script(launch))
        try:
            r = _run(["sbatch", "--parsable", str(path)], timeout=60, env=submission_env())
        except (OSError, subprocess.SubprocessError) as e:
            raise TrialLaunchError(f"sbatch failed for trial {launch.number}: {e}") from e
        if r.returncode != 0:
            msg = " | ".join(ln.strip() for ln in r.stderr.strip().splitlines()[-3:])[-400:]
            if _SBATCH_UNREACHABLE.search(msg) or not msg:
                raise TrialLaunchError(
                    f"sbatch failed for trial {launch.number} ({path}): {msg or 'no message'}"
                )
            # the job as asked cannot be submitted to this cluster: the trial's failure
            reason = f"sbatch refused the job ({path.name}): {msg}"
            self._done.append(
                Finished(launch.trial_id, Outcome.failure("unschedulable", reason), 0.0, 0)
            )
            return
        job_id = r.stdout.strip().split(";")[0]
        (launch.trial_dir / JOB_ID_FILE).write_text(job_id)
        now = time.monotonic()
        self._jobs[launch.trial_id] = _Job(launch, job_id, now, last_progress=now)

    def running(self) -> list[int]:
        return list(self._jobs)

    def poll(self) -> list[Finished]:
        now = time.monotonic()
        if self._jobs and now - self._last_poll >= self.opts.poll_interval_s:
            self._last_poll = now
            states = self._states([j.job_id for j in self._jobs.values()])
            for tid, job in list(self._jobs.items()):
                st = states.get(job.job_id)
                if st is not None:
                    job.state, nodes, job.reason = st
                    job.nodes = nodes or job.nodes
                self._check(tid, job, now)
        done, self._done = self._done, []
        return done

    def stop(self) -> list[int]:
        ids = list(self._jobs)
        if ids:
            self._cancel([j.job_id for j in self._jobs.values()])
            deadline = time.monotonic() + 30
            pending = {j.job_id for j in self._jobs.values()}
            while pending and time.monotonic() < deadline:
                states = self._states(sorted(pending))
                pending = {
                    jid
                    for jid in pending
                    if jid in states
                    and states[jid][0].split()[0].rstrip("+") not in TERMINAL_STATES
                }
                if pending:
                    time.sleep(0.5)
        self._jobs.clear()
        return ids

    def kill_leftover(self, trial_dir: Path, owner: str) -> bool:
        """Cancel the job of a trial left behind by a dead controller (Slurm cancels only
        the jobs of the submitting user)."""
        try:
            job_id = (trial_dir / JOB_ID_FILE).read_text().strip()
        except OSError:
            return False
        if not job_id.isdigit():
            return False
        self._cancel([job_id])
        return True

    # --- internals -------------------------------------------------------------------------
    def _check(self, tid: int, job: _Job, now: float) -> None:
        launch = job.launch
        state = _base(job.state)
        if state == "RUNNING" and job.started is None:
            job.started = now
            job.last_progress = now
        if state in TERMINAL_STATES:
            self._finish(tid, self._outcome(job, state))
            return
        if job.started is None:
            if state == "PENDING":
                self._check_pending(tid, job, now)
            return
        mp = launch.metrics_path
        size = mp.stat().st_size if mp.exists() else 0
        if size != job.last_size:
            job.last_size, job.last_progress = size, now
        if now - job.started > launch.timeout_s:
            reason = f"trial ran past its timeout of {launch.timeout_s:.0f} s"
            self._kill(tid, job, read_metrics(mp) or Outcome.failure("timeout", reason))
        elif now - job.last_progress > launch.hang_timeout_s:
            reason = f"no progress for {launch.hang_timeout_s:.0f} s (hang timeout)"
            self._kill(tid, job, read_metrics(mp) or Outcome.failure("hang", reason))

    def _check_pending(self, tid: int, job: _Job, now: float) -> None:
        """Cancel a pending job that will never start, or that waited past the queue
        timeout, recording Slurm's reason."""
        limit = self.opts.queue_timeout_s
        waited = now - job.submitted
        timed_out = limit is not None and waited > limit
        cls = pending_class(job.reason, timed_out=timed_out)
        if cls is None:
            return
        reason = job.reason or "None"
        if timed_out:
            why = (
                f"slurm job {job.job_id} still pending after {waited:.0f} s "
                f"(runner.options.queue_timeout_s {limit:g}); Slurm's reason: {reason}"
            )
        else:
            why = f"slurm job {job.job_id} can never start here; Slurm's reason: {reason}"
        self._kill(tid, job, Outcome.failure(cls, f"{why}; cancelled"))

    def _kill(self, tid: int, job: _Job, outcome: Outcome) -> None:
        self._cancel([job.job_id])
        self._finish(tid, outcome)

    def _outcome(self, job: _Job, state: str) -> Outcome:
        where = f" on {job.nodes}" if job.nodes else ""
        what = f"slurm job {job.job_id} ended {state}{where}"
        return outcome_after_exit(job.launch, failure_class_of_state(state), what)

    def _finish(self, tid: int, outcome: Outcome) -> None:
        job = self._jobs.pop(tid)
        wall = time.monotonic() - (job.started or job.submitted)
        ndev = self.shape.nodes * (self.shape.gpus_per_node or self.shape.per_node)
        placement = read_placement(job.launch.trial_dir) or (job.nodes or None)
        self._done.append(Finished(tid, outcome, wall, ndev, placement=placement))

    def _states(self, job_ids: list[str]) -> dict[str, tuple[str, str, str]]:
        """job id -> (state, node list, pending reason) for the given jobs (queue first,
        then scontrol)."""
        out: dict[str, tuple[str, str, str]] = {}
        try:
            r = _run(
                ["squeue", "-h", "--states=all", "-j", ",".join(job_ids), "-o", "%i|%T|%N|%r"]
            )
            for line in r.stdout.splitlines():
                parts = line.strip().split("|")
                if len(parts) == 4:
                    out[parts[0]] = (parts[1], parts[2], parts[3])
        except (OSError, subprocess.SubprocessError):
            pass
        for jid in job_ids:
            if jid not in out:
                st = _scontrol_state(jid)
                if st is not None:
                    out[jid] = st
        return out

    def _cancel(self, job_ids: list[str]) -> None:
        try:
            _run(["scancel", *job_ids])
        except (OSError, subprocess.SubprocessError):
            pass


def _scontrol_state(job_id: str) -> tuple[str, str, str] | None:
    """(JobState, NodeList, Reason) from ``scontrol show job``; a job unknown to Slurm
    (purged after ``MinJobAge``) is taken as ended (FAILED: its metrics file decides)."""
    try:
        r = _run(["scontrol", "-o", "show", "job", job_id])
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        if "Invalid job id" in r.stderr:
            return ("FAILED", "", "")
        return None
    fields = dict(
        tok.split("=", 1) for tok in r.stdout.split() if "=" in tok and not tok.startswith("=")
    )
    state = fields.get("JobState", "")
    if not state:
        return None
    nodes = fields.get("NodeList", "")
    return (state, "" if nodes == "(null)" else nodes, fields.get("Reason", ""))


def slurm_options(space: Any) -> SlurmOptions:
    """The space's ``runner.options`` as slurm options."""
    return runner_options(space, SlurmOptions, "slurm")


def make_runner(space: Any) -> SlurmRunner:
    opts = slurm_options(space)
    device = trial_device(space)
    return SlurmRunner(
        opts,
        device=device,
        world_size=space.resources.world_size,
        gpus_per_node=space.resources.gpus_per_node,
        max_parallel=space.runner.max_parallel,
        workdir=(Path(space.runner.workdir) / space.study).resolve(),
        job_prefix=f"dse-{space.study}"[:40],
    )


def dry_run_script(space: Any, number: int, env: dict[str, str], workload: dict[str, Any]) -> str:
    """The batch script trial ``number`` of ``space`` is submitted with (``dse start
    --dry-run``): the runner's own script, with the trial's environment ``env`` and its spec's
    ``workload`` (a recipe's rendered command). It starts the trial from the ``trial.json``
    the controller writes into the trial's folder before it submits."""

    opts = slurm_options(space)
    device = trial_device(space)
    try:
        shape = trial_shape(
            space.resources.world_size, device, opts.gpus_per_node or space.resources.gpus_per_node
        )
    except ValueError as e:
        raise SpaceError(str(e)) from e
    workdir = Path(space.runner.workdir).resolve() / space.study
    tdir = workdir / f"trial-{number:05d}"
    argv = trial_command(
        space.workload.name, str(tdir / "trial.json"),
        world_size=space.resources.world_size, python=space.runner.python,
    )  # fmt: skip
    spec = TrialSpec(
        study=space.study, trial_number=number, params={}, model=space.model.model_dump(),
        semantics=space.semantics.model_dump(), world_size=space.resources.world_size,
        device=space.resources.device, metrics_path=str(tdir / "metrics.jsonl"),
        workload=workload,
    )  # fmt: skip
    launch = Launch(
        trial_id=number, number=number, argv=argv, trial_dir=tdir,
        metrics_path=tdir / "metrics.jsonl", log_path=tdir / "log.txt",
        world_size=space.resources.world_size, device=device,
        timeout_s=space.budget.trial_timeout_s, env=dict(env), spec=spec,
    )  # fmt: skip
    return render_batch_script(
        launch, opts, shape, job_name=f"dse-{space.study}"[:40] + f"-{number}", workdir=workdir
    )
