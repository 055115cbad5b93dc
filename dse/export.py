"""The best configuration of a study as a payload and as launcher text.

Shared by ``dse best`` (:mod:`dse.cli`) and the REST API (:mod:`dse.api`), so both print the
same thing.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import yaml

from dse.exceptions import NoCompleteTrialError
from dse.knobs import to_bridge_overrides, to_megatron_args, to_nemo_overrides
from dse.noise import NoisyBest, exclude_changed, study_best
from dse.records import BEST_FORMATS, BestFormat
from dse.run_settings import effective_space
from dse.space import SearchSpace, parse_space_text

__all__ = ["best_payload", "noise_payload", "render_best"]


#: How a trial was measured, when it says (its intervals, the measurement, the numerics
#: check): passed on with the best configuration's figures.
MEASUREMENT_DETAILS = ("tflops_per_gpu_ci", "step_time_ci_s", "measurement", "numerics")
#: The pooled figures of the best configuration that have an interval, and its key in
#: ``metrics`` (a trial's own interval keys; tokens/s per GPU follows from the step time).
_POOLED_CI = {
    "tflops_per_gpu": "tflops_per_gpu_ci",
    "step_time_s": "step_time_ci_s",
    "tokens_per_s_per_gpu": "tokens_per_s_per_gpu_ci",
}


def best_payload(storage: Any, study: Any, best: NoisyBest | None = None) -> dict[str, Any]:
    """The best configuration of a study (or ``best``, its noise-aware best already found)
    as the ``dse best`` / REST payload.

    The best is noise-aware (:mod:`dse.noise`): the configuration with the best pooled
    objective over its trials, configurations flagged numerics ``changed`` by the loss-parity
    guard left out unless the space allows them. ``trial`` is the configuration's first trial
    (its source and loss-parity verdict ``numerics``); ``objective.value`` and the figures in
    ``metrics`` (TFLOP/s, step time, tokens/s, peak memory, and their intervals
    ``*_ci``) are the pooled ones (the trial's own when the configuration ran once); ``noise``
    holds each figure with its 95 % interval, the pooled trials and the configurations tied
    with it.

    Raises:
        NoCompleteTrialError: the study has no complete trial (eligible as best) yet.
        SpaceError: the stored space of the study no longer validates.
    """
    space = effective_space(study.space_yaml, study.name, storage.get_study_attrs(study.id))
    nb = best if best is not None else study_best(storage, study, space)
    if nb is None:
        raise NoCompleteTrialError(_why_no_best(storage, study, space))
    t = nb.best.trial or storage.get_trial_by_number(study.id, nb.best.number, with_steps=False)
    full = space.full_params(t.params)
    m = t.metrics
    metrics: dict[str, Any] = {
        "tflops_per_gpu": m.get("tflops_per_gpu"),
        "peak_mem_gib": m.get("peak_mem_gib"),
        "peak_reserved_gib": m.get("peak_reserved_gib"),
        "step_time_s": m.get("step_time_s"),
        "loss": m.get("loss"),
        **{k: m[k] for k in MEASUREMENT_DETAILS if k in m},
    }
    # the configuration's figures are its pooled ones (dse.noise), the same ones with the
    # same intervals wherever the best is shown, not its first trial's own
    for k, f in nb.best.figures.items():
        if k in metrics or k in _POOLED_CI:
            metrics[k] = f.value
        if k in _POOLED_CI and f.ci is not None:
            metrics[_POOLED_CI[k]] = list(f.ci)
        elif k in _POOLED_CI:  # no interval known for the configuration
            metrics.pop(_POOLED_CI[k], None)
    return {
        "study": study.name,
        "trial": t.number,
        "objective": {
            "metric": study.metric,
            "direction": study.direction,
            "value": nb.best.objective.value,
        },
        "params": full,
        "metrics": metrics,
        "source": t.source,
        "model": study.model,
        "hardware": study.hardware,
        "numerics": m.get("numerics"),
        "noise": noise_payload(nb),
    }


def noise_payload(nb: NoisyBest) -> dict[str, Any]:
    """The ``noise`` block of a best payload (documented in docs/api.md, ``BestNoisePublic``)."""
    b = nb.best
    return {
        "trials": list(b.trials),
        "n_trials": b.n,
        "figures": {k: f.as_dict() for k, f in b.figures.items()},
        "interval_source": b.source,
        "rel_sd": nb.rel_sd,
        "tied": [
            {
                "trial": c.number,
                "trials": list(c.trials),
                "value": c.objective.value,
                "ci": None if c.objective.ci is None else list(c.objective.ci),
                "params": dict(c.params),
            }
            for c in nb.tied
        ],
        "message": nb.message,
    }


def _why_no_best(storage: Any, study: Any, space: SearchSpace) -> str:
    base = f"study {study.name!r} has no complete trial yet"
    if exclude_changed(space) and storage.best_trial(study.id, study.direction) is not None:
        return (
            f"study {study.name!r} has no complete trial eligible as best: every complete "
            "trial is flagged numerics changed by the loss-parity guard (its loss drifts from "
            "the baseline's; loss_parity.allow_changed_in_best: true admits them)"
        )
    return base


@lru_cache(maxsize=64)
def _stored_space(space_yaml: str, name: str) -> SearchSpace:
    """The parsed space of a study (cached: a stored space never changes; spaces are frozen)."""
    return parse_space_text(space_yaml, f"study {name!r}")


def render_best(payload: dict[str, Any], fmt: BestFormat, num_layers: int | None = None) -> str:
    """``payload`` as JSON, YAML, Megatron-LM arguments or Bridge / NeMo-Run overrides
    (``fmt``: one of :data:`dse.records.BEST_FORMATS`).

    Raises:
        ValueError: an unknown format, or a configuration the exporter cannot express.
    """
    params = payload["params"]
    if fmt == "json":
        return json.dumps(payload, indent=2)
    if fmt == "yaml":
        return yaml.safe_dump(payload, sort_keys=False)
    if fmt == "megatron":
        return " ".join(to_megatron_args(params, num_layers=num_layers))
    if fmt == "bridge":
        return " ".join(f"{k}={_ov(v)}" for k, v in to_bridge_overrides(params).items())
    if fmt == "nemo":
        return " ".join(f"{k}={_ov(v)}" for k, v in to_nemo_overrides(params).items())
    raise ValueError(f"unknown format {fmt!r}; known formats: {', '.join(BEST_FORMATS)}")


def _ov(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(map(str, v)) + "]"
    return str(v)
