"""The loss-parity guard in the study loop: the one place a trial's loss is judged.

When a trial finishes complete, :meth:`LossGuard.on_finished` compares its per-step loss
with the baseline's (:mod:`dse.stats.numerics`) and stores the verdict as ``metrics["numerics"]``
(:meth:`dse.storage.Storage.set_trial_numerics`). Storage is the source of every loss: the
reference is the first complete trial of the space's baseline configuration, read with its
steps; the run-to-run noise comes from the study's re-measurements (baseline repeats and
re-measures, each against the trial it repeats). When the baseline itself finishes (after
others, with parallel trials), or a re-measurement changes the noise, every complete trial is
judged again. The controller also judges every trial once when it starts (trials finished by
reconciliation, settings changed on resume). The tolerance in force is kept as the study
attribute ``loss_parity`` (:data:`LOSS_PARITY_ATTR`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dse.core.records import TrialRecord
from dse.loop.context import StudyContext
from dse.space.searchspace import params_key
from dse.stats.numerics import (
    Tolerance,
    floor_of,
    judge,
    loss_drift,
    losses_of,
    tolerance_of,
    verdict,
)

if TYPE_CHECKING:
    pass

__all__ = ["LossGuard", "LOSS_PARITY_ATTR"]

#: Study attribute with the guard's state: ``{"baseline_trial", "tolerance", "floor",
#: "noise", "noise_pairs", "rel_tolerance", "noise_factor"}``.
LOSS_PARITY_ATTR = "loss_parity"


class LossGuard:
    """Judges a study's complete trials against its baseline's loss curve."""

    def __init__(self, ctx: StudyContext) -> None:
        self.ctx = ctx
        self.space = ctx.space
        self.storage = ctx.storage
        self.study_id = ctx.study_id
        self.progress = ctx.progress
        self.settings = ctx.space.loss_parity
        self.baseline_key = params_key(ctx.space.baseline())

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    # --- what storage knows ----------------------------------------------------------------
    def reference(self) -> TrialRecord | None:
        """The baseline trial: the first complete trial of the baseline configuration that
        is not a re-measurement and has a loss (None: none yet)."""
        for t in self.storage.list_trials(
            self.study_id, state="complete", params_key=self.baseline_key, with_steps=True
        ):
            if losses_of(t):
                return t
        return None

    def tolerance(self) -> Tolerance:
        """The tolerance from the floor and every re-measurement against the trial it
        repeats."""
        lp = self.settings
        floor = floor_of(lp.rel_tolerance, self.space.semantics.precision)
        again = self.storage.list_trials(
            self.study_id, state="complete", remeasure=True, with_steps=True
        )
        drifts: list[float] = []
        if again:
            wanted = sorted({t.remeasure_of for t in again if t.remeasure_of is not None})
            firsts = {
                t.number: t
                for t in self.storage.list_trials(
                    self.study_id, state="complete", numbers=wanted, with_steps=True
                )
            }
            for t in again:
                first = firsts.get(t.remeasure_of) if t.remeasure_of is not None else None
                if first is None:
                    continue
                d, _n = loss_drift(losses_of(first), losses_of(t))
                if d is not None:
                    drifts.append(d)
        return tolerance_of(floor, lp.noise_factor, drifts)

    # --- judging -----------------------------------------------------------------------------
    def on_finished(self, rec: TrialRecord) -> TrialRecord:
        """Judge a trial that just finished; returns its record with the verdict. A trial of
        the baseline configuration or a re-measurement (the reference or the noise may have
        changed) makes every complete trial judged again."""
        if not self.enabled or rec.state != "complete":
            return rec
        if rec.params_key == self.baseline_key or rec.remeasure_of is not None:
            self.judge_all()
            return self.storage.get_trial(rec.id, with_steps=False)
        ref = self.reference()
        tol = self.tolerance()
        t = rec if rec.steps else self.storage.get_trial(rec.id)
        return self._store(t, ref, tol)

    def judge_all(self) -> int:
        """Judge every complete trial again; returns how many verdicts changed."""
        if not self.enabled:
            return 0
        ref = self.reference()
        tol = self.tolerance()
        changed = 0
        for t in self.storage.list_trials(self.study_id, state="complete", with_steps=True):
            before = t.metrics.get("numerics")
            after = self._store(t, ref, tol)
            changed += after.metrics.get("numerics") != before
        return changed

    def _store(self, t: TrialRecord, ref: TrialRecord | None, tol: Tolerance) -> TrialRecord:
        self._remember(ref, tol)
        if ref is not None and t.id == ref.id:
            v = verdict(
                "baseline",
                drift=0.0,
                tolerance=tol.value,
                baseline_trial=ref.number,
                steps_compared=len(losses_of(ref)),
            )
        else:
            v = judge(
                losses_of(t),
                None if ref is None else losses_of(ref),
                baseline_trial=None if ref is None else ref.number,
                tol=tol,
            )
        if t.metrics.get("numerics") == v:
            return t
        out = self.storage.set_trial_numerics(t.id, v)
        if v["status"] == "changed":
            self.progress(
                f"trial {t.number}: numerics changed: its loss drifts {v['drift']:.3%} from the "
                f"baseline's (trial {v['baseline_trial']}) over {v['steps_compared']} steps, "
                f"beyond the tolerance {v['tolerance']:.3%}; it is not eligible as best"
                + (" (allowed by loss_parity)" if self.settings.allow_changed_in_best else "")
            )
        return out

    def _remember(self, ref: TrialRecord | None, tol: Tolerance) -> None:
        state: dict[str, Any] = {
            "baseline_trial": None if ref is None else ref.number,
            **tol.as_dict(),
            "rel_tolerance": self.settings.rel_tolerance,
            "noise_factor": self.settings.noise_factor,
        }
        if getattr(self, "_state", None) != state:
            self._state = state
            self.storage.set_study_attr(self.study_id, LOSS_PARITY_ATTR, state)
