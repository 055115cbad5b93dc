"""A knob-semantics prior for the first trials of the model-based agents.

Optuna's samplers need a handful of observations before their model beats random search;
in a space of a few dozen configurations those random start-up trials are most of the
budget. The model-based agents therefore replace them with a *structured start* built from
what each knob does in Megatron-Core (never from any measured table):

* **Throughput prior.** Each knob value gets a preference in [0, 1] and each knob a weight,
  an order-of-magnitude guess of its effect on log step time: fused kernels and overlapped
  communication beat unfused / exposed ones; no activation recompute beats selective, which
  beats full (full recompute repeats the forward pass); fused attention beats torch SDPA,
  which beats the unfused local attention; larger micro-batches use the GPU better; smaller
  model-parallel sizes (TP, PP, CP) communicate less. A configuration's prior score is the
  weighted sum of its preferences. (Sources: the knob catalog, reference/megatron-knobs.md;
  Megatron-LM / NeMo performance guides.)
* **Memory order.** Knobs that trade memory for speed (micro-batch size, recompute,
  TP/PP/CP, sequence parallelism, the distributed optimizer, unfused attention) get a
  monotone "uses more memory" order. Two sound inferences follow. (1) A configuration that
  uses at least as much memory on every such knob as one that ran out of memory will run out
  too: it is skipped. (2) Memory grows at most in proportion to the micro-batch size and to
  1/TP, 1/PP, 1/CP (the parts that do not scale only make it grow less), so from a measured
  peak the agent bounds the peak of a larger micro-batch or a smaller parallel size; the
  probability that it fits is the share of the interval [measured, bound] under the GPU's
  capacity. Memory effects with no such bound (e.g. dropping recompute) count as a coin flip.
* **Memory hint.** When the study loop hands the agent a memory hint (the cost model's
  predicted peak and its relative uncertainty, calibrated on the trials measured so far),
  a configuration not settled by (1) or by a bound that proves it fits gets the probability
  that the prediction is below the capacity: ``Phi((cap - pred) / (sd * pred))``. So after
  an OOM the start moves to the fast configurations predicted to fit (a larger TP, say)
  instead of trying the next smaller one blindly. The hint only weighs candidates; it never
  rejects one (that is the pre-screen's job, when it is on).

The start proposes the unseen configuration with the largest *expected prior gain*
``P(fits) * (score(c) - score(incumbent))``, the incumbent being the best measured
configuration; ties go to the configuration with fewer changes from the incumbent. It stops
after ``n_startup_trials`` launched trials or as soon as no candidate promises a gain, and
the Optuna sampler takes over with everything measured so far.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dse.agents._base import MemoryHint
from dse.agents._common import Observation
from dse.core.records import OOM_CLASSES, SPEED_METRICS, finite
from dse.space.knobs import KNOBS, Knob
from dse.space.searchspace import SearchSpace, params_key

__all__ = ["KnobPrior", "PRIORS", "PriorGuide", "prior_of"]


#: Probability that an unbounded memory increase (one knob) still fits.
P_UNKNOWN = 0.5


def _numeric(values: Sequence[Any]) -> list[float]:
    cached = getattr(values, "numeric", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    return sorted(
        {float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)}
    )


class _Values(tuple[Any, ...]):
    """A knob's values with their sorted numbers computed once: a preference reads them
    for every candidate it scores (O(values) each time: 16.8 million steps per proposal for
    one knob of 4,096 values)."""

    numeric: list[float]

    def __new__(cls, values: Sequence[Any]) -> _Values:
        self = super().__new__(cls, values)
        self.numeric = _numeric(list(values))
        return self


def _larger(v: Any, values: Sequence[Any]) -> float:
    """Preference growing with log2 of the value among the domain's numbers (None: neutral)."""
    nums = _numeric(values)
    if v is None or isinstance(v, bool) or len(nums) < 2:
        return 0.5
    lo, hi = math.log2(max(nums[0], 1e-9)), math.log2(max(nums[-1], 1e-9))
    if hi == lo:
        return 0.5
    return (math.log2(max(float(v), 1e-9)) - lo) / (hi - lo)


def _smaller(v: Any, values: Sequence[Any]) -> float:
    return 1.0 - _larger(v, values) if v is not None else 0.5


def _true(v: Any, values: Sequence[Any]) -> float:
    return 1.0 if v is True else 0.0


def _false(v: Any, values: Sequence[Any]) -> float:
    return 1.0 if v is False else 0.0


def _table(prefs: Mapping[Any, float]) -> Callable[[Any, Sequence[Any]], float]:
    return lambda v, values: prefs.get(v, 0.5)


