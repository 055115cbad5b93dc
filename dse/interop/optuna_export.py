"""A dse study written into an Optuna RDB storage (``dse export --format optuna``).

Each finished trial becomes an Optuna trial with the study's knobs as parameters (their
distributions from the space's domains), the objective value, and user attributes for the
figures Optuna has no field for (memory, step time, TFLOP/s, failure class and reason, the
dse trial number). States: complete -> COMPLETE; failed -> FAIL; infeasible (a trial the rules
or the memory could not run) -> FAIL with ``failure_class``; pruned (stopped early, dominated)
-> PRUNED with its value as the intermediate value of its last step. Queued and
running trials are left out (they have no outcome yet). optuna-dashboard and Optuna's
analysis (``optuna.importance``, ``optuna.visualization``) open the result.

:func:`follow_study` keeps an Optuna storage in step with a *running* study (``dse export
--format optuna --follow``): a follower that reads the dse database every few seconds and
adds each trial as it finishes (:func:`sync_to_optuna`, keyed by the dse trial number, so a
restarted follower adds nothing twice), until the study is done. A user's own
optuna-dashboard on that storage shows the trials as they complete. The study loop is not
touched: the follower only reads, so it runs beside any controller, on any machine that
reaches the database.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dse.core.exceptions import DSEError
from dse.core.records import StudyRecord, TrialRecord
from dse.results.best_formats import _stored_space
from dse.space.searchspace import IntDomain, SearchSpace

if TYPE_CHECKING:  # SQLAlchemy: loaded where a command opens its database
    from dse.storage import Storage

__all__ = [
    "export_to_optuna",
    "distributions",
    "frozen_trials",
    "inside_params",
    "sync_to_optuna",
    "follow_study",
]

_STATES = {"complete": "COMPLETE", "failed": "FAIL", "infeasible": "FAIL", "pruned": "PRUNED"}
_ATTRS = ("tflops_per_gpu", "peak_mem_gib", "peak_reserved_gib", "step_time_s", "loss")


def distributions(space: SearchSpace) -> dict[str, Any]:
    """Optuna distributions of a space's knobs (int ranges as IntDistribution)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

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


def export_to_optuna(
    storage: Storage, study: StudyRecord, url: str, name: str | None = None
) -> int:
    """Write ``study`` (a :class:`dse.core.records.StudyRecord` of ``storage``) into the Optuna
    storage at ``url`` as a new study; returns the trials written.

    Raises:
        DSEError: Optuna is not installed, or the Optuna study exists already.
    """
    try:
        import optuna  # noqa: F401
    except ImportError as e:  # pragma: no cover - optuna is a core dependency
        raise DSEError(f"the optuna export needs optuna: {e}") from e

    _, trials = frozen_trials(storage, study)
    ost = _open_optuna_study(study, url, name, create=True)
    ost.add_trials(trials)
    return len(trials)


def inside_params(
    params: dict[str, Any], dists: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The knobs of ``params`` that the distributions ``dists`` hold, and their
    distributions (a knob of no distribution, or a value outside it, e.g. the inactive
    value of a conditional knob, is left out)."""
    kept: dict[str, Any] = {}
    used: dict[str, Any] = {}
    for k, v in params.items():
        d = dists.get(k)
        if d is None:
            continue
        try:
            inside = d._contains(d.to_internal_repr(v))  # noqa: SLF001
        except (ValueError, TypeError):
            inside = False
        if inside:
            kept[k], used[k] = v, d
    return kept, used


def frozen_trials(
    storage: Storage, study: StudyRecord, records: Sequence[TrialRecord] | None = None
) -> tuple[dict[str, Any], list[Any]]:
    """The knob distributions of a study and its finished trials as Optuna trials
    (``records``: the study's trials where the caller has listed them already)."""
    import optuna

    space = _stored_space(study.space_yaml, study.name)
    dists = distributions(space)
    trials = []
    for t in storage.list_trials(study.id) if records is None else records:
        state = _STATES.get(t.state)
        if state is None:
            continue
        params, used = inside_params(t.params, dists)
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


def _open_optuna_study(study: StudyRecord, url: str, name: str | None, *, create: bool) -> Any:
    import optuna
    from optuna.exceptions import DuplicatedStudyError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    oname = name or study.name
    try:
        if not create:
            return optuna.load_study(study_name=oname, storage=url)
        ost = optuna.create_study(storage=url, study_name=oname, direction=study.direction)
    except DuplicatedStudyError as e:
        raise DSEError(f"{url}: an Optuna study named {oname!r} exists") from e
    with warnings.catch_warnings():  # set_metric_names is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ost.set_metric_names([study.metric])
    ost.set_user_attr("dse_study", study.name)
    ost.set_user_attr("dse_objective", {"metric": study.metric, "direction": study.direction})
    return ost


def sync_to_optuna(storage: Storage, study: StudyRecord, url: str, name: str | None = None) -> int:
    """Add the finished trials of ``study`` that the Optuna study at ``url`` does not hold
    yet (created on the first call, keyed by the ``dse_number`` user attribute); returns the
    trials added.

    Raises:
        DSEError: the Optuna study exists but was not written for this dse study.
    """
    import optuna

    try:
        ost = _open_optuna_study(study, url, name, create=False)
    except KeyError:  # optuna.load_study: no such study yet
        ost = _open_optuna_study(study, url, name, create=True)
    owner = ost.user_attrs.get("dse_study")
    if owner != study.name:
        raise DSEError(
            f"{url}: the Optuna study {name or study.name!r} was not written for dse study "
            f"{study.name!r} (dse_study={owner!r})"
        )
    have = {
        t.user_attrs.get("dse_number")
        for t in ost.get_trials(deepcopy=False)
        if t.state != optuna.trial.TrialState.RUNNING
    }
    _, trials = frozen_trials(storage, study)
    new = [t for t in trials if t.user_attrs.get("dse_number") not in have]
    ost.add_trials(new)
    return len(new)


#: States of a study after which its controller writes nothing more to it.
_DONE = ("complete", "stopped", "interrupted")


def follow_study(
    storage: Storage,
    study_name: str,
    url: str,
    *,
    name: str | None = None,
    interval_s: float = 2.0,
    stop: threading.Event | None = None,
    timeout_s: float | None = None,
    on_sync: Any = None,
) -> int:
    """Keep the Optuna storage at ``url`` in step with the dse study ``study_name`` until it
    is done (its state complete, stopped or interrupted, and no trial queued or running), ``stop``
    is set, or ``timeout_s`` passes; returns the trials added. ``on_sync(added)`` is called
    after each pass.

    Raises:
        StudyNotFoundError: no such dse study.
        DSEError: an Optuna study of that name written for another dse study.
    """
    start = time.monotonic()
    added = 0
    wait = stop or threading.Event()
    while True:
        study = storage.get_study(study_name)  # StudyNotFoundError names it
        busy = any(t.state in ("queued", "running") for t in storage.list_trials(study.id))
        n = sync_to_optuna(storage, study, url, name)
        added += n
        if on_sync is not None:
            on_sync(n)
        if (study.state in _DONE and not busy) or wait.is_set():
            return added
        if timeout_s is not None and time.monotonic() - start >= timeout_s:
            return added
        wait.wait(interval_s)
