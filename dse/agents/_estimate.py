"""A start from the cost model's speed estimate, for the model-based agents without the
knob-semantics prior.

Without the prior (``agent.prior: false``) the start-up trials are random samples unless the
study loop hands the agent a *speed hint*: the cost model's estimate of the objective
(TFLOP/s per GPU, tokens/s per GPU or step time) for a configuration
(:func:`dse.loop.proposer.cost_model_speed_hint`). The estimate is built from the model's shapes,
the layout and the GPU (``dse.model.costmodel.throughput``), not from a table of knob preferences,
so it speaks about whatever model family the cost model covers (dense, MoE, hybrid Mamba),
and the memory wall is left to the memory reasoning the agents share.

The start then proposes, among the unseen configurations that pass the rules and may fit
(the memory check of :class:`dse.agents._prior.PriorGuide`), the one with the best
*corrected* estimate: the estimate times the ratio measured / estimated of the trials that
ran, averaged with weights :data:`DECAY` ** (number of knobs in which the two differ). After
the baseline alone the correction is one number, so the first choice is the estimate's best;
where the estimate was wrong, the configurations near the wrong one inherit its error.

It goes on only while the estimate is right. Once its rank agreement with the study's own
measured trials (Spearman's rho of estimate against measurement, checked before every pick
once three trials measured) falls to :data:`MIN_AGREEMENT`, or one of its picks measured no
better than the best measured before it (or ran out of memory or failed), or no candidate's
corrected estimate beats the best measured value, the picks end, and the rest of the
``n_startup_trials`` start-up trials are random samples, as without the estimate; then the
sampler takes over. The start is as long as without the estimate: its picks take the place
of random start-up trials. (The picks are counted in memory: after a restart the start may
pick again from the corrected estimate.) Every figure here is an estimate used to
order candidates; nothing is recorded as a result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dse.agents._base import SpeedHint
from dse.agents._common import Observation
from dse.agents._prior import PriorGuide
from dse.core.records import SPEED_METRICS
from dse.space.searchspace import SearchSpace, params_key

__all__ = ["DECAY", "MIN_AGREEMENT", "MIN_AGREEMENT_TRIALS", "EstimateGuide"]

#: Weight of a measured trial's correction per knob in which it differs from the candidate.
DECAY = 0.2
#: The estimate steers only while its rank agreement with the study's measured trials
#: (Spearman's rho, from :data:`MIN_AGREEMENT_TRIALS` of them on) stays above this.
MIN_AGREEMENT = 0.0
MIN_AGREEMENT_TRIALS = 3


class EstimateGuide:
    """Chooses start-up configurations from a speed hint (see the module docstring)."""

    def __init__(self, space: SearchSpace, speed_hint: SpeedHint | None, memory: PriorGuide):
        self.space = space
        self._hint = speed_hint
        self._memory = memory
        obj = space.objective
        self.enabled = speed_hint is not None and SPEED_METRICS.get(obj.metric) == obj.direction
        self._sign = 1.0 if obj.direction == "maximize" else -1.0
        self._log_est: dict[str, float | None] = {}
        #: (configuration key, best log value measured when it was picked) of each pick
        self._picks: list[tuple[str, float]] = []
        self._over = False
        self.max_picks = space.agent.n_startup_trials

    def log_estimate(self, params: Mapping[str, Any]) -> float | None:
        """log of the hint's estimate of ``params`` (None where it gives none)."""
        key = params_key(params)
        if key not in self._log_est:
            v = self._hint(params) if self._hint is not None else None
            self._log_est[key] = math.log(v) if v is not None and v > 0 else None
        return self._log_est[key]

    def corrections(self, observations: Sequence[Observation]) -> list[tuple[Any, float]]:
        """(configuration, log(measured / estimated)) of the measured trials."""
        out: list[tuple[Any, float]] = []
        for ob in observations:
            fb = ob.feedback
            if not (fb.measured and fb.values):
                continue
            v = float(fb.values[0])
            e = self.log_estimate(ob.params)
            if v > 0 and math.isfinite(v) and e is not None:
                out.append((ob.params, math.log(v) - e))
        return out

    def predict(
        self, params: Mapping[str, Any], corrections: Sequence[tuple[Any, float]]
    ) -> float | None:
        """log of the corrected estimate of ``params`` (None without an estimate)."""
        e = self.log_estimate(params)
        if e is None:
            return None
        if not corrections:
            return e
        num = den = 0.0
        for p, r in corrections:
            w = DECAY ** _distance(params, p)
            num += w * r
            den += w
        return e + num / den

    def propose(
        self,
        observations: Sequence[Observation],
        candidates: Iterable[Mapping[str, Any]],
        exclude: set[str],
        valid: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> dict[str, Any] | None:
        """The unseen candidate with the largest expected gain ``P(fits) * (corrected
        estimate - best measured)`` on the log scale; None when none promises a gain or the
        picks are over (see the module docstring)."""
        if (
            self._over
            or self._lost(observations)
            or len(self._picks) >= self.max_picks
            or not self._agrees(observations)
        ):
            self._over = True
            return None
        corr = self.corrections(observations)
        ref = self._best(observations)
        if not math.isfinite(ref):
            # nothing measured yet (trials in parallel): against the baseline's estimate
            base = self.predict(self.space.baseline(), corr)
            ref = self._sign * base if base is not None else -math.inf
        fits, ooms, cap = self._memory.memory_evidence(observations)
        best, choice = 0.0, None
        for c in candidates:
            key = params_key(c)
            if key in exclude:
                continue
            pred = self.predict(c, corr)
            if pred is None:
                continue
            gain = self._sign * pred - ref if math.isfinite(ref) else 1.0
            if gain <= 1e-9 or gain <= best:
                continue  # cannot win even if it surely fits
            if valid is not None and not valid(c):
                continue
            gain *= self._memory.p_fits(c, fits, ooms, cap)
            if gain > best + 1e-12:
                best, choice = gain, dict(c)
        if choice is None:
            self._over = True
        else:
            self._picks.append((params_key(choice), ref))
        return choice

    @property
    def n_picks(self) -> int:
        """The configurations picked so far."""
        return len(self._picks)

    def _best(self, observations: Sequence[Observation]) -> float:
        """The best measured value, signed log (-inf before any)."""
        ref = -math.inf
        for ob in observations:
            fb = ob.feedback
            if fb.measured and fb.values and float(fb.values[0]) > 0:
                ref = max(ref, self._sign * math.log(float(fb.values[0])))
        return ref

    def rank_agreement(self, observations: Sequence[Observation]) -> float | None:
        """Spearman's rank correlation between the estimate and what the study measured, over
        its measured trials (signed so that +1 is the estimate ordering them right); None
        before :data:`MIN_AGREEMENT_TRIALS` measured trials with an estimate."""
        pairs: list[tuple[float, float]] = []
        for ob in observations:
            fb = ob.feedback
            if not (fb.measured and fb.values and float(fb.values[0]) > 0):
                continue
            e = self.log_estimate(ob.params)
            if e is not None:
                pairs.append((e, math.log(float(fb.values[0]))))
        if len(pairs) < MIN_AGREEMENT_TRIALS:
            return None
        return _spearman([a for a, _ in pairs], [b for _, b in pairs])

    def _agrees(self, observations: Sequence[Observation]) -> bool:
        """Whether the estimate has earned its steering: its rank agreement with the study's
        own measurements (checked before every pick) is above :data:`MIN_AGREEMENT`, or too
        few trials measured to tell."""
        rho = self.rank_agreement(observations)
        return rho is None or rho > MIN_AGREEMENT

    def _lost(self, observations: Sequence[Observation]) -> bool:
        """Whether a pick that finished measured no better than the best before it."""
        done = {params_key(ob.params): ob.feedback for ob in observations}
        for key, ref in self._picks:
            fb = done.get(key)
            if fb is None:
                continue  # still running
            if not (fb.measured and fb.values and float(fb.values[0]) > 0):
                return True
            if self._sign * math.log(float(fb.values[0])) <= ref + 1e-12:
                return True
        return False


def _spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho with average ranks for ties (0 where one side is constant)."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return 0.0 if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b))
