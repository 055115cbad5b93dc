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
from dse.records import BEST_FORMATS, BestFormat
from dse.space import SearchSpace, parse_space_text

__all__ = ["best_payload", "render_best"]


#: How a trial was measured, when it says (its intervals, the measurement, the numerics
#: check): passed on with the best configuration's figures.
MEASUREMENT_DETAILS = ("tflops_per_gpu_ci", "step_time_ci_s", "measurement", "numerics")


def best_payload(storage: Any, study: Any, best: Any = None) -> dict[str, Any]:
    """The best feasible trial of a study (or ``best``, a trial record of it) as the
    ``dse best`` / REST payload.

    Raises:
        NoCompleteTrialError: the study has no complete trial yet.
        SpaceError: the stored space of the study no longer validates.
    """
    best = best if best is not None else storage.best_trial(study.id, study.direction)
    if best is None:
        raise NoCompleteTrialError(f"study {study.name!r} has no complete trial yet")
    space = _stored_space(study.space_yaml, study.name)
    full = space.full_params(best.params)
    m = best.metrics
    return {
        "study": study.name,
        "trial": best.number,
        "objective": {"metric": study.metric, "direction": study.direction, "value": best.value},
        "params": full,
        "metrics": {
            "tflops_per_gpu": m.get("tflops_per_gpu"),
            "peak_mem_gib": m.get("peak_mem_gib"),
            "peak_reserved_gib": m.get("peak_reserved_gib"),
            "step_time_s": m.get("step_time_s"),
            "loss": m.get("loss"),
            **{k: m[k] for k in MEASUREMENT_DETAILS if k in m},
        },
        "source": best.source,
        "model": study.model,
        "hardware": study.hardware,
    }


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
