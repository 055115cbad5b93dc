"""Launching one trial: its folder, its spec, the runner's submit, its ``running`` row.

A launch the runner cannot make (a missing interpreter, an unwritable folder:
:class:`~dse.core.exceptions.TrialLaunchError`) is the trial's failure, returned as an
:class:`~dse.core.records.Outcome` (class ``error``), never an exception that ends the study.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dse.core.exceptions import SpaceError, TrialLaunchError
from dse.core.records import Outcome, TrialRecord, TrialSpec
from dse.loop.context import StudyContext
from dse.runners import OWNER_ENV, BaseRunner, Launch
from dse.space.knobs import KNOBS, trial_env
from dse.space.searchspace import SearchSpace
from dse.stats.measure import prune_target
from dse.workloads import trial_command
from dse.workloads.launchers import NotTaken, launcher_for

if TYPE_CHECKING:
    pass

__all__ = ["TrialDispatcher", "short_params", "trial_launch", "trial_spec"]


class TrialDispatcher:
    """Writes a trial's spec and submits it to ``runner`` as ``owner``.

    Args:
        workdir: the study's folder (``<runner.workdir>/<study>``); trial ``n`` runs in
            ``trial-0000n`` under it (only for runners whose trials use files).
    """

    def __init__(
        self, ctx: StudyContext, runner: BaseRunner, owner: str, *, workdir: Path
    ) -> None:
        self.ctx = ctx
        self.space = ctx.space
        self.storage = ctx.storage
        self.runner = runner
        self.owner = owner
        self.features = ctx.features
        self.workdir = workdir
        self.progress = ctx.progress

    def prune_target(self, t: TrialRecord) -> dict[str, Any] | None:
        """The study's best when ``t`` starts, as the trial's ``prune`` target (None when the
        space does not prune or there is no best yet)."""
        s = self.space
        if not s.measurement.prune:
            return None
        best = self.storage.best_trial(t.study_id, s.objective.direction)
        if best is None:
            return None
        target = prune_target(
            s.objective.metric,
            s.objective.direction,
            best_value=best.value,
            best_metrics=best.metrics,
            margin=s.measurement.prune_margin,
            best_trial=best.number,
        )
        return None if target is None else target.model_dump(mode="json")

    def spec(self, t: TrialRecord, metrics_path: str, workload: dict[str, Any]) -> TrialSpec:
        return trial_spec(
            self.space,
            t.params,
            metrics_path,
            trial_number=t.number,
            workload=workload,
            features=self.features,
            prune=self.prune_target(t),
        )

    def launch(self, t: TrialRecord) -> Outcome | None:
        """Start trial ``t``; None when it runs, its failure when it could not start."""
        s = self.space
        tdir = (self.workdir / f"trial-{t.number:05d}").resolve()
        metrics = tdir / "metrics.jsonl"
        env, workload = trial_launch(s, t.params)
        if s.workload.name == "replay":
            # the k-th run of a configuration answers with its k-th measurement of the table
            runs = self.storage.list_trials(t.study_id, params_key=t.params_key)
            workload["repeat"] = sum(1 for r in runs if r.number < t.number)
        spec = self.spec(t, str(metrics), workload)
        argv: list[str] = []
        try:
            if self.runner.uses_files:
                tdir.mkdir(parents=True, exist_ok=True)
                if metrics.exists():  # a re-queued trial starts clean
                    metrics.rename(tdir / f"metrics.{int(time.time())}.jsonl.old")
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
                env={**env, OWNER_ENV: self.owner},
                timeout_s=s.budget.trial_timeout_s,
                hang_timeout_s=s.budget.hang_timeout_s,
                spec=spec,
            )
            self.runner.submit(launch)
        except (TrialLaunchError, OSError) as e:
            why = str(e) if isinstance(e, TrialLaunchError) else f"{tdir}: {e}"
            self.progress(f"trial {t.number} could not be launched: {why}")
            return Outcome.failure("error", f"launch failed: {why}")
        files = self.runner.uses_files
        self.storage.start_trial(
            t.id,
            runner=self.owner,
            host=self.runner.host,
            log_path=str(launch.log_path) if files else None,
            metrics_path=str(metrics) if files else None,
        )
        self.progress(f"trial {t.number} started: {short_params(t.params)}")
        return None


def trial_spec(
    space: SearchSpace,
    params: Mapping[str, Any],
    metrics_path: str | Path,
    *,
    trial_number: int = 0,
    workload: dict[str, Any] | None = None,
    features: Iterable[str] | None = None,
    measurement: dict[str, Any] | None = None,
    prune: dict[str, Any] | None = None,
) -> TrialSpec:
    """The trial spec (``trial.json``) of configuration ``params`` of ``space``: what a trial
    process reads. The study loop's launches and the benches that run the trainer in their
    own process build it here.

    ``params`` are the explored knob values (the space's fixed and derived ones are added);
    ``features``: the features declared present (None: the trial process detects them);
    ``measurement``: a ``MeasurementSpec`` dict instead of the space's; ``prune``: a
    ``PruneTarget`` dict (:func:`dse.stats.measure.prune_target`).
    """
    r = space.resources
    return TrialSpec(
        study=space.study,
        trial_number=trial_number,
        params=space.full_params(dict(params)),
        model=space.model.model_dump(),
        semantics=space.semantics.model_dump(),
        world_size=r.world_size,
        device=r.device,
        metrics_path=str(metrics_path),
        workload=dict(workload or {}),
        features=None if features is None else sorted(features),
        gpu=r.gpu,
        gpu_memory_gib=r.gpu_memory_gib,
        measurement=space.measurement.model_dump(mode="json")
        if measurement is None
        else measurement,
        prune=prune,
    )


def short_params(params: dict[str, Any]) -> str:
    """``params`` for a progress line, each knob by its catalog abbreviation
    (:attr:`dse.space.knobs.Knob.abbrev`) where it has one."""

    def short(name: str) -> str:
        knob = KNOBS.get(name)
        return knob.abbrev if knob is not None and knob.abbrev else name

    return " ".join(f"{short(k)}={v}" for k, v in params.items())


def trial_launch(space: SearchSpace, params: dict[str, Any]) -> tuple[dict[str, str], dict]:
    """(environment of every rank, trial spec ``workload`` dict) of a trial: the space's
    ``env`` section and ``env.*`` knobs; for a recipe launcher also the rendered command."""

    full = space.full_params(params)
    workload = space.workload.model_dump()
    workload["node_steps"] = list(space.env.node_steps)
    env = trial_env(full, space.env.fixed)
    if space.workload.launcher is not None:
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
