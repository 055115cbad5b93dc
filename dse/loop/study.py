"""The study loop: agent.ask -> rules + cost-model screen -> runner.submit -> storage -> tell.

The database is the study's only memory: a killed controller resumes from it (trials that were
running are reconciled from their metrics files or re-queued), and several controllers can
work on one study because trial numbers and budget are claimed atomically in storage.

The parts: :class:`~dse.loop.agent_session.AgentSession` (the agent conversation),
:class:`~dse.loop.reconcile.Reconciler` (ownership and heartbeat),
:class:`~dse.loop.dispatch.TrialDispatcher`
(spec and submit), and :class:`StudyRunner`, the loop itself. A stop (a signal, the study
state ``stopping``, the wall-clock budget) is a condition of the loop: running trials are
killed and re-queued, and the output says how to continue.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dse.core.exceptions import StudyNotFoundError
from dse.core.figures import figure
from dse.core.names import display_name
from dse.core.records import FINISHED_STATES, Outcome, TrialRecord
from dse.loop.agent_session import AgentSession
from dse.loop.context import StudyContext
from dse.loop.dispatch import TrialDispatcher, trial_launch
from dse.loop.loss_guard import LossGuard
from dse.loop.reconcile import HEARTBEAT_S, STALE_S, Owner, Reconciler
from dse.results.gpu_usage import (
    GRID_ATTR,
    HELD_ATTR_PREFIX,
    count_grid,
    grid_attr,
    held_record,
    trial_timing,
)
from dse.results.noise import ConfigEstimate, NoisyBest, remeasure_plan, study_best
from dse.results.objective import objective_value
from dse.results.run_settings import (
    IMPORTED_ATTR,
    RUN_SETTINGS_ATTR,
    check_same_identity,
    run_settings,
    with_run_settings,
)
from dse.space.searchspace import SearchSpace, params_key, parse_space

if TYPE_CHECKING:
    from dse.agents import BaseAgent
    from dse.runners import BaseRunner
    from dse.storage import Storage

__all__ = [
    "StudyRunner",
    "StudyResult",
    "objective_value",
    "detect_trial_features",
    "HEARTBEAT_S",
    "resume_hint",
    "Progress",
    "trial_launch",
]

log = logging.getLogger("dse.loop.study")

#: Seconds the loop sleeps when nothing happened.
TICK_S = 0.05
#: Seconds between checks of the study state (a stop asked through the API).
STATE_CHECK_S = 2.0
#: Launch failures in a row after which the study stops (the runner cannot work here).
MAX_LAUNCH_FAILURES = 3
#: Failed runs of the baseline after which the loss-parity guard stops asking for another
#: (its reference is then missing: trials stay ``unchecked``).
MAX_BASELINE_RUNS = 2


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
    #: the noise-aware best (intervals, pooled trials, ties); None without a complete trial
    noisy_best: NoisyBest | None = None
    stopped: bool = False
    reasons: list[str] = field(default_factory=list)
    #: why the loop stopped before the budget (a signal name, "stop requested", ...)
    stop_reason: str | None = None
    #: what stopped it: "request" (a signal, the API, a caller), "wall_clock" (the budget's
    #: wall_clock_s), "launch" (trials could not be launched: the runner cannot work here)
    stop_kind: str | None = None


def best_text(nb: NoisyBest) -> str:
    """``451.2 [447.0, 455.4] (trial 3, 2 runs)``, and the tie when there is one."""

    o = nb.best.objective
    ci = "" if o.ci is None or o.ci[0] >= o.ci[1] else f" [{figure(o.ci[0])}, {figure(o.ci[1])}]"
    runs = nb.best.n
    text = f"{figure(o.value)}{ci} (trial {nb.best.number}"
    text += f", {runs} runs)" if runs > 1 else ")"
    return text + (f"; {nb.message}" if nb.message else "")


def resume_hint(study: str, storage_url: str) -> str:
    """The command that continues a stopped study."""
    from dse.storage import safe_url

    url = _shell(safe_url(storage_url))
    return f"to continue: dse resume --study {_shell(study)} --storage {url}"


def _shell(text: str) -> str:
    import shlex

    return shlex.quote(display_name(text))


class Progress:
    """One line per event on stderr: trials done, running, failed, the best so far."""

    def __init__(self, stream: Any = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=self.stream, flush=True)


class StudyRunner:
    """Runs one study to its budget (or until a stop is asked).

    Args:
        space: the space with this run's settings.
        storage: the study's storage.
        runner: where trials run.
        agent: the search agent (restored from storage by the loop).
        space_yaml: the space file's text (stored when the study is created).
        features: software present where trials run (None: unknown).
        progress: one line per event.
        cost_model: the cost model (pre-screen, memory hint, calibration), or None.
        on_trial: called with each finished trial record (``dse bench`` stops at a target).
        owner: this controller (default: a new one); give it when the runner was prepared
            for it before (``runner.prepare``, e.g. warm workers started early).
        held_since: when this controller's runner started holding its devices (wall clock;
            default: when :meth:`run` starts).
    """

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
        on_trial: Callable[[TrialRecord], None] | None = None,
        owner: Owner | None = None,
        held_since: float | None = None,
    ) -> None:
        self.space = space
        self.storage = storage
        self.runner = runner
        self.agent = agent
        self.space_yaml = space_yaml
        self.features = features
        self.progress = progress or Progress()
        self.cost_model = cost_model
        self.on_trial = on_trial
        self.me = owner or Owner.new(runner.host)
        self.owner = str(self.me)
        self._held_since = held_since
        self._study_id: int | None = None
        self._grid: threading.Thread | None = None
        self._grid_result: list[Any] = []
        self.workdir = Path(space.runner.workdir) / space.study
        self._stop: str | None = None
        self._stop_kind: str | None = None
        self._started_wall = time.time()

    # --- stop ------------------------------------------------------------------------------
    def request_stop(self, reason: str, kind: str = "request") -> None:
        """Ask the loop to stop (safe from a signal handler): running trials are killed
        and re-queued, the study is left ``stopped``."""
        if self._stop is None:
            self._stop, self._stop_kind = reason, kind

    @property
    def stop_requested(self) -> str | None:
        return self._stop

    # --- setup -----------------------------------------------------------------------------
    def _open_study(self) -> tuple[int, bool]:
        """The study's id (created, or the stored one when its identity matches) and
        whether its stored paths may be trusted (not an unconfirmed import)."""
        s = self.space
        try:
            rec = self.storage.get_study(s.study)
        except StudyNotFoundError:
            rec = None
        if rec is not None:
            stored = parse_space(yaml.safe_load(rec.space_yaml), f"study {s.study!r} (stored)")
            settings = self.storage.get_study_attrs(rec.id).get(RUN_SETTINGS_ATTR)
            if isinstance(settings, dict) and isinstance(settings.get("workload"), dict):
                # the trial kind the study was started with (dse start --workload)
                name = settings["workload"].get("name")
                stored = with_run_settings(
                    stored, {"workload": {"name": name}}, f"study {s.study!r} (stored)"
                )
            check_same_identity(stored, s)
            created = False
        else:
            rec, created = self.storage.get_or_create_study(
                space_yaml=self.space_yaml, **s.study_fields()
            )
        attrs = self.storage.get_study_attrs(rec.id)
        imported = bool(attrs.get(IMPORTED_ATTR))
        self.storage.set_study_attr(rec.id, RUN_SETTINGS_ATTR, run_settings(s))
        if imported:  # the caller confirmed or replaced the export's settings
            self.storage.set_study_attr(rec.id, IMPORTED_ATTR, False)
        self.progress(
            f"study {s.study!r}: {'created' if created else 'resumed'} in "
            f"{self.storage.display_url} (budget {s.budget.n_trials} trials)"
        )
        self.storage.set_study_state(s.study, "running")
        return rec.id, not imported

    # --- main loop -------------------------------------------------------------------------
    def run(self) -> StudyResult:
        if self._held_since is None:
            self._held_since = time.time()
        self.runner.prepare(self.owner)  # warm workers start importing while the study opens
        try:
            study_id, trusted = self._open_study()
        except BaseException:
            self.runner.close()
            raise
        self._study_id = study_id
        self._record_held()
        self._count_grid(study_id)
        try:
            return self._run(study_id, trusted)
        finally:
            self.runner.close()
            self._record_held()

    # --- GPU time held and the grid (dse.results.gpu_usage) --------------------------------------
    def _record_held(self) -> None:
        """This controller run's devices and wall time so far (the study's held time)."""
        if self._study_id is None or self._held_since is None:
            return
        rec = held_record(self._held_since, self.runner.devices_held, self.space.resources.device)
        try:
            self.storage.set_study_attr(self._study_id, HELD_ATTR_PREFIX + self.owner, rec)
        except Exception:  # noqa: BLE001 - bookkeeping: never the reason a study stops
            log.warning("could not record the study's held GPU time", exc_info=True)
        self._store_grid()

    def _count_grid(self, study_id: int) -> None:
        """Count the space's valid configurations in the background (the space check's
        enumeration; seconds for a large space), once per space."""
        stored = self.storage.get_study_attrs(study_id).get(GRID_ATTR)
        digest = self.space.identity_digest()
        if isinstance(stored, dict) and stored.get("space_hash") == digest:
            return

        def work() -> None:
            try:
                self._grid_result.append(grid_attr(count_grid(self.space), digest))
            except Exception:  # noqa: BLE001 - the grid is an estimate's input, never fatal
                log.warning("could not count the space's configurations", exc_info=True)

        self._grid = threading.Thread(target=work, name="dse-grid-count", daemon=True)
        self._grid.start()

    def _store_grid(self) -> None:
        if self._grid_result and self._study_id is not None:
            value = self._grid_result.pop()
            try:
                self.storage.set_study_attr(self._study_id, GRID_ATTR, value)
            except Exception:  # noqa: BLE001 - bookkeeping
                log.warning("could not store the space's grid count", exc_info=True)

    def _run(self, study_id: int, trusted: bool) -> StudyResult:
        try:
            self.ctx = StudyContext(
                self.space,
                self.storage,
                study_id,
                features=self.features,
                progress=self.progress,
                stopping=lambda: self._stop is not None,
            )
            self.reconciler = Reconciler(
                self.ctx,
                self.me,
                trust_paths=trusted,
                kill=self.runner.kill_leftover,  # process group, or the runner's own (scancel)
            )
            self.session = AgentSession(self.ctx, self.agent, cost_model=self.cost_model)
            self.dispatcher = TrialDispatcher(
                self.ctx, self.runner, self.owner, workdir=self.workdir
            )
            self.guard = LossGuard(self.ctx)
            self.reconciler.reconcile()
            self.guard.judge_all()  # trials reconciled, or judged under other settings
            self.session.restore()
            complete = self._loop(study_id)
        except KeyboardInterrupt:  # a second signal while stopping: stop now
            self.request_stop("interrupted")
            complete = False
        except BaseException:
            n = self._release("interrupted: controller error")
            self.storage.set_study_state(self.space.study, "interrupted")
            self.progress(f"controller error; {n} running trial(s) killed and re-queued")
            self.progress(resume_hint(self.space.study, self.storage.url))
            raise
        n_stopped = self._release("interrupted: stopped")
        if not complete and n_stopped:
            self.progress(f"{n_stopped} running trial(s) killed and re-queued")
        return self._finish_study(study_id, complete)

    def _loop(self, study_id: int) -> bool:
        """Launch and collect trials until the budget is spent (True) or a stop (False).

        ``budget.n_trials`` counts the trials the agent proposes (a baseline run again after
        it failed included); re-measurements (``loss_parity.baseline_repeats``, then up to
        ``budget.remeasure`` re-measures of configurations tied within noise with the best,
        once the trials are spent) come on top."""
        s = self.space
        budget = s.budget.n_trials
        counts = self._counts(study_id)
        exhausted = False
        launch_failures = 0
        next_beat = next_state = time.monotonic()
        while self._stop is None:
            busy = False
            for fin in self.runner.poll():
                self._on_finished(
                    fin.trial_id,
                    fin.outcome,
                    fin.wall_s,
                    fin.devices,
                    placement=fin.placement,
                    gpu_slots=fin.gpu_slots,
                    worker=fin.worker,
                )
                busy = True
            if busy:  # what just finished decides what runs next (a failed baseline)
                counts = self._counts(study_id)
            out_of_time = (
                s.budget.wall_clock_s is not None
                and time.time() - self._started_wall > s.budget.wall_clock_s
            )
            free = self.runner.free_slots()
            proposed = counts["total"] - counts["remeasure"]
            if free > 0 and not out_of_time and self._stop is None:
                n, failed = self._launch_queued(study_id, free)
                if free - n > 0 and proposed + n < budget:
                    n2, failed2 = self._launch_baseline(study_id, free - n, counts)
                    n, failed = n + n2, failed + failed2
                if free - n > 0:
                    n2, failed2 = self._launch_baseline_repeats(study_id, free - n, counts)
                    n, failed = n + n2, failed + failed2
                if free - n > 0 and not exhausted and proposed + n < budget:
                    n2, failed2, exhausted = self._launch_new(
                        study_id, free - n, budget + counts["remeasure"]
                    )
                    n, failed = n + n2, failed + failed2
                busy = busy or n > 0 or failed > 0
                launch_failures = 0 if n > failed else launch_failures + failed
                if launch_failures >= MAX_LAUNCH_FAILURES:
                    self.request_stop(
                        f"{launch_failures} trials in a row could not be launched", "launch"
                    )
            if busy:
                counts = self._counts(study_id)
            now = time.monotonic()
            if now >= next_beat:  # heartbeat; counts of other controllers refreshed with it
                next_beat = now + HEARTBEAT_S
                self.reconciler.heartbeat(self.runner.running())
                self._record_held()
                counts = self._counts(study_id)
                if not self.runner.running() and counts.get("queued", 0) + counts.get(
                    "running", 0
                ):
                    # another controller's trials: wait for them (or their staleness)
                    if self.reconciler.reconcile():
                        counts = self._counts(study_id)
            if now >= next_state:
                next_state = now + STATE_CHECK_S
                if self.storage.get_study(s.study).state == "stopping":
                    self.request_stop("stop requested (study state 'stopping')")
            idle = (
                not self.runner.running()
                and counts.get("queued", 0) == 0
                and counts.get("running", 0) == 0
            )
            proposed = counts["total"] - counts["remeasure"]
            if idle and out_of_time:
                self.request_stop(
                    f"wall-clock budget of {s.budget.wall_clock_s:g} s spent", "wall_clock"
                )
            elif idle and (proposed >= budget or exhausted):
                # the trials are spent: re-measure what is tied with the best, then finish
                n, failed = self._launch_remeasures(study_id, self.runner.free_slots(), counts)
                if n == 0:
                    return True
                busy = True
                counts = self._counts(study_id)
            if not busy and self._stop is None:
                time.sleep(TICK_S)
        return False

    def _counts(self, study_id: int) -> dict[str, int]:
        """Trials per state, ``total``, and ``remeasure`` (re-measurement trials)."""
        counts = self.storage.count_trials(study_id)
        counts["remeasure"] = self.storage.count_numerics(study_id)["remeasure"]
        return counts

    # --- the baseline and re-measurements ---------------------------------------------------
    def _launch_baseline(
        self, study_id: int, free: int, counts: dict[str, int]
    ) -> tuple[int, int]:
        """With the loss-parity guard on, run the baseline again when every run of it failed
        (a crash, a timeout: its loss is the reference), at most :data:`MAX_BASELINE_RUNS`
        times. A fresh study needs nothing here: an agent's first proposal is the baseline."""
        if not self.space.loss_parity.enabled or free <= 0 or counts.get("failed", 0) == 0:
            return 0, 0
        base = self.space.baseline()
        runs = self.storage.list_trials(study_id, params_key=params_key(base))
        if not runs or any(t.state != "failed" for t in runs) or len(runs) >= MAX_BASELINE_RUNS:
            return 0, 0
        t = self.storage.claim_trial(
            study_id=study_id,
            params=base,
            params_key=params_key(base),
            budget=self.space.budget.n_trials + counts["remeasure"],
            runner=self.owner,
        )
        if t is None:
            return 0, 0
        self.progress(f"trial {t.number}: the baseline again (its earlier runs failed; its "
                      "loss is the loss-parity reference)")  # fmt: skip
        return 1, int(not self._submit(t))

    def _remeasure_cap(self) -> int:
        lp = self.space.loss_parity
        return (lp.baseline_repeats if lp.enabled else 0) + self.space.budget.remeasure

    def _claim_remeasure(
        self, study_id: int, of: TrialRecord | ConfigEstimate, counts: dict[str, int]
    ) -> bool:
        """Claim and launch a re-measurement of the configuration of trial ``of`` (or of a
        configuration's first trial)."""
        t = self.storage.claim_trial(
            study_id=study_id,
            params=dict(of.params),
            params_key=of.params_key,
            budget=self.space.budget.n_trials + counts["remeasure"] + 1,
            runner=self.owner,
            remeasure_of=of.number,
        )
        if t is None:
            return False
        counts["remeasure"] += 1
        counts["total"] += 1
        self._submit(t)
        return True

    def _launch_baseline_repeats(
        self, study_id: int, free: int, counts: dict[str, int]
    ) -> tuple[int, int]:
        """``loss_parity.baseline_repeats`` more runs of the baseline (they measure the
        run-to-run loss noise the tolerance is derived from), once the baseline is claimed."""
        lp = self.space.loss_parity
        if not lp.enabled or lp.baseline_repeats <= 0 or free <= 0:
            return 0, 0
        if counts["remeasure"] >= self._remeasure_cap():
            return 0, 0
        runs = self.storage.list_trials(study_id, params_key=params_key(self.space.baseline()))
        first = next((t for t in runs if t.remeasure_of is None), None)
        if first is None:
            return 0, 0
        done = sum(1 for t in runs if t.remeasure_of == first.number)
        n = 0
        while n < min(free, lp.baseline_repeats - done):
            if not self._claim_remeasure(study_id, first, counts):
                break
            n += 1
        if n:
            self.progress(f"baseline repeat(s) of trial {first.number}: {n} (loss-parity noise)")
        return n, 0

    def _launch_remeasures(
        self, study_id: int, free: int, counts: dict[str, int]
    ) -> tuple[int, int]:
        """Re-measure the configurations tied within noise with the best (one more trial
        each, fewest trials first), within ``budget.remeasure`` re-measures after the last
        proposed trial (a study whose budget grows re-measures a new tie); (launched, 0)."""
        if free <= 0 or self.space.budget.remeasure <= 0:
            return 0, 0
        trials = self.storage.list_trials(study_id)
        last = max((t.number for t in trials if t.remeasure_of is None), default=-1)
        spent = sum(1 for t in trials if t.remeasure_of is not None and t.number > last)
        left = min(free, self.space.budget.remeasure - spent)
        if left <= 0:
            return 0, 0
        study = self.storage.get_study_by_id(study_id)
        nb = study_best(self.storage, study, self.space)
        if nb is None:
            return 0, 0
        plan = remeasure_plan(nb, left)
        if plan:  # said before the trials it launches say they started
            self.progress(
                f"{nb.message}: re-measuring {len(plan)} of them (budget.remeasure "
                f"{self.space.budget.remeasure}) before naming a best"
            )
        n = 0
        for c in plan:
            if not self._claim_remeasure(study_id, c, counts):
                break
            n += 1
        return n, 0

    def _release(self, reason: str) -> int:
        """Kill this controller's running trials and re-queue them; how many."""
        ids = self.runner.stop() if self.runner.running() else []
        for tid in ids:
            self.storage.requeue_trial(tid, reason=reason)
        return len(ids)

    def _finish_study(self, study_id: int, complete: bool) -> StudyResult:
        s = self.space
        counts = self._counts(study_id)
        self.storage.set_study_state(s.study, "complete" if complete else "stopped")
        nb = study_best(self.storage, self.storage.get_study_by_id(study_id), self.space)
        best = None
        if nb is not None:
            best = nb.best.trial or self.storage.get_trial_by_number(study_id, nb.best.number)
        rej = sum(self.storage.count_rejections(study_id).values())
        if complete:
            self.progress(self._status_line(counts, nb, rej, prefix="done:"))
            if nb is not None and not nb.deterministic:  # what the intervals rest on
                self.progress(f"noise: {nb.model.describe()}")
        else:
            self.progress(self._status_line(counts, nb, rej, prefix=f"stopped ({self._stop}):"))
            self.progress(resume_hint(s.study, self.storage.url))
        return StudyResult(
            s.study,
            counts,
            best,
            rej,
            nb,
            stopped=not complete,
            stop_reason=self._stop,
            stop_kind=self._stop_kind,
        )

    def _launch_queued(self, study_id: int, free: int) -> tuple[int, int]:
        """Run re-queued trials first (atomically acquired: two controllers never share
        one). Returns (launched, failed to launch)."""
        n = failed = 0
        while n < free:
            t = self.storage.acquire_queued_trial(
                study_id, runner=self.owner, older_than_s=STALE_S
            )
            if t is None:
                break
            failed += not self._submit(t)
            n += 1
        return n, failed

    def _launch_new(self, study_id: int, free: int, budget: int) -> tuple[int, int, bool]:
        """Ask for up to ``free`` proposals and launch them. Returns (launched, failed to
        launch, the space is spent)."""
        result = self.session.propose(free)  # rejections stored as they happen
        if not result.proposals:  # capped calls are not the end; exhausted ones are
            return 0, 0, bool(result.exhausted)
        n = failed = 0
        for prop in result.proposals:
            if self._stop is not None:  # a stop (a signal) came while the agent proposed
                self.session.not_run(prop.trial_id, f"not launched: stopping ({self._stop})")
                continue
            t = self.storage.claim_trial(
                study_id=study_id,
                params=prop.params,
                params_key=prop.params_key,
                budget=budget,
                allow_repeat=self.space.budget.repeats,
                runner=self.owner,
            )
            if t is None:
                # budget spent by now (another controller) or claimed by another writer
                self.session.not_run(prop.trial_id, "claimed elsewhere")
                continue
            self.session.bind(t.id, prop.trial_id)
            failed += not self._submit(t)
            n += 1
        return n, failed, False

    def _submit(self, t: TrialRecord) -> bool:
        """Launch ``t``; a launch failure finishes it as a failed trial. True when it runs."""
        failure = self.dispatcher.launch(t)
        if failure is None:
            return True
        self._on_finished(t.id, failure, 0.0, 0)
        return False

    def _on_finished(
        self,
        trial_id: int,
        outcome: Outcome,
        wall_s: float,
        devices: int,
        placement: str | None = None,
        gpu_slots: tuple[str, ...] = (),
        worker: dict[str, Any] | None = None,
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
        # an estimate (the sim workload) runs on the controller's CPU: no GPU time
        device = "cpu" if outcome.source == "estimate" else s.resources.device
        if devices > 0:  # launched: its time on its devices (dse.results.gpu_usage)
            extra = trial_timing(
                wall_s=wall_s,
                devices=devices,
                device=device,
                steps=outcome.steps,
                measured=outcome.source == "measured",
                gpu_slots=gpu_slots or _slots_of(placement),
            )
            if worker is not None:
                extra["worker"] = worker
            outcome = Outcome(
                outcome.status,
                {**outcome.metrics, **extra},
                outcome.failure_class,
                outcome.reason,
                outcome.steps,
                outcome.source,
            )
        gpu_s = wall_s * devices if device == "cuda" else None
        rec = self.storage.finish_trial(
            trial_id, outcome, value=objective_value(s, outcome), gpu_seconds=gpu_s, host=placement
        )
        rec = self.guard.on_finished(rec)  # the loss-parity verdict (metrics["numerics"])
        self.session.tell(rec, outcome)
        if self.on_trial is not None:
            self.on_trial(rec)
        if isinstance(self.progress, Progress) and self.progress.quiet:
            return
        counts = self._counts(rec.study_id)
        nb = study_best(self.storage, self.storage.get_study_by_id(rec.study_id), s)
        rej = sum(self.storage.count_rejections(rec.study_id).values())
        what = (
            f"{s.objective.metric}={rec.value:.4g}"
            + (" estimate" if outcome.source == "estimate" else "")
            if rec.value is not None
            else f"{rec.failure_class}: {(rec.reason or '')[:120]}"
        )
        if rec.numerics == "changed":
            what += ", numerics changed"
        if rec.remeasure_of is not None:
            what += f", re-measures trial {rec.remeasure_of}"
        self.progress(
            f"trial {rec.number} {rec.state} ({what}) | "
            + self._status_line(counts, nb, rej, prefix="")
        )

    def _status_line(
        self, counts: dict[str, int], nb: NoisyBest | None, rej: int, prefix: str
    ) -> str:
        budget = self.space.budget.n_trials
        again = counts.get("remeasure", 0)
        done = sum(counts.get(k, 0) for k in FINISHED_STATES)
        if again:  # re-measurements come on top of the budget (finished or not)
            done = max(0, done - again)
        b = "best -" if nb is None else "best " + best_text(nb)
        extra = f" (+{again} re-measures)" if again else ""
        pruned = counts.get("pruned", 0)
        return (
            f"{prefix} {done}/{budget} done{extra}, {counts.get('running', 0)} running, "
            f"{counts.get('failed', 0)} failed, {counts.get('infeasible', 0)} infeasible, "
            + (f"{pruned} pruned, " if pruned else "")
            + f"{rej} rejected before launch, {b}"
        ).strip()


def _slots_of(placement: str | None) -> tuple[str, ...]:
    """GPU slot labels (``node:gpu``) of a cluster runner's placement
    (``node1:gpu0,1,node2:gpu0,1``)."""
    out: list[str] = []
    node = ""
    for part in (placement or "").split(","):
        if ":gpu" in part:
            node, _, part = part.partition(":gpu")
        elif not part.isdigit():
            node = ""
        if node and part.isdigit():
            out.append(f"{node}:{part}")
    return tuple(out)
