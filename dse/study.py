"""The study loop: agent.ask -> rules + cost-model screen -> runner.submit -> storage -> tell.

The database is the study's only memory: a killed controller resumes from it (trials that were
running are reconciled from their metrics files or re-queued), and several controllers can
work on one study because trial numbers and budget are claimed atomically in storage.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dse.exceptions import StudyNotFoundError
from dse.proposer import Prescreen, Proposer, cost_model_prescreen, feedback_from_outcome
from dse.records import (
    ANSWERED_STATES,
    FINISHED_STATES,
    Outcome,
    TrialRecord,
    TrialSpec,
    read_metrics,
)
from dse.space import SearchSpace, params_key
from dse.workloads import trial_command
from dse.workloads.runners import BaseRunner, Launch, kill_group

if TYPE_CHECKING:
    from dse.agents import BaseAgent
    from dse.storage import Storage

__all__ = ["StudyRunner", "StudyResult", "objective_value", "detect_trial_features"]

log = logging.getLogger("dse.study")

HEARTBEAT_S = 5.0


def objective_value(space: SearchSpace, outcome: Outcome) -> float | None:
    """The primary objective of an ``ok`` outcome (None otherwise)."""
    if not outcome.ok:
        return None
    v = outcome.metrics.get(space.objective.metric)
    return None if v is None else float(v)


def detect_trial_features(space: SearchSpace, python: str | None = None) -> set[str] | None:
    """Optional software present where trials run (declared, or probed with the trial's
    interpreter, never in the controller's own process)."""
    feats = space.resources.features
    if isinstance(feats, list):
        return set(feats)
    launcher = space.workload.launcher
    builtin = launcher is not None and launcher.module == "dse.workloads.megatron.mlm"
    if space.workload.name != "megatron" and not builtin:
        return set()
    import subprocess

    code = (
        "import json; from dse.workloads.megatron.features import detect_features; "
        "print(json.dumps(detect_features()))"
    )
    try:
        out = subprocess.run(
            [python or sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        return set(json.loads(out.stdout.strip().splitlines()[-1]))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        log.warning("could not probe the trial environment's features; rules will not use them")
        return None


@dataclass
class StudyResult:
    study: str
    counts: dict[str, int]
    best: TrialRecord | None
    rejections: int
    stopped: bool = False
    reasons: list[str] = field(default_factory=list)


class _Progress:
    """One line per event on stderr: trials done, running, failed, the best so far."""

    def __init__(self, stream: Any = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=self.stream, flush=True)


class StudyRunner:
    """Runs one study to its budget."""

    def __init__(
        self,
        space: SearchSpace,
        *,
        storage: Storage,
        runner: BaseRunner,
        agent: BaseAgent,
        space_yaml: str,
        features: set[str] | None,
        progress: Callable[[str], None] | None = None,
        cost_model: Any = None,
    ) -> None:
        self.space = space
        self.storage = storage
        self.runner = runner
        self.agent = agent
        self.space_yaml = space_yaml
        self.features = features
        self.progress = progress or _Progress()
        self.cost_model = cost_model
        self.owner = f"{runner.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.workdir = Path(space.runner.workdir) / space.study
        #: storage trial id -> the agent's id of the proposal it runs
        self._agent_ids: dict[int, str] = {}
        self._started_wall = time.time()

    # --- setup ---------------------------------------------------------------------------
    def _open_study(self) -> int:
        s = self.space
        rec, created = self.storage.get_or_create_study(
            space_yaml=self.space_yaml, **s.study_fields()
        )
        self.progress(
            f"study {s.study!r}: {'created' if created else 'resumed'} in "
            f"{self.storage.display_url}"
        )
        self.storage.set_study_state(s.study, "running")
        return rec.id

    def reconcile(self, study_id: int) -> int:
        """Trials left running/queued by a dead controller: take their finished results from
        their metrics files, kill leftovers and re-queue the rest. Returns how many."""
        n = 0
        for t in self.storage.list_trials(study_id, state="queued"):
            if t.runner and self._owner_dead(t):
                self.storage.requeue_trial(t.id, reason="interrupted: controller died")
                n += 1
        for t in self.storage.list_trials(study_id, state="running"):
            if not self._owner_dead(t):
                continue
            out = read_metrics(t.metrics_path) if t.metrics_path else None
            if out is not None:
                self.storage.finish_trial(t.id, out, value=objective_value(self.space, out))
                self.progress(f"reconciled trial {t.number}: finished while unattended")
            else:
                if t.metrics_path:
                    _kill_leftover(Path(t.metrics_path).parent)
                self.storage.requeue_trial(t.id, reason="interrupted: controller died")
                self.progress(f"reconciled trial {t.number}: interrupted, re-queued")
            n += 1
        return n

    def _owner_dead(self, t: TrialRecord) -> bool:
        """Whether the controller that ran ``t`` is gone (same host: its pid; else heartbeat)."""
        owner = t.runner or ""
        parts = owner.split(":")
        if len(parts) >= 3 and parts[0] == self.runner.host:
            try:
                os.kill(int(parts[1]), 0)
            except (ProcessLookupError, ValueError):
                return True
            except PermissionError:
                return False
            return int(parts[1]) == os.getpid() and parts[2] != self.owner.split(":")[2]
        hb = t.heartbeat_at or t.started_at or 0
        return time.time() - hb > 6 * HEARTBEAT_S

    def _restore_agent(self, study_id: int) -> None:
        n = 0
        for t in self.storage.list_trials(study_id):
            if t.state in FINISHED_STATES:
                out = _outcome_of_record(t)
                self.agent.add_evaluated(t.params, feedback_from_outcome(self.space, out))
                n += 1
        for r in self.storage.list_rejections(study_id):
            out = Outcome.failure(r.kind, r.reason, source="rules")
            self.agent.add_evaluated(r.params, feedback_from_outcome(self.space, out))
        if n:
            self.progress(f"agent restored from storage: {n} finished trials")
        if self.space.agent.warm_start_study:
            self._warm_start_from(self.space.agent.warm_start_study)
        if self.cost_model is not None:
            attrs = self.storage.get_study_attrs(study_id)
            for t in self.storage.list_trials(study_id):
                self._observe_cost(t.params, _outcome_of_record(t))
            if "costmodel" in attrs:
                log.debug("stored calibration: %s", attrs["costmodel"])

    def _warm_start_from(self, name: str) -> None:
        """Feed the agent the finished trials of an earlier study of the same model as
        history (not re-measured here; the baseline excepted): their knob values inside this
        space's domains, the rest at this space's baseline."""
        try:
            other = self.storage.get_study(name)
        except StudyNotFoundError:
            self.progress(f"warm start: no study {name!r} in this storage; skipped")
            return
        mine = self.space.study_fields()["model"]
        theirs = dict(other.model)
        if theirs.get("seq_length") is None:  # a record stored before it kept seq_length
            theirs["seq_length"] = mine["seq_length"]
        if theirs != mine:
            self.progress(f"warm start: study {name!r} trains another model; skipped")
            return
        base = self.space.baseline()
        n = 0
        for t in self.storage.list_trials(other.id):
            if t.state not in ANSWERED_STATES:
                continue
            params = dict(base)
            fits = True
            for k, v in t.params.items():
                if k in self.space.knobs:
                    if v not in self.space.knobs[k].values():
                        fits = False
                    params[k] = v
                elif self.space.fixed.get(k, v) != v:
                    fits = False
            if not fits:
                continue
            params = self.space.apply_conditions(params)
            if params_key(params) == params_key(base):
                continue  # the baseline is measured in every study (the loss reference)
            fb = feedback_from_outcome(self.space, _outcome_of_record(t))
            self.agent.add_evaluated(params, fb)
            n += 1
        self.progress(f"warm start: {n} trials of study {name!r} told to the agent")

    # --- main loop -------------------------------------------------------------------------
    def run(self) -> StudyResult:
        s = self.space
        study_id = self._open_study()
        self.reconcile(study_id)
        self._restore_agent(study_id)
        proposer = Proposer(
            s,
            self.agent,
            self.features,
            prescreen=self._prescreen(),
            on_reject=lambda rej: self._store_rejection(study_id, rej),
            on_progress=self.progress,
        )
        budget = s.budget.n_trials
        last_hb = 0.0
        last_state_check = 0.0
        exhausted = False
        stopped = False
        try:
            while True:
                for fin in self.runner.poll():
                    self._on_finished(study_id, fin.trial_id, fin.outcome, fin.wall_s, fin.devices)
                counts = self.storage.count_trials(study_id)
                out_of_time = (
                    s.budget.wall_clock_s is not None
                    and time.time() - self._started_wall > s.budget.wall_clock_s
                )
                free = self.runner.free_slots()
                if free > 0 and not out_of_time:
                    launched = self._launch_queued(study_id, free)
                    free -= launched
                    if free > 0 and not exhausted and counts["total"] < budget:
                        exhausted = self._launch_new(study_id, proposer, free, budget)
                if not self.runner.running():
                    counts = self.storage.count_trials(study_id)
                    if (
                        counts.get("queued", 0) == 0
                        and (counts["total"] >= budget or exhausted or out_of_time)
                        and counts.get("running", 0) == 0
                    ):
                        break
                    if counts.get("queued", 0) == 0 and counts.get("running", 0) > 0:
                        # another controller's trials: wait for them (or their staleness)
                        self.reconcile(study_id)
                now = time.monotonic()
                if now - last_state_check > 2.0:
                    last_state_check = now
                    if self.storage.get_study(s.study).state == "stopping":
                        self.progress("stop requested (study state 'stopping')")
                        raise KeyboardInterrupt
                if now - last_hb > HEARTBEAT_S and self.runner.running():
                    self.storage.heartbeat(self.runner.running())
                    last_hb = now
                time.sleep(0.05)
        except KeyboardInterrupt:
            stopped = True
            ids = self.runner.stop()
            for tid in ids:
                self.storage.requeue_trial(tid, reason="interrupted: stopped by the user")
            self.progress(f"stopped; {len(ids)} running trial(s) killed and re-queued")
        finally:
            if self.runner.running():
                for tid in self.runner.stop():
                    self.storage.requeue_trial(tid, reason="interrupted: controller error")
        counts = self.storage.count_trials(study_id)
        state = "stopped" if stopped else "complete"
        self.storage.set_study_state(s.study, state)
        best = self.storage.best_trial(study_id, s.objective.direction)
        rej = sum(self.storage.count_rejections(study_id).values())
        self.progress(self._status_line(counts, best, rej, prefix="done:"))
        return StudyResult(s.study, counts, best, rej, stopped=stopped)

    def _prescreen(self) -> Prescreen | None:
        return cost_model_prescreen(self.space, self.cost_model)

    def _launch_queued(self, study_id: int, free: int) -> int:
        """Run re-queued trials first (atomically acquired: two controllers never share one)."""
        n = 0
        while n < free:
            t = self.storage.acquire_queued_trial(
                study_id, runner=self.owner, older_than_s=6 * HEARTBEAT_S
            )
            if t is None:
                break
            self._submit(t)
            n += 1
        return n

    def _launch_new(self, study_id: int, proposer: Any, free: int, budget: int) -> bool:
        """Ask for up to ``free`` proposals and launch them; True when the space is spent."""

        def lookup(key: str) -> Outcome | None:
            if self.space.budget.repeats:
                return None
            t = self.storage.find_trial(study_id, key)
            return None if t is None else _outcome_of_record(t)

        # rejections are stored and shown as they happen (Proposer's on_reject)
        result = proposer.propose(free, lookup=lookup)
        if not result.proposals:
            return bool(result.exhausted)
        for prop in result.proposals:
            t = self.storage.claim_trial(
                study_id=study_id,
                params=prop.params,
                params_key=params_key(prop.params),
                budget=budget,
                allow_repeat=self.space.budget.repeats,
                runner=self.owner,
            )
            if t is None:
                # budget spent by now (another controller) or claimed by another writer
                proposer.agent.tell(
                    prop.trial_id,
                    feedback_from_outcome(
                        self.space, Outcome.failure("error", "claimed elsewhere")
                    ),
                )
                continue
            self._agent_ids[t.id] = prop.trial_id
            self._submit(t)
        return False

    def _store_rejection(self, study_id: int, rej: Any) -> None:
        """A proposal rejected before launch: stored and shown right away."""
        self.storage.add_rejection(
            study_id=study_id,
            params=rej.params,
            params_key=rej.params_key,
            kind=rej.kind,
            rule=rej.rule,
            reason=rej.reason,
            values=rej.values,
        )
        self.progress(f"rejected before launch ({rej.kind}): {rej.rule}: {rej.reason}")

    def _submit(self, t: TrialRecord) -> None:
        s = self.space
        tdir = (self.workdir / f"trial-{t.number:05d}").resolve()
        tdir.mkdir(parents=True, exist_ok=True)
        metrics = tdir / "metrics.jsonl"
        if metrics.exists():  # a re-queued trial starts clean
            metrics.rename(tdir / f"metrics.{int(time.time())}.jsonl.old")
        env, workload = trial_launch(s, t.params)
        spec = TrialSpec(
            study=s.study,
            trial_number=t.number,
            params=s.full_params(t.params),
            model=s.model.model_dump(),
            semantics=s.semantics.model_dump(),
            world_size=s.resources.world_size,
            device=s.resources.device,
            metrics_path=str(metrics),
            workload=workload,
            features=None if self.features is None else sorted(self.features),
            gpu=s.resources.gpu,
            gpu_memory_gib=s.resources.gpu_memory_gib,
        )
        spec_path = tdir / "trial.json"
        spec_path.write_text(spec.model_dump_json(indent=2))
        argv = trial_command(
            s.workload.name, str(spec_path), world_size=s.resources.world_size,
            python=s.runner.python,
        )  # fmt: skip
        launch = Launch(
            trial_id=t.id,
            number=t.number,
            argv=argv,
            trial_dir=tdir,
            metrics_path=metrics,
            log_path=tdir / "log.txt",
            world_size=s.resources.world_size,
            device=s.resources.device,
            timeout_s=s.budget.trial_timeout_s,
            hang_timeout_s=s.budget.hang_timeout_s,
            env=env,
        )
        self.runner.submit(launch)
        self.storage.start_trial(
            t.id,
            runner=self.owner,
            host=self.runner.host,
            log_path=str(launch.log_path),
            metrics_path=str(metrics),
        )
        self.progress(f"trial {t.number} started: {_short(t.params)}")

    def _on_finished(
        self, study_id: int, trial_id: int, outcome: Outcome, wall_s: float, devices: int
    ) -> None:
        s = self.space
        if outcome.failure_class == "oom" and s.resources.gpu_memory_gib:
            outcome = Outcome(
                outcome.status,
                {**outcome.metrics, "gpu_memory_gib": s.resources.gpu_memory_gib},
                outcome.failure_class,
                outcome.reason,
                outcome.steps,
                outcome.source,
            )
        gpu_s = wall_s * devices if s.resources.device == "cuda" else None
        rec = self.storage.finish_trial(
            trial_id, outcome, value=objective_value(s, outcome), gpu_seconds=gpu_s
        )
        fb = feedback_from_outcome(s, outcome)
        if trial_id in self._agent_ids:
            agent_tid = self._agent_ids.pop(trial_id)
            self.agent.tell(agent_tid, fb)
        else:  # re-queued trial of an earlier run: feed it as history
            self.agent.add_evaluated(rec.params, fb)
        self._observe_cost(rec.params, outcome)
        if self.cost_model is not None:
            self.storage.set_study_attr(study_id, "costmodel", self.cost_model.calibration())
        counts = self.storage.count_trials(study_id)
        best = self.storage.best_trial(study_id, s.objective.direction)
        rej = sum(self.storage.count_rejections(study_id).values())
        what = (
            f"{s.objective.metric}={rec.value:.4g}"
            if rec.value is not None
            else f"{rec.failure_class}: {(rec.reason or '')[:120]}"
        )
        self.progress(
            f"trial {rec.number} {rec.state} ({what}) | "
            + self._status_line(counts, best, rej, prefix="")
        )

    def _observe_cost(self, params: dict[str, Any], outcome: Outcome) -> None:
        cm = self.cost_model
        if cm is None or outcome.source == "estimate":
            return
        peak = outcome.metrics.get("peak_mem_gib")
        if peak is None:
            return
        if outcome.ok:
            cm.observe(self.space.full_params(params), float(peak), False)
        elif outcome.failure_class == "oom":
            cm.observe(self.space.full_params(params), float(peak), True)

    def _status_line(
        self, counts: dict[str, int], best: TrialRecord | None, rej: int, prefix: str
    ) -> str:
        budget = self.space.budget.n_trials
        done = sum(counts.get(k, 0) for k in FINISHED_STATES)
        b = (
            f"best {best.value:.4g} (trial {best.number})"
            if best is not None and best.value is not None
            else "best -"
        )
        return (
            f"{prefix} {done}/{budget} done, {counts.get('running', 0)} running, "
            f"{counts.get('failed', 0)} failed, {counts.get('infeasible', 0)} infeasible, "
            f"{rej} rejected before launch, {b}"
        ).strip()


def trial_launch(space: SearchSpace, params: dict[str, Any]) -> tuple[dict[str, str], dict]:
    """(environment of every rank, trial spec ``workload`` dict) of a trial: the space's
    ``env`` section and ``env.*`` knobs; for a recipe launcher also the rendered command."""
    from dse.knobs import trial_env

    full = space.full_params(params)
    workload = space.workload.model_dump()
    workload["node_steps"] = list(space.env.node_steps)
    env = trial_env(full, space.env.fixed)
    if space.workload.launcher is not None:
        from dse.exceptions import SpaceError
        from dse.workloads.launchers import NotTaken, launcher_for

        spec = space.workload.launcher
        try:
            rendered = launcher_for(space).render(
                full, python=spec.python or space.runner.python or sys.executable
            )
        except (NotTaken, SpaceError) as e:
            # a combination the per-knob check at validate could not see: the trial process
            # records it as invalid without starting the recipe
            workload["rendered"] = {"not_taken": f"the {space.workload.name} recipe cannot "
                                    f"take this configuration: {e}"}  # fmt: skip
            return env, workload
        workload["rendered"] = rendered.to_dict()
        env = rendered.env
    return env, workload


def _outcome_of_record(t: TrialRecord) -> Outcome:
    if t.state == "complete":
        return Outcome("ok", dict(t.metrics), source=t.source or "measured")  # type: ignore[arg-type]
    return Outcome.failure(
        t.failure_class or "error", t.reason or "", metrics=dict(t.metrics),
        source=t.source or "measured",  # type: ignore[arg-type]
    )  # fmt: skip


def _kill_leftover(trial_dir: Path) -> None:
    f = trial_dir / "pgid"
    try:
        kill_group(int(f.read_text().strip()), grace_s=2.0)
    except (OSError, ValueError):
        pass


def _short(params: dict[str, Any]) -> str:
    abbrev = {
        "tensor_model_parallel_size": "tp",
        "pipeline_model_parallel_size": "pp",
        "context_parallel_size": "cp",
        "micro_batch_size": "mbs",
        "use_distributed_optimizer": "distopt",
        "attention_backend": "attn",
    }
    return " ".join(f"{abbrev.get(k, k)}={v}" for k, v in params.items())
