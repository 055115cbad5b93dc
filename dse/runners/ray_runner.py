"""Ray runner: each trial in a placement group of its own, one bundle per node.

With no ``address`` the runner uses the Ray instance this process already joined, or starts a
local one; with an address it joins that cluster. A trial's bundles each hold the GPUs it needs
on one node (``world_size / gpus_per_node`` bundles); one Ray task per bundle starts the
trial's processes on that node (their own process group, ``CUDA_VISIBLE_DEVICES`` as Ray set it
for the task), with the rendezvous of the first bundle's node. Metrics come back through the
study's work directory (a file system the nodes share). ``stop`` and timeouts kill every
process group of the trial, then free its placement group.

As many trials run at once as the cluster has room for (GPUs, or CPUs for CPU trials), capped
by ``max_parallel``.

A trial whose placement group Ray finds infeasible (a bundle no node can hold: more GPUs than
a node has, more nodes than the cluster has) is recorded ``unschedulable`` with Ray's
scheduling state at once; one still waiting for room past ``runner.options.queue_timeout_s``
is recorded ``timeout``. Neither hangs the study.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dse.core.envpolicy import check_env
from dse.core.exceptions import TrialLaunchError
from dse.core.records import Outcome, read_metrics
from dse.runners._base import BaseRunner, Finished, Launch, trial_environ
from dse.runners._cluster import (
    PLACEMENT_FILE,
    TrialShape,
    outcome_after_exit,
    read_placement,
    rendezvous_argv,
    runner_options,
    trial_device,
    trial_shape,
)
from dse.space.searchspace import RayOptions
from dse.workloads.procgroup import TRIAL_TAG_ENV, kill_trial, new_trial_tag

__all__ = ["RayOptions", "RayRunner", "make_runner"]


_MASTER = "__DSE_MASTER_ADDR__"


def _where() -> tuple[str, str]:
    """Ray task: this node's host name and address (the rendezvous of a trial's first node)."""
    import socket

    import ray

    return socket.gethostname(), ray.util.get_node_ip_address()


def _run_node(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    log_path: str,
    index: int,
    controller: str,
    master: tuple[str, str],
) -> int:
    """Ray task: start the trial's processes of bundle ``index`` (a process group of their
    own, rendezvous at ``master``), wait for them, return their exit code."""
    import socket

    d = Path(cwd)
    if (d / f"killed.{index}").exists():
        return -int(signal.SIGTERM)
    full = trial_environ()  # the worker's, less the API token and storage URL
    full.update({k: v.replace(_MASTER, master[1]) for k, v in env.items()})
    argv = [a.replace(_MASTER, master[1]) for a in argv]
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    with open(d / PLACEMENT_FILE, "a") as f:
        f.write(f"{socket.gethostname()} {gpus}\n")
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=full, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
    (d / f"pgid.{index}").write_text(str(popen.pid))
    if index == 0 and socket.gethostname() == controller:
        (d / "pgid").write_text(str(popen.pid))  # a resumed controller kills leftovers by it
    if (d / f"killed.{index}").exists():  # stopped while it started
        _kill_node(cwd, index)
    return popen.wait()


def _kill_node(cwd: str, index: int) -> None:
    """Ray task on the node of bundle ``index``: kill that bundle's trial process group."""

    d = Path(cwd)
    (d / f"killed.{index}").touch()
    try:
        tag = (d / "tag").read_text().strip()
    except OSError:
        tag = ""
    try:
        pgid: int | None = int((d / f"pgid.{index}").read_text().strip())
    except (OSError, ValueError):
        pgid = None
    # the trial's group and every process of it on this node (torchrun's workers run in
    # sessions of their own)
    kill_trial(pgid, tag, grace_s=3.0)


@dataclass
class _Trial:
    launch: Launch
    pg: Any
    ready: Any
    waits: list[Any]
    started: float
    strategy: str
    running_since: float | None = None
    checked: float = 0.0
    last_size: int = 0
    last_progress: float = 0.0
    rcs: dict[int, int] = field(default_factory=dict)


