"""The study loop's conversation with its agent, in one place.

An :class:`AgentSession` restores the agent from storage (finished trials, rejections, a
warm-start study), asks for screened proposals (storing the rejections), ties each launched
trial to the agent's proposal, tells outcomes (or feeds them as history), and keeps the cost
model's calibration up to date with measured peaks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dse.core.exceptions import StudyNotFoundError
from dse.core.records import (
    ANSWERED_STATES,
    FINISHED_STATES,
    MEASURED_STATES,
    Outcome,
    TrialRecord,
)
from dse.loop.context import StudyContext
from dse.loop.proposer import Proposed, Proposer, cost_model_prescreen, feedback_from_outcome
from dse.space.searchspace import params_key

if TYPE_CHECKING:
    from dse.agents import BaseAgent

__all__ = ["AgentSession", "outcome_of_record"]

log = logging.getLogger("dse.loop.study")


def outcome_of_record(t: TrialRecord) -> Outcome:
    """The outcome a finished trial record stands for (a ``pruned`` trial: its measured
    figures, whose ``measurement`` says it stopped as dominated)."""
    if t.state in MEASURED_STATES:
        return Outcome("ok", dict(t.metrics), source=t.source or "measured")  # type: ignore[arg-type]
    return Outcome.failure(
        t.failure_class or "error", t.reason or "", metrics=dict(t.metrics),
        source=t.source or "measured",  # type: ignore[arg-type]
    )  # fmt: skip


class AgentSession:
    """Every ask, tell, restore and warm start of one study's agent."""

    def __init__(self, ctx: StudyContext, agent: BaseAgent, *, cost_model: Any = None) -> None:
        self.ctx = ctx
        self.space = ctx.space
        self.agent = agent
        self.storage = ctx.storage
        self.study_id = ctx.study_id
        self.cost_model = cost_model
        self.progress = ctx.progress
        self.proposer = Proposer(
            ctx.space,
            agent,
            ctx.features,
            prescreen=cost_model_prescreen(ctx.space, cost_model),
            on_reject=self._store_rejection,  # stored and shown as they happen
            on_progress=ctx.progress,
            stopping=ctx.stopping,
        )
        #: storage trial id -> the agent's id of the proposal it runs
        self._agent_ids: dict[int, str] = {}

    # --- restore ---------------------------------------------------------------------------
    def restore(self) -> None:
        """Tell the agent what storage knows: finished trials and rejections as history, then
        a warm-start study; the cost model observes the measured peaks."""
        trials = self.storage.list_trials(self.study_id)
        n = 0
        for t in trials:
            if t.state in FINISHED_STATES:
                self.agent.add_evaluated(t.params, self._feedback(outcome_of_record(t)))
                n += 1
        for r in self.storage.list_rejections(self.study_id):
            out = Outcome.failure(r.kind, r.reason, source="rules")
            self.agent.add_evaluated(r.params, self._feedback(out))
        if n:
            self.progress(f"agent restored from storage: {n} finished trials")
        if self.space.agent.warm_start_study:
            self._warm_start_from(self.space.agent.warm_start_study)
        if self.cost_model is not None:
            for t in trials:
                self.observe_cost(t.params, outcome_of_record(t))
            attrs = self.storage.get_study_attrs(self.study_id)
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
            self.agent.add_evaluated(params, self._feedback(outcome_of_record(t)))
            n += 1
        self.progress(f"warm start: {n} trials of study {name!r} told to the agent")

    # --- ask -------------------------------------------------------------------------------
    def propose(self, n: int) -> Proposed:
        """Up to ``n`` launchable proposals; rejections are stored, duplicates answered."""

        def lookup(key: str) -> Outcome | None:
            if self.space.budget.repeats:
                return None
            t = self.storage.find_trial(self.study_id, key)
            return None if t is None else outcome_of_record(t)

        return self.proposer.propose(n, lookup=lookup)

    def _store_rejection(self, rej: Any) -> None:
        """A proposal rejected before launch: stored and shown right away."""
        self.storage.add_rejection(
            study_id=self.study_id,
            params=rej.params,
            params_key=rej.params_key,
            kind=rej.kind,
            rule=rej.rule,
            reason=rej.reason,
            values=rej.values,
        )
        self.progress(f"rejected before launch ({rej.kind}): {rej.rule}: {rej.reason}")

    def bind(self, trial_id: int, agent_trial_id: str) -> None:
        """Storage trial ``trial_id`` runs the agent's proposal ``agent_trial_id``."""
        self._agent_ids[trial_id] = agent_trial_id

    def not_run(self, agent_trial_id: str, reason: str) -> None:
        """A proposal that got no trial (budget spent, configuration taken elsewhere)."""
        self.agent.tell(agent_trial_id, self._feedback(Outcome.failure("error", reason)))

    # --- tell ------------------------------------------------------------------------------
    def tell(self, rec: TrialRecord, outcome: Outcome) -> None:
        """A trial finished: tell the agent (history for a trial of an earlier run), let the
        cost model observe it and store its calibration."""
        fb = self._feedback(outcome)
        agent_tid = self._agent_ids.pop(rec.id, None)
        if agent_tid is not None:
            self.agent.tell(agent_tid, fb)
        else:  # re-queued trial of an earlier run: feed it as history
            self.agent.add_evaluated(rec.params, fb)
        self.observe_cost(rec.params, outcome)
        if self.cost_model is not None:
            self.storage.set_study_attr(self.study_id, "costmodel", self.cost_model.calibration())

    def observe_cost(self, params: dict[str, Any], outcome: Outcome) -> None:
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

    def _feedback(self, outcome: Outcome) -> Any:
        return feedback_from_outcome(self.space, outcome)
