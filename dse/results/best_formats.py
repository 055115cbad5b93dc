"""The best configuration of a study as a payload and as launcher text.

Shared by ``dse best`` (:mod:`dse.cli.main`), the REST API (:mod:`dse.api`) and the report, so
all print the same thing. The launcher text of a format is the knob and environment part
of the best trial's launch command on that format's recipe target, rendered by the target's
own launcher plugin: the entry points hand :func:`render_best` that renderer
(``dse.workloads.launchers.flags.export_text``), which this layer does not import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import yaml

from dse.core.exceptions import NoCompleteTrialError
from dse.core.records import BEST_FORMATS, BestFormat, StudyRecord
from dse.results.noise import NoisyBest, exclude_changed, study_best
from dse.results.reads import StudyReads
from dse.results.run_settings import effective_space
from dse.results.trust import trust_summary
from dse.space.searchspace import SearchSpace, parse_space_text

__all__ = [
    "EXPORT_TARGETS",
    "FlagsText",
    "best_payload",
    "best_space",
    "noise_payload",
    "render_best",
]

#: The recipe target (a launcher plugin) of each launcher format of ``dse best --format``.
EXPORT_TARGETS: dict[str, str] = {"megatron": "megatron_lm", "bridge": "bridge", "nemo": "nemo"}

#: Renders the knob and environment part of a trial's launch command on a recipe target as
#: text, ``(space, params, target) -> text``; raises
#: :class:`~dse.core.exceptions.NoEquivalentError` for a value the target cannot express.
FlagsText = Callable[[SearchSpace, Mapping[str, Any], str], str]


#: How a trial was measured, when it says (its intervals, the measurement, the numerics
#: check, the clock of its step times with the wall time beside a CPU time): passed on with
#: the best configuration's figures.
MEASUREMENT_DETAILS = ("tflops_per_gpu_ci", "step_time_ci_s", "measurement", "numerics",
                       "step_clock", "step_wall_time_s")  # fmt: skip
#: The pooled figures of the best configuration that have an interval, and its key in
#: ``metrics`` (a trial's own interval keys; tokens/s per GPU follows from the step time).
_POOLED_CI = {
    "tflops_per_gpu": "tflops_per_gpu_ci",
    "step_time_s": "step_time_ci_s",
    "tokens_per_s_per_gpu": "tokens_per_s_per_gpu_ci",
}


def best_payload(
    storage: StudyReads, study: StudyRecord, best: NoisyBest | None = None
) -> dict[str, Any]:
    """The best configuration of a study (or ``best``, its noise-aware best already found)
    as the ``dse best`` / REST payload.

    The best is noise-aware (:mod:`dse.results.noise`): the configuration with the best pooled
    objective over its trials, configurations flagged numerics ``changed`` by the loss-parity
    guard left out unless the space allows them. ``trial`` is the configuration's first trial
    (its source and loss-parity verdict ``numerics``); ``objective.value`` and the figures in
    ``metrics`` (TFLOP/s, step time, tokens/s, peak memory, and their intervals
    ``*_ci``) are the pooled ones (the trial's own when the configuration ran once); ``noise``
    holds each figure with its 95 % interval, the pooled trials and the configurations tied
    with it; ``trust`` what a study of estimates stands on (None for a measured best).

    Raises:
        NoCompleteTrialError: the study has no complete trial (eligible as best) yet.
        SpaceError: the stored space of the study no longer validates.
    """
    space = best_space(storage, study)
    nb = best if best is not None else study_best(storage, study, space)
    if nb is None:
        raise NoCompleteTrialError(_why_no_best(storage, study, space))
    t = nb.best.trial or storage.get_trial_by_number(study.id, nb.best.number, with_steps=False)
    full = space.active_config(t.params)  # no value that does nothing there
    m = t.metrics
    metrics: dict[str, Any] = {
        "tflops_per_gpu": m.get("tflops_per_gpu"),
        "peak_mem_gib": m.get("peak_mem_gib"),
        "peak_reserved_gib": m.get("peak_reserved_gib"),
        "step_time_s": m.get("step_time_s"),
        "loss": m.get("loss"),
        **{k: m[k] for k in MEASUREMENT_DETAILS if k in m},
    }
    # the configuration's figures are its pooled ones (dse.results.noise), the same ones with the
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
        "trust": _trust(storage, study) if t.source == "estimate" else None,
    }


def _trust(storage: StudyReads, study: StudyRecord) -> dict[str, Any] | None:
    """What a study of estimates stands on (:func:`dse.results.trust.trust_summary`), the one
    ``trust`` block of the best wherever it is shown (``dse best``, the API)."""
    trials = [
        {"number": t.number, "state": t.state, "params": t.params, "metrics": t.metrics}
        for t in storage.list_trials(study.id)
    ]
    return trust_summary(trials, study.metric, study.direction)


def noise_payload(nb: NoisyBest) -> dict[str, Any]:
    """The ``noise`` block of a best payload (documented in docs/api.md, ``BestNoisePublic``)."""
    b = nb.best
    return {
        "trials": list(b.trials),
        "n_trials": b.n,
        "figures": {k: f.as_dict() for k, f in b.figures.items()},
        "interval_source": b.source,
        "kind": "estimate" if nb.deterministic else "measured",
        "rel_sd": nb.rel_sd,
        "model": nb.model.as_dict(),
        "verdict": nb.verdict,
        "answer": nb.answer,
        "split_budget": nb.split,
        "inseparable": [c.number for c in nb.inseparable],
        "evidence": [{"study": s, "trial": n} for s, n in b.evidence],
        "tied": [
            {
                "trial": c.number,
                "trials": list(c.trials),
                "value": c.objective.value,
                "ci": None if c.objective.ci is None else list(c.objective.ci),
                "params": dict(c.params),
                "study": c.study,
            }
            for c in nb.tied
        ],
        "message": nb.message,
    }


def _why_no_best(storage: StudyReads, study: StudyRecord, space: SearchSpace) -> str:
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


def best_space(storage: StudyReads, study: StudyRecord) -> SearchSpace:
    """The space the study's last run used (its stored run settings applied): the one its
    best is judged and its launch commands rendered with.

    Raises:
        SpaceError: the stored space (or its stored settings) no longer validates.
    """
    return effective_space(study.space_yaml, study.name, storage.get_study_attrs(study.id))


def render_best(
    payload: dict[str, Any], fmt: BestFormat, space: SearchSpace, flags: FlagsText
) -> str:
    """``payload`` as JSON or YAML, or (``megatron``, ``bridge``, ``nemo``) the knob and
    environment part of its trial's launch command on that format's recipe target
    (:data:`EXPORT_TARGETS`): ``export`` lines, then the arguments or overrides, rendered by
    ``flags`` for the study's ``space`` (:func:`best_space`).

    Raises:
        NoEquivalentError: a knob value the target cannot express (the message names it and
            the nearest upstream setting); nothing is translated silently.
        ValueError: an unknown format.
    """
    if fmt == "json":
        return json.dumps(payload, indent=2)
    if fmt == "yaml":
        return yaml.safe_dump(payload, sort_keys=False)
    target = EXPORT_TARGETS.get(fmt)
    if target is None:
        raise ValueError(f"unknown format {fmt!r}; known formats: {', '.join(BEST_FORMATS)}")
    return flags(space, payload["params"], target)