class RayRunner(BaseRunner):
    """Runs trials on a Ray cluster, one placement group per trial."""

    name = "ray"

    def __init__(
        self,
        options: RayOptions,
        *,
        device: str,
        world_size: int,
        gpus_per_node: int | None = None,
        max_parallel: int | None = None,
    ) -> None:
        try:
            import ray
        except ImportError as e:
            raise TrialLaunchError("the ray runner needs Ray: pip install ray") from e
        self._ray = ray
        try:  # the options model checks them on input; options built without it, here
            check_env(dict(options.env), "runner.options.env")
        except ValueError as e:
            raise TrialLaunchError(str(e)) from e
        self.opts = options
        try:
            self.shape: TrialShape = trial_shape(
                world_size, device, options.gpus_per_node or gpus_per_node
            )
        except ValueError as e:
            raise TrialLaunchError(str(e)) from e
        if not ray.is_initialized():
            kw: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False}
            if options.address:
                kw["address"] = options.address
            else:
                if options.num_cpus is not None:
                    kw["num_cpus"] = options.num_cpus
                if options.num_gpus is not None:
                    kw["num_gpus"] = options.num_gpus
            try:
                ray.init(**kw)
            except Exception as e:  # noqa: BLE001 - any failure to join is a launch error
                raise TrialLaunchError(f"could not start or join Ray: {e}") from e
        self.max_parallel = max_parallel
        self._cap_at: tuple[float, int] | None = None
        # a cluster that cannot hold one trial still takes one at a time: its placement
        # group is infeasible and the trial is recorded unschedulable (never a hang)
        cap = max(1, self._capacity())
        self.capacity = min(cap, max_parallel) if max_parallel else cap
        # trial tasks reuse Ray's workers (max_calls=0: GPU tasks too; they touch no GPU)
        self._where = ray.remote(num_cpus=0, max_calls=0)(_where)
        self._run = ray.remote(max_calls=0, max_retries=0)(_run_node)
        self._kill = ray.remote(num_cpus=0, max_calls=0, max_retries=0)(_kill_node)
        self._trials: dict[int, _Trial] = {}
        self._done: list[Finished] = []

    def _cpus(self) -> float:
        if self.opts.cpus_per_trial is not None:
            return self.opts.cpus_per_trial
        return 1.0 if self.shape.device == "cuda" else float(self.shape.per_node)

    def _bundle(self) -> dict[str, float]:
        if self.shape.device == "cuda":
            return {"GPU": float(self.shape.per_node), "CPU": self._cpus()}
        return {"CPU": self._cpus()}

    def _capacity(self) -> int:
        """Trials the cluster's nodes hold at once (0: not one, whatever its load); asked
        again every few seconds (nodes join and leave)."""
        now = time.monotonic()
        if self._cap_at is not None and now - self._cap_at[0] < 5.0:
            return self._cap_at[1]
        need = self._bundle()
        bundles = 0
        for node in self._ray.nodes():
            if not node.get("Alive"):
                continue
            res = node.get("Resources", {})
            bundles += min(int(res.get(k, 0) // v) if v else 10**6 for k, v in need.items())
        self._cap_at = (now, bundles // self.shape.nodes)
        return self._cap_at[1]

    # --- contract --------------------------------------------------------------------------
    def free_slots(self) -> int:
        """Trials that fit now: the cap less what runs, and no more than free resources hold
        (a trial the cluster can never hold is let through to be recorded unschedulable)."""
        room = self.capacity - len(self._trials)
        if room <= 0:
            return 0
        if self._capacity() < 1:
            return room
        avail = self._ray.available_resources()
        fits = (
            min(int(avail.get(k, 0) // v) if v else 10**6 for k, v in self._bundle().items())
            // self.shape.nodes
        )
        return max(0, min(room, fits))

    def submit(self, launch: Launch) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        launch.trial_dir.mkdir(parents=True, exist_ok=True)
        (launch.trial_dir / PLACEMENT_FILE).unlink(missing_ok=True)
        shape = self.shape
        strategy = self.opts.strategy or ("PACK" if shape.nodes == 1 else "STRICT_SPREAD")
        try:
            pg = placement_group([self._bundle()] * shape.nodes, strategy=strategy)
        except Exception as e:  # noqa: BLE001 - a cluster error
            raise TrialLaunchError(f"no placement group for trial {launch.number}: {e}") from e
        gpu = float(shape.per_node) if shape.device == "cuda" else 0.0

        def at(i: int) -> Any:
            return PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=i
            )

        # nothing here waits: the placement group and the tasks come up in Ray's time; the
        # first node's address reaches the others as an object reference
        master = self._where.options(scheduling_strategy=at(0)).remote()
        port = str(random.randint(20000, 39999))
        argv = rendezvous_argv(
            launch.argv, shape, master_addr=_MASTER, master_port=port,
            run_id=f"dse-{launch.trial_id}",
        )  # fmt: skip
        env = {
            **self.opts.env,
            **launch.env,
            "MASTER_ADDR": _MASTER,
            "MASTER_PORT": port,
            "DSE_TRIAL_NODES": str(shape.nodes),
            TRIAL_TAG_ENV: new_trial_tag(),
        }
        (launch.trial_dir / "tag").write_text(env[TRIAL_TAG_ENV])
        if shape.device != "cuda":
            threads = max(1, int(self._cpus()) // max(1, shape.per_node))
            env.setdefault("OMP_NUM_THREADS", str(threads))
        tdir, log = str(launch.trial_dir), str(launch.log_path)
        waits = [
            self._run.options(num_cpus=0, num_gpus=gpu, scheduling_strategy=at(i)).remote(
                argv, env, tdir, log, i, self.host, master
            )
            for i in range(shape.nodes)
        ]
        now = time.monotonic()
        self._trials[launch.trial_id] = _Trial(
            launch, pg, pg.ready(), waits, now, strategy, last_progress=now
        )

    def running(self) -> list[int]:
        return list(self._trials)

    def poll(self) -> list[Finished]:
        ray = self._ray
        now = time.monotonic()
        for tid, t in list(self._trials.items()):
            if t.running_since is None:
                if not ray.wait([t.ready], timeout=0)[0]:
                    if now - t.checked >= 1.0:  # Ray's scheduling state, once a second
                        t.checked = now
                        self._check_pending(tid, t, now)
                    continue
                t.running_since = t.last_progress = now
            ready, _ = ray.wait(t.waits, num_returns=len(t.waits), timeout=0)
            failed: str | None = None
            for ref in ready:
                i = t.waits.index(ref)
                if i in t.rcs:
                    continue
                try:
                    t.rcs[i] = int(ray.get(ref))
                except Exception as e:  # noqa: BLE001 - the node's task died (node lost)
                    t.rcs[i] = -1
                    failed = f"the Ray task of node {i} died: {str(e).splitlines()[0][:200]}"
            mp = t.launch.metrics_path
            size = mp.stat().st_size if mp.exists() else 0
            if size != t.last_size:
                t.last_size, t.last_progress = size, now
            if failed is not None:
                self._finish(tid, outcome_after_exit(t.launch, "node_fail", failed))
            elif len(t.rcs) == len(t.waits) or any(rc != 0 for rc in t.rcs.values()):
                bad = {i: rc for i, rc in t.rcs.items() if rc != 0}
                if bad:
                    i, rc = next(iter(bad.items()))
                    what = f"trial process on node {i} exited with {_rc_text(rc)}"
                else:
                    what = "trial processes exited with code 0"
                self._finish(tid, outcome_after_exit(t.launch, None, what))
            elif now - t.running_since > t.launch.timeout_s:
                reason = f"trial ran past its timeout of {t.launch.timeout_s:.0f} s"
                self._finish(tid, read_metrics(mp) or Outcome.failure("timeout", reason))
            elif now - t.last_progress > t.launch.hang_timeout_s:
                reason = f"no progress for {t.launch.hang_timeout_s:.0f} s (hang timeout)"
                self._finish(tid, read_metrics(mp) or Outcome.failure("hang", reason))
        done, self._done = self._done, []
        return done

    def stop(self) -> list[int]:
        ids = list(self._trials)
        for tid in ids:
            t = self._trials.pop(tid)
            self._teardown(t)
        return ids

    # --- internals -------------------------------------------------------------------------
    def _check_pending(self, tid: int, t: _Trial, now: float) -> None:
        """End a trial whose placement group Ray finds infeasible, or that waited for room
        past the queue timeout, with Ray's scheduling state."""
        from ray.util.placement_group import placement_group_table

        try:
            state = str(placement_group_table(t.pg).get("stats", {}).get("scheduling_state", ""))
        except Exception:  # noqa: BLE001 - the table is a diagnosis, not a need
            state = ""
        limit = self.opts.queue_timeout_s
        waited = now - t.started
        what = f"{self.shape.nodes} x {_fmt(self._bundle())}"
        if state == "INFEASIBLE":
            why = (
                f"the Ray cluster ({_fmt(self._ray.cluster_resources())}) can never place the "
                f"trial's placement group ({what}, strategy {t.strategy}); Ray's scheduling "
                f"state: {state}"
            )
            self._finish(tid, Outcome.failure("unschedulable", why))
        elif limit is not None and waited > limit:
            why = (
                f"the trial's placement group ({what}) waited {waited:.0f} s for room "
                f"(runner.options.queue_timeout_s {limit:g}); Ray's scheduling state: "
                f"{state or 'unknown'}"
            )
            self._finish(tid, Outcome.failure("timeout", why))

    def _finish(self, tid: int, outcome: Outcome) -> None:
        t = self._trials.pop(tid)
        self._teardown(t)
        ndev = self.shape.nodes * self.shape.per_node
        placement = read_placement(t.launch.trial_dir)
        wall = time.monotonic() - (t.running_since or time.monotonic())
        self._done.append(Finished(tid, outcome, wall, ndev, placement=placement))

    def _teardown(self, t: _Trial) -> None:
        """Kill the trial's process groups on every node, then free its placement group."""
        ray = self._ray
        from ray.util.placement_group import remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        tdir = str(t.launch.trial_dir)
        for i in range(len(t.waits)):
            Path(tdir, f"killed.{i}").touch()  # a task not started yet will not start
        if t.ready is None or ray.wait([t.ready], timeout=0)[0]:
            kills = [
                self._kill.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=t.pg, placement_group_bundle_index=i
                    )
                ).remote(tdir, i)
                for i in range(len(t.waits))
            ]
            try:
                ray.get(kills, timeout=30)
            except Exception:  # noqa: BLE001, S110 - a lost node has nothing left to kill
                pass
        for ref in t.waits:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001, S110 - finished already
                pass
        try:
            remove_placement_group(t.pg)
        except Exception:  # noqa: BLE001, S110
            pass


def _rc_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"code {rc}"


def _fmt(res: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(res.items()) if k in ("CPU", "GPU"))


def ray_options(space: Any) -> RayOptions:
    """The space's ``runner.options`` as ray options."""
    return runner_options(space, RayOptions, "ray")


def make_runner(space: Any) -> RayRunner:
    device = trial_device(space)
    return RayRunner(
        ray_options(space),
        device=device,
        world_size=space.resources.world_size,
        gpus_per_node=space.resources.gpus_per_node,
        max_parallel=space.runner.max_parallel,
    )
