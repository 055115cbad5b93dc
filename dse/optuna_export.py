"""A dse study written into an Optuna RDB storage (``dse export --format optuna``).

Each finished trial becomes an Optuna trial with the study's knobs as parameters (their
distributions from the space's domains), the objective value, and user attributes for the
figures Optuna has no field for (memory, step time, TFLOP/s, failure class and reason, the
dse trial number). States: complete -> COMPLETE; failed -> FAIL; infeasible (a trial the rules
or the memory could not run) -> FAIL with ``failure_class``; pruned (stopped early, dominated)
-> PRUNED with its value as the intermediate value of its last step. Queued and
running trials are left out (they have no outcome yet). optuna-dashboard and Optuna's
analysis (``optuna.importance``, ``optuna.visualization``) open the result.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Sequence
from typing import Any

from dse.exceptions import DSEError

__all__ = ["export_to_optuna", "distributions", "frozen_trials"]

_STATES = {"complete": "COMPLETE", "failed": "FAIL", "infeasible": "FAIL", "pruned": "PRUNED"}
_ATTRS = ("tflops_per_gpu", "peak_mem_gib", "peak_reserved_gib", "step_time_s", "loss")


def distributions(space: Any) -> dict[str, Any]:
    """Optuna distributions of a space's knobs (int ranges as IntDistribution)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from dse.space import IntDomain

    out: dict[str, Any] = {}
    for name, spec in space.knobs.items():
        dom = spec.domain
        if isinstance(dom, IntDomain) and not dom.log:  # (log domains: powers of two)
            out[name] = IntDistribution(dom.low, dom.high, step=dom.step)
        else:
            out[name] = CategoricalDistribution(list(spec.values()))
    return out


def _time(t: float | None) -> dt.datetime | None:
    return None if t is None else dt.datetime.fromtimestamp(t)


def export_to_optuna(storage: Any, study: Any, url: str, name: str | None = None) -> int:
    """Write ``study`` (a :class:`dse.records.StudyRecord` of ``storage``) into the Optuna
    storage at ``url`` as a new study; returns the trials written.

    Raises:
        DSEError: Optuna is not installed, or the Optuna study exists already.
    """
    try:
        import optuna
    except ImportError as e:  # pragma: no cover - optuna is a core dependency
        raise DSEError(f"the optuna export needs optuna: {e}") from e
    from optuna.exceptions import DuplicatedStudyError

    _, trials = frozen_trials(storage, study)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        ost = optuna.create_study(
            storage=url, study_name=name or study.name, direction=study.direction
        )
    except DuplicatedStudyError as e:
        raise DSEError(f"{url}: an Optuna study named {name or study.name!r} exists") from e
    with warnings.catch_warnings():  # set_metric_names is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ost.set_metric_names([study.metric])
    ost.set_user_attr("dse_study", study.name)
    ost.set_user_attr("dse_objective", {"metric": study.metric, "direction": study.direction})
    ost.add_trials(trials)
    return len(trials)


def frozen_trials(
    storage: Any, study: Any, records: Sequence[Any] | None = None
) -> tuple[dict[str, Any], list[Any]]:
    """The knob distributions of a study and its finished trials as Optuna trials
    (``records``: the study's trials where the caller has listed them already)."""
    import optuna

    from dse.export import _stored_space

    space = _stored_space(study.space_yaml, study.name)
    dists = distributions(space)
    trials = []
    for t in storage.list_trials(study.id) if records is None else records:
        state = _STATES.get(t.state)
        if state is None:
            continue
        params, used = {}, {}
        for k, v in t.params.items():
            d = dists.get(k)
            if d is None:
                continue
            try:
                inside = d._contains(d.to_internal_repr(v))  # noqa: SLF001
            except (ValueError, TypeError):
                inside = False
            if not inside:  # e.g. the inactive value of a conditional knob
                continue
            params[k], used[k] = v, d
        attrs: dict[str, Any] = {"dse_number": t.number, "dse_state": t.state}
        attrs.update({k: t.metrics.get(k) for k in _ATTRS if t.metrics.get(k) is not None})
        if t.failure_class:
            attrs["failure_class"] = t.failure_class
            attrs["reason"] = (t.reason or "")[:2000]
        if t.gpu_seconds is not None:
            attrs["gpu_seconds"] = t.gpu_seconds
        if state == "COMPLETE" and t.value is None:
            state = "FAIL"  # complete without the objective's figure: nothing to rank
        # a pruned trial keeps its measured value as Optuna keeps a pruned trial's: the
        # intermediate value at the step it stopped
        last = int(t.metrics.get("steps") or 0)
        ft = optuna.trial.create_trial(
            params=params,
            distributions=used,
            value=t.value if state == "COMPLETE" else None,
            state=optuna.trial.TrialState[state],
            user_attrs=attrs,
            intermediate_values=(
                {last: t.value} if state == "PRUNED" and t.value is not None else None
            ),
        )
        ft.datetime_start = _time(t.started_at or t.queued_at)
        ft.datetime_complete = _time(t.finished_at)
        trials.append(ft)
    return dists, trials