def _num(v: Any) -> float:
    f = finite(v)
    return 0.0 if f is None else f


@dataclass(frozen=True)
class KnobPrior:
    """What the prior knows about one knob.

    Attributes:
        pref: preference of a value for throughput, in [0, 1] (the domain is passed along).
        weight: rough effect of the knob on log throughput (its preference is scaled by it).
        mem: a monotone key, larger = more memory per GPU; None when memory does not depend
            on the knob (to first order).
        scale: ``up``: peak memory grows at most in proportion to the value; ``down``: at most
            in proportion to 1/value; None: no bound.
    """

    pref: Callable[[Any, Sequence[Any]], float]
    weight: float
    mem: Callable[[Any], float] | None = None
    scale: Literal["up", "down"] | None = None


_ORDERS: dict[str, Callable[[Any, Sequence[Any]], float]] = {
    "true": _true,
    "false": _false,
    "larger": _larger,
    "smaller": _smaller,
}


def _memory_key(memory: Any) -> Callable[[Any], float] | None:
    if memory is None:
        return None
    if memory == "larger":
        return _num
    if memory == "smaller":
        return lambda v: -_num(v)
    return lambda v: float(memory.get(v, 0.0))


def prior_of(knob: Knob) -> KnobPrior | None:
    """The prior of a catalog knob, from its :attr:`~dse.space.knobs.Knob.prefer` (None:
    neutral)."""
    p = knob.prefer
    if p is None:
        return None
    pref = _ORDERS[p.order] if isinstance(p.order, str) else _table(dict(p.order))
    return KnobPrior(pref, p.weight, mem=_memory_key(p.memory), scale=p.scale)


#: Knob name -> prior, read from the knob catalog (:attr:`dse.space.knobs.Knob.prefer`); knobs
#: without a preference are neutral (no preference, no memory order).
PRIORS: dict[str, KnobPrior] = {
    name: prior for name, knob in KNOBS.items() if (prior := prior_of(knob)) is not None
}


