"""A start from the cost model's speed estimate, for the model-based agents without the
knob-semantics prior.

Without the prior (``agent.prior: false``) the start-up trials are random samples unless the
study loop hands the agent a *speed hint*: the cost model's estimate of the objective
(TFLOP/s per GPU, tokens/s per GPU or step time) for a configuration
(:func:`dse.proposer.cost_model_speed_hint`). The estimate is built from the model's shapes,
the layout and the GPU (``dse.costmodel.throughput``), not from a table of knob preferences,
so it speaks about whatever model family the cost model covers (dense, MoE, hybrid Mamba),
and the memory wall is left to the memory reasoning the agents share.

The start then proposes, among the unseen configurations that pass the rules and may fit
(the memory check of :class:`dse.agents._prior.PriorGuide`), the one with the best
*corrected* estimate: the estimate times the ratio measured / estimated of the trials that
ran, averaged with weights :data:`DECAY` ** (number of knobs in which the two differ). After
the baseline alone the correction is one number, so the first choice is the estimate's best;
where the estimate was wrong, the configurations near the wrong one inherit its error. The
start hands over to the sampler after ``n_startup_trials`` launched trials, or as soon as no
candidate's corrected estimate beats the best measured value. Every figure here is an
estimate used to order candidates; nothing is recorded as a result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dse.agents._base import SpeedHint
from dse.agents._common import Observation
from dse.agents._prior import SPEED_METRICS, PriorGuide
from dse.space import SearchSpace, params_key

__all__ = ["DECAY", "EstimateGuide"]

#: Weight of a measured trial's correction per knob in which it differs from the candidate.
DECAY = 0.2


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
        estimate - best measured)`` on the log scale, or None when none promises a gain."""
        corr = self.corrections(observations)
        ref = -math.inf
        for ob in observations:
            fb = ob.feedback
            if fb.measured and fb.values and float(fb.values[0]) > 0:
                ref = max(ref, self._sign * math.log(float(fb.values[0])))
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
        return choice


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b))