def _mem_of(fb_metrics: Mapping[str, Any]) -> float | None:
    vals = [
        float(v)
        for v in (fb_metrics.get("peak_reserved_gib"), fb_metrics.get("peak_mem_gib"))
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    return max(vals) if vals else None


class PriorGuide:
    """Chooses the structured-start configurations (see the module docstring)."""

    def __init__(
        self, space: SearchSpace, rng: random.Random, memory_hint: MemoryHint | None = None
    ) -> None:
        self.space = space
        self._rng = rng
        self._hint = memory_hint
        #: the memory hint this guide weighs candidates with (None: none)
        self.hint = memory_hint
        obj = space.objective
        self.enabled = SPEED_METRICS.get(obj.metric) == obj.direction
        self._sign = 1.0 if obj.direction == "maximize" else -1.0
        self._priors = {n: PRIORS[n] for n in space.knobs if n in PRIORS}
        self._mem_knobs = [(n, p) for n, p in self._priors.items() if p.mem is not None]
        self._values = {n: _Values(space.knobs[n].values()) for n in self._priors}
        self._cap = space.resources.gpu_memory_gib

    # --- scores ----------------------------------------------------------------------------
    def score(self, params: Mapping[str, Any]) -> float:
        """The prior score of a configuration (weighted sum of value preferences)."""
        s = 0.0
        for name, pr in self._priors.items():
            s += pr.weight * pr.pref(params[name], self._values[name])
        return s

    def ideal(self, start: Mapping[str, Any]) -> dict[str, Any]:
        """``start`` with every knob moved to its most preferred value (ties: unchanged)."""
        out = dict(start)
        for name, pr in self._priors.items():
            values = self._values[name]
            best = max(pr.pref(v, values) for v in values)
            if pr.pref(out[name], values) < best:
                out[name] = next(v for v in values if pr.pref(v, values) == best)
        return self.space.apply_conditions(out)

    def _mem_geq(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        """Whether ``a`` uses at least as much memory as ``b`` on every memory knob."""
        return all(p.mem(a[n]) >= p.mem(b[n]) for n, p in self._mem_knobs if p.mem)

    def p_fits(
        self,
        c: Mapping[str, Any],
        fits: Sequence[tuple[Mapping[str, Any], float | None]],
        ooms: Sequence[Mapping[str, Any]],
        cap: float | None,
        *,
        strict: bool = False,
    ) -> float:
        """Probability that ``c`` fits in memory, from the configurations measured so far
        (and the memory hint, where there is one). With ``strict``, only a configuration
        that uses more memory than a measured OOM on some memory knob (and no less on any)
        is certain not to fit; one equal to it on every memory knob may still fit (the
        knobs without a memory order move memory a little too)."""
        for o in ooms:
            if self._mem_geq(c, o) and not (strict and self._mem_geq(o, c)):
                return 0.0
        best = 0.0 if fits else P_UNKNOWN
        for f, m in fits:
            best = max(best, self._p_from(c, f, m, cap))
            if best >= 1.0:
                return 1.0
        hinted = self._p_hint(c, cap)
        return best if hinted is None else hinted

    def _p_hint(self, c: Mapping[str, Any], cap: float | None) -> float | None:
        if self._hint is None or cap is None:
            return None
        got = self._hint(c)
        if got is None:
            return None
        pred, sd = got
        if not (pred > 0 and sd > 0):
            return None
        return 0.5 * math.erfc((pred - cap) / (sd * pred * math.sqrt(2.0)))

    def _p_from(
        self, c: Mapping[str, Any], f: Mapping[str, Any], m: float | None, cap: float | None
    ) -> float:
        ratio, unknown = 1.0, 0
        for name, pr in self._mem_knobs:
            assert pr.mem is not None
            if pr.mem(c[name]) <= pr.mem(f[name]):
                continue
            a, b = _num(c[name]), _num(f[name])
            if pr.scale is not None and m is not None and cap is not None and a > 0 and b > 0:
                ratio *= a / b if pr.scale == "up" else b / a
            else:
                unknown += 1
        p = 1.0
        if ratio > 1.0 and m is not None and cap is not None:
            bound = m * ratio
            p = 1.0 if bound <= cap else max(0.0, (cap - m) / (bound - m))
        return p * P_UNKNOWN**unknown

    def memory_evidence(
        self, observations: Sequence[Observation]
    ) -> tuple[
        list[tuple[Mapping[str, Any], float | None]], list[Mapping[str, Any]], float | None
    ]:
        """(fitting configurations with their measured peak, OOM configurations, capacity)."""
        fits: list[tuple[Mapping[str, Any], float | None]] = []
        ooms: list[Mapping[str, Any]] = []
        cap = self._cap
        for ob in observations:
            fb = ob.feedback
            if cap is None and isinstance(fb.metrics.get("gpu_memory_gib"), int | float):
                cap = float(fb.metrics["gpu_memory_gib"])
            if fb.measured:
                fits.append((ob.params, _mem_of(fb.metrics)))
            elif fb.state == "infeasible" and fb.failure_class in OOM_CLASSES:
                ooms.append(ob.params)
        return fits, self._minimal(ooms), cap

    def _minimal(self, ooms: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The OOM configurations not at least as large as another one (the others say
        nothing more: whatever is as large as them is as large as a smaller one)."""
        out: list[Mapping[str, Any]] = []
        for o in sorted(ooms, key=self._mem_size):
            if not any(self._mem_geq(o, m) for m in out):
                out.append(o)
        return out

    def _mem_size(self, c: Mapping[str, Any]) -> float:
        return sum(p.mem(c[n]) for n, p in self._mem_knobs if p.mem)

    # --- choice ----------------------------------------------------------------------------
    def propose(
        self,
        observations: Sequence[Observation],
        candidates: Iterable[Mapping[str, Any]],
        exclude: set[str],
        valid: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> dict[str, Any] | None:
        """The candidate with the largest expected prior gain, or None when none promises one;
        with ``valid``, only candidates that pass it (the validity rules) are chosen."""
        fits, ooms, cap = self.memory_evidence(observations)
        incumbent: Mapping[str, Any] | None = None
        best_v = -math.inf
        for ob in observations:
            fb = ob.feedback
            if fb.measured and fb.values:
                v = self._sign * float(fb.values[0])
                if v > best_v:
                    best_v, incumbent = v, ob.params
        ref = self.score(incumbent) if incumbent is not None else -math.inf
        best: tuple[float, float] | None = None
        choice: dict[str, Any] | None = None
        for c in candidates:
            if params_key(c) in exclude:
                continue
            s = self.score(c)
            gain = s - ref if incumbent is not None else 1.0 + s
            if gain <= 1e-9:
                continue
            dist = 0 if incumbent is None else sum(c[k] != incumbent[k] for k in c)
            if best is not None and gain - 1e-6 * dist < best[0]:
                continue  # cannot win even if it surely fits (P(fits) <= 1)
            p = self.p_fits(c, fits, ooms, cap)
            if p <= 0.0:
                continue
            key = (p * gain - 1e-6 * dist, self._rng.random())
            if best is None or key > best:
                if valid is not None and not valid(c):
                    continue
                best, choice = key, dict(c)
        return choice
