"""The study repository: every write of a study database (its reads are :mod:`dse.storage._reads`,
the base class of :class:`Storage`), as frozen records.

Contract (like Optuna's ``BaseStorage``):

* Every method runs in its own transaction and returns frozen records
  (:mod:`dse.core.records`), never live ORM rows; a record read earlier is never changed by a
  later write.
* Every database error leaves as :class:`~dse.core.exceptions.StorageError` (or a narrower
  subclass), chained ``from`` the driver's error. Transient errors (SQLite busy, PostgreSQL
  serialization failures and deadlocks) are retried a few times first.
* Several processes may write one study at once (controllers, Ray workers): trial numbers
  and the budget are claimed atomically (:meth:`Storage.claim_trial`), finishing is
  idempotent, and racing reconcilers cannot undo a finished trial.
* A :class:`Storage` may be shared by the threads of one process; each process opens its
  own (do not carry one across ``fork``).

Trial life cycle::

    claim_trial ─► queued ─► start_trial ─► running ─► finish_trial ─► complete
                     ▲  ▲                      │                       failed
                     │  └──── requeue_trial ◄──┘                       infeasible
                     │                                                 pruned (dominated)
                     └─ acquire_queued_trial (take an ownerless queued trial)

``heartbeat_at`` marks a live owner: set by ``claim_trial``, ``start_trial``,
``acquire_queued_trial`` and ``heartbeat``; ``requeue_trial`` clears it (and the owner), so a
re-queued trial is free for any controller.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ColumnElement,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

from dse.core.exceptions import (
    DuplicatedStudyError,
    StorageError,
    StudyFormatError,
    StudyNotFoundError,
)
from dse.core.names import study_name_problem
from dse.core.records import (
    FINISHED_STATES,
    IMPORTED_ATTR,
    MEASURED_STATES,
    NUMERICS_STATUSES,
    STUDY_STATES,
    TAKEN_STATES,
    FinishedState,
    Outcome,
    OutcomeStatus,
    RejectionRecord,
    StudyRecord,
    TrialRecord,
    numerics_status,
)
from dse.stats.gpu_figures import trial_gpu_figures
from dse.storage._engine import (
    SessionScope,
    is_ephemeral,
    make_engine,
    migrate,
    normalize_url,
    redact_passwords,
    safe_url,
)
from dse.storage._models import (
    RejectionModel,
    StudyAttrModel,
    StudyModel,
    TrialModel,
    TrialParamModel,
    TrialStepModel,
)
from dse.storage._reads import (
    StorageReads,
    _check_direction,
    _study_by_name,
    _study_id_or_raise,
    _study_or_raise,
    _trial_or_raise,
)
from dse.storage._rows import (
    param_rows,
    rejection_record,
    step_rows,
    steps_of,
    study_record,
    trial_record,
)
from dse.storage._study_file import (
    StudyExport,
    check_trials_of_space,
    derive_study_fields,
    load_study,
    parse_export,
)

__all__ = ["Storage", "open_storage"]


_OUTCOME_STATE: dict[OutcomeStatus, FinishedState] = {
    "ok": "complete",
    "infeasible": "infeasible",
    "failed": "failed",
}


def open_storage(url: str, *, pool_size: int | None = None) -> Storage:
    """Open (and create or upgrade) the study database at ``url``.

    Args:
        url: a SQLAlchemy URL: ``sqlite:///relative/path.db``, ``sqlite:////abs/path.db``,
            ``sqlite:///:memory:`` (one process, for tests) or
            ``postgresql+psycopg://user@host/db`` (``postgresql://`` also gets psycopg 3).
        pool_size: database connections kept open (for a server's worker threads).

    Returns:
        A :class:`Storage` whose schema is at this dse's head revision.

    Raises:
        SchemaVersionError: the database was written by a newer dse.
        StorageError: the database cannot be reached or migrated.

    Example::

        storage = open_storage("sqlite:///dse_runs/study.db")
        study, created = storage.get_or_create_study(name="s", ...)
    """
    url = normalize_url(url)
    _make_sqlite_parent(url)
    engine = make_engine(url, pool_size=pool_size)
    try:
        revision = migrate(engine, url)
    except BaseException:
        engine.dispose()
        raise
    return Storage(engine, url=url, revision=revision)


class Storage(StorageReads):
    """A study database: studies, trials, per-step metrics, rejections, exports.

    Made by :func:`open_storage`; see the module docstring for the contract.
    """

    def __init__(self, engine: Engine, *, url: str, revision: str) -> None:
        self.url = url
        self.revision = revision
        self._engine = engine
        self._db = SessionScope(engine)

    def __repr__(self) -> str:
        return f"Storage({self.display_url!r})"

    @property
    def display_url(self) -> str:
        """The database URL with its password hidden (for messages, logs and the API)."""
        return safe_url(self.url)

    @property
    def is_ephemeral(self) -> bool:
        """True for an in-memory database (gone when this process ends; other processes
        cannot open it)."""
        return is_ephemeral(self.url)

    def close(self) -> None:
        """Release the connections (an in-memory database is gone after this)."""
        self._engine.dispose()

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    # --- studies ------------------------------------------------------------------------

    def create_study(
        self,
        *,
        name: str,
        space_yaml: str,
        space_hash: str,
        direction: str,
        metric: str,
        model: dict[str, Any],
        hardware: dict[str, Any],
    ) -> StudyRecord:
        """Create a study in state ``created``.

        Raises:
            DuplicatedStudyError: a study of that name exists.
            ValueError: ``direction`` is not ``minimize`` or ``maximize``.
        """
        _check_direction(direction)
        _check_json(model, "model")
        _check_json(hardware, "hardware")

        def fn(s: Session) -> StudyRecord:
            if _study_by_name(s, name) is not None:
                raise DuplicatedStudyError(f"a study named {name!r} already exists")
            return study_record(
                _insert_study(s, name, space_yaml, space_hash, direction, metric, model, hardware)
            )

        return self._db.run(fn, write=True, retry_integrity=True, what=f"create study {name!r}")

    def get_or_create_study(
        self,
        *,
        name: str,
        space_yaml: str,
        space_hash: str,
        direction: str,
        metric: str,
        model: dict[str, Any],
        hardware: dict[str, Any],
    ) -> tuple[StudyRecord, bool]:
        """The study of that name (``created=False``) or a new one (``True``).

        Safe between processes: a racing creator's row is found on retry.

        Raises:
            DuplicatedStudyError: a study of that name exists with a different space hash.
        """
        _check_direction(direction)
        _check_json(model, "model")
        _check_json(hardware, "hardware")

        def fn(s: Session) -> tuple[StudyRecord, bool]:
            row = _study_by_name(s, name)
            if row is not None:
                if row.space_hash != space_hash:
                    raise DuplicatedStudyError(
                        f"study {name!r} exists with a different space (stored space_hash="
                        f"{row.space_hash!r}, given space_hash={space_hash!r}); pick another "
                        "study name or restore the original space file"
                    )
                return study_record(row), False
            row = _insert_study(
                s, name, space_yaml, space_hash, direction, metric, model, hardware
            )
            return study_record(row), True

        return self._db.run(
            fn, write=True, retry_integrity=True, what=f"get or create study {name!r}"
        )

    def set_study_state(self, name: str, state: str) -> None:
        """Set a study's state (one of ``STUDY_STATES``: created, running, stopping, complete,
        stopped, interrupted).

        Raises:
            ValueError: an unknown state.
            StudyNotFoundError: no such study.
        """
        if state not in STUDY_STATES:
            raise ValueError(f"study state must be one of {STUDY_STATES}, got {state!r}")

        def fn(s: Session) -> None:
            row = _study_or_raise(s, name)
            row.state = state
            row.updated_at = time.time()
            _bump(s, row.id)

        self._db.run(fn, write=True, what=f"set state of study {name!r}")

    def delete_study(self, name: str) -> None:
        """Delete a study and everything it has.

        Raises:
            StudyNotFoundError: no such study.
        """

        def fn(s: Session) -> None:
            row = _study_or_raise(s, name)
            s.execute(delete(StudyModel).where(StudyModel.id == row.id))

        self._db.run(fn, write=True, what=f"delete study {name!r}")

    def set_study_attr(self, study_id: int, key: str, value: Any) -> None:
        """Set one JSON attribute of a study (cost-model calibration, agent info, ...).

        Raises:
            ValueError: ``value`` is not JSON-serializable.
            StudyNotFoundError: no such study.
        """
        _check_json(value, f"study attribute {key!r}")

        def fn(s: Session) -> None:
            _study_id_or_raise(s, study_id)
            row = s.get(StudyAttrModel, (study_id, key))
            if row is None:
                s.add(StudyAttrModel(study_id=study_id, key=key, value=value))
            else:
                row.value = value
            _bump(s, study_id)

        self._db.run(fn, write=True, retry_integrity=True, what=f"set study attribute {key!r}")

    # --- trials: writes -------------------------------------------------------------------

    def claim_trial(
        self,
        *,
        study_id: int,
        params: dict[str, Any],
        params_key: str,
        budget: int,
        allow_repeat: bool = False,
        runner: str | None = None,
        remeasure_of: int | None = None,
    ) -> TrialRecord | None:
        """Atomically add a ``queued`` trial with the next number, within the budget.

        Multi-writer safe: the study row is locked for the transaction (PostgreSQL
        ``SELECT ... FOR UPDATE``; SQLite ``BEGIN IMMEDIATE``), so numbers are contiguous
        (0, 1, 2, ...) and the budget is never exceeded, whoever claims.

        Args:
            study_id: the study.
            params: the configuration (JSON values).
            params_key: its canonical key (:func:`dse.space.searchspace.params_key`).
            budget: the most trials the study may have (every trial row counts).
            allow_repeat: claim even if a trial of this configuration is queued, running,
                complete or infeasible (failed ones never block a retry).
            runner: the claiming owner (e.g. ``host:pid:token``); its heartbeat starts now.
            remeasure_of: a re-measurement of the configuration of that trial number (the
                configuration is taken by definition: ``allow_repeat`` is implied).

        Returns:
            The new trial, or None when the budget is spent or the configuration is taken.

        Raises:
            StudyNotFoundError: no such study.
        """
        _check_json(params, "params")
        pairs = param_rows(params)

        def fn(s: Session) -> TrialRecord | None:
            locked = s.execute(
                select(StudyModel.id).where(StudyModel.id == study_id).with_for_update()
            ).scalar_one_or_none()
            if locked is None:
                raise StudyNotFoundError(f"no study with id {study_id}")
            total, top = s.execute(
                select(func.count(TrialModel.id), func.max(TrialModel.number)).where(
                    TrialModel.study_id == study_id
                )
            ).one()
            if total >= budget:
                return None
            if not allow_repeat and remeasure_of is None:
                taken = s.execute(
                    select(TrialModel.id)
                    .where(
                        TrialModel.study_id == study_id,
                        TrialModel.params_key == params_key,
                        TrialModel.state.in_(TAKEN_STATES),
                    )
                    .limit(1)
                ).first()
                if taken is not None:
                    return None
            now = time.time()
            row = TrialModel(
                study_id=study_id,
                number=0 if top is None else top + 1,
                state="queued",
                params=params,
                params_key=params_key,
                metrics={},
                runner=runner,
                queued_at=now,
                heartbeat_at=now,
                attempts=0,
                history=[],
                remeasure_of=remeasure_of,
            )
            s.add(row)
            s.flush()
            s.add_all(TrialParamModel(trial_id=row.id, name=n, value_json=v) for n, v in pairs)
            _bump(s, study_id, best=False)  # a queued trial
            return trial_record(row)

        return self._db.run(fn, write=True, retry_integrity=True, what="claim a trial")

    def acquire_queued_trial(
        self, study_id: int, *, runner: str, older_than_s: float | None = None
    ) -> TrialRecord | None:
        """Atomically take the lowest-numbered ownerless ``queued`` trial for ``runner``.

        A queued trial is ownerless when it has no heartbeat (re-queued, or imported), or,
        with ``older_than_s``, when its owner's heartbeat is older than that (the claiming
        controller died before starting it). The trial stays ``queued``; its owner and
        heartbeat become ``runner`` and now. Two controllers never acquire the same trial.

        Returns:
            The trial, or None when there is none to take.
        """

        def fn(s: Session) -> TrialRecord | None:
            free: ColumnElement[bool] = TrialModel.heartbeat_at.is_(None)
            if older_than_s is not None:
                free = free | (TrialModel.heartbeat_at < time.time() - older_than_s)
            row = s.scalars(
                select(TrialModel)
                .where(TrialModel.study_id == study_id, TrialModel.state == "queued", free)
                .order_by(TrialModel.number)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            row.runner = runner
            row.heartbeat_at = time.time()
            _bump(s, study_id, best=False)  # still queued
            return trial_record(row)

        return self._db.run(fn, write=True, what="acquire a queued trial")

    def start_trial(
        self,
        trial_id: int,
        *,
        runner: str,
        host: str,
        log_path: str | None,
        metrics_path: str | None,
    ) -> TrialRecord:
        """Mark a trial ``running`` (started and heartbeat now) on ``runner`` at ``host``.

        A trial that is already finished is returned unchanged (check ``.state``): a
        racing controller finished it, and its result is kept.

        Raises:
            TrialNotFoundError: no such trial.
        """

        def fn(s: Session) -> TrialRecord:
            row = _trial_or_raise(s, trial_id, for_update=True)
            if row.state in FINISHED_STATES:
                return trial_record(row, steps_of(s, [row.id]).get(row.id, ()))
            now = time.time()
            row.state = "running"
            row.runner = runner
            row.host = host
            row.log_path = log_path
            row.metrics_path = metrics_path
            row.started_at = now
            row.heartbeat_at = now
            _bump(s, row.study_id, best=False)  # not finished (checked above)
            return trial_record(row)

        return self._db.run(fn, write=True, what=f"start trial {trial_id}")

    def heartbeat(self, trial_ids: Iterable[int]) -> None:
        """Refresh the heartbeat of these trials (those still queued or running)."""
        ids = list(trial_ids)
        if not ids:
            return

        def fn(s: Session) -> None:
            s.execute(
                update(TrialModel)
                .where(TrialModel.id.in_(ids), TrialModel.state.in_(("queued", "running")))
                .values(heartbeat_at=time.time())
            )

        self._db.run(fn, write=True, what="heartbeat")

    def finish_trial(
        self,
        trial_id: int,
        outcome: Outcome,
        *,
        value: float | None,
        gpu_seconds: float | None = None,
        host: str | None = None,
    ) -> TrialRecord:
        """Store a trial's outcome: ``ok`` -> complete (``pruned`` when it stopped as
        dominated, :attr:`dse.core.records.Outcome.pruned`), else failed / infeasible.

        ``host``, when given, replaces the trial's host with where it ran (a cluster runner's
        node names and GPU indices).

        Stores the metrics, value, failure class and reason, source, finish time, GPU-seconds
        and the per-step metrics (replacing any earlier steps of the trial). A ``numerics``
        entry of the outcome's metrics is dropped: the loss-parity verdict is set by
        :meth:`set_trial_numerics` only.

        Idempotent and never loses a result: a ``complete`` or ``pruned`` trial is returned
        unchanged; a trial already failed / infeasible is returned unchanged unless the new
        outcome is ``ok`` (a result found later, e.g. in the metrics file of a trial that was
        declared interrupted, replaces the failure).

        Raises:
            TrialNotFoundError: no such trial.
            ValueError: the metrics are not JSON-serializable.
        """
        _check_json(outcome.metrics, "outcome.metrics")
        state = _OUTCOME_STATE.get(outcome.status)
        if state is None:
            raise ValueError(f"unknown outcome status {outcome.status!r}")
        if outcome.pruned:
            state = "pruned"

        def fn(s: Session) -> TrialRecord:
            row = _trial_or_raise(s, trial_id, for_update=True)
            if row.state in MEASURED_STATES or (row.state in FINISHED_STATES and not outcome.ok):
                return trial_record(row, steps_of(s, [row.id]).get(row.id, ()))
            row.state = state
            # the loss-parity verdict is the controller's (set_trial_numerics), never the
            # trial's own: a metrics file cannot certify itself
            _set_metrics(row, {k: v for k, v in outcome.metrics.items() if k != "numerics"})
            row.numerics = None
            row.value = value
            row.failure_class = outcome.failure_class
            row.reason = outcome.reason
            row.source = outcome.source
            row.finished_at = time.time()
            if gpu_seconds is not None:
                row.gpu_seconds = gpu_seconds
            if host:
                row.host = host[:255]
            s.execute(delete(TrialStepModel).where(TrialStepModel.trial_id == row.id))
            s.add_all(step_rows(row.id, outcome.steps))
            _bump(s, row.study_id)
            return trial_record(row, tuple(outcome.steps))

        return self._db.run(fn, write=True, what=f"finish trial {trial_id}")

    def requeue_trial(self, trial_id: int, *, reason: str) -> TrialRecord:
        """Put an interrupted (running or queued) trial back in the queue, ownerless.

        Keeps its number; clears the owner, host, start and heartbeat; counts the attempt
        and appends ``reason`` (with what was interrupted) to its history. A finished trial
        is returned unchanged (a racing controller finished it).

        Raises:
            TrialNotFoundError: no such trial.
        """

        def fn(s: Session) -> TrialRecord:
            row = _trial_or_raise(s, trial_id, for_update=True)
            if row.state in FINISHED_STATES:
                return trial_record(row, steps_of(s, [row.id]).get(row.id, ()))
            _requeue_row(row, reason)
            _bump(s, row.study_id, best=False)  # not finished (checked above)
            return trial_record(row)

        return self._db.run(fn, write=True, what=f"requeue trial {trial_id}")

    def set_trial_numerics(self, trial_id: int, verdict: dict[str, Any] | None) -> TrialRecord:
        """Store the loss-parity verdict of a finished trial as ``metrics["numerics"]`` (None:
        remove it); the ``numerics`` column, which :meth:`best_trial` and
        :meth:`count_numerics` read, follows its ``status``. A trial that is not finished is
        returned unchanged.

        Raises:
            TrialNotFoundError: no such trial.
            ValueError: the verdict is not JSON, or its status is not a numerics status.
        """
        if verdict is not None:
            _check_json(verdict, "verdict")
            if verdict.get("status") not in NUMERICS_STATUSES:
                raise ValueError(
                    f"verdict status must be one of {NUMERICS_STATUSES}, "
                    f"got {verdict.get('status')!r}"
                )

        def fn(s: Session) -> TrialRecord:
            row = _trial_or_raise(s, trial_id, for_update=True)
            if row.state in FINISHED_STATES:
                metrics = dict(row.metrics or {})
                if verdict is None:
                    metrics.pop("numerics", None)
                else:
                    metrics["numerics"] = dict(verdict)
                _set_metrics(row, metrics)
                row.numerics = numerics_status(metrics)
                _bump(s, row.study_id)
            return trial_record(row)

        return self._db.run(fn, write=True, what=f"set the numerics of trial {trial_id}")

    # --- rejections -----------------------------------------------------------------------

    def add_rejection(
        self,
        *,
        study_id: int,
        params: dict[str, Any],
        params_key: str,
        kind: str,
        rule: str,
        reason: str,
        values: dict[str, Any],
    ) -> RejectionRecord:
        """Record a proposal rejected before launch (``kind``: ``invalid`` | ``predicted_oom``).

        Raises:
            StudyNotFoundError: no such study.
        """
        _check_json(params, "params")
        _check_json(values, "values")

        def fn(s: Session) -> RejectionRecord:
            _study_id_or_raise(s, study_id)
            row = RejectionModel(
                study_id=study_id,
                params=params,
                params_key=params_key,
                kind=kind,
                rule=rule,
                reason=reason,
                values=values,
                created_at=time.time(),
            )
            s.add(row)
            s.flush()
            _bump(s, study_id)
            return rejection_record(row)

        return self._db.run(fn, write=True, what="add rejection")

    # --- export / import ------------------------------------------------------------------

    def import_study(
        self,
        data: dict[str, Any] | StudyExport,
        *,
        name: str | None = None,
        release: bool = False,
        trials_of_space: bool = True,
    ) -> StudyRecord:
        """Create a study from :meth:`export_study`'s dict, or an export already read with
        :func:`~dse.storage.read_export_text` (optionally under another name).

        Trial numbers, states, timings, steps and rejections are kept; ids are new. The
        space hash, objective, model and hardware come from the export's space file, not
        from its stated copy (a stated value that disagrees is refused:
        :func:`~dse.storage._study_file.derive_study_fields`). With ``release``, what the
        export says is running is let go: nothing of this database runs it (its owners are
        controllers where it was exported, and its heartbeat may say anything): its running
        trials and those queued for a controller are re-queued ownerless, and a running or
        stopping study is stopped (``dse resume`` continues it). Every trial must be a
        configuration of the export's space (``trials_of_space``; off only for synthetic
        test data): :func:`~dse.storage._study_file.check_trials_of_space`.

        Raises:
            StudyFormatError: ``data`` is not a dse study export this dse can read, its
                space file is not one, its stated study fields disagree with it, or a
                trial is not a configuration of its space.
            DuplicatedStudyError: a study of that name exists.
        """
        export = data if isinstance(data, StudyExport) else parse_export(data)
        target = name or export.study.name
        why = study_name_problem(target)
        if why is not None:
            raise StudyFormatError(f"study name: {why} (study={target!r})")

        fields = derive_study_fields(export.study)  # the space says what the study is
        if trials_of_space:
            check_trials_of_space(export)  # ... and which configurations its trials may be

        def fn(s: Session) -> StudyRecord:
            if _study_by_name(s, target) is not None:
                raise DuplicatedStudyError(f"a study named {target!r} already exists")
            row = load_study(s, export, name=target, fields=fields)
            s.flush()
            if release:
                _release_imported(s, row)
            # an export is data from elsewhere: its run settings are not run unconfirmed
            attr = s.get(StudyAttrModel, (row.id, IMPORTED_ATTR))
            if attr is None:
                s.add(StudyAttrModel(study_id=row.id, key=IMPORTED_ATTR, value=True))
            else:
                attr.value = True
            return study_record(row)

        return self._db.run(fn, write=True, retry_integrity=True, what=f"import study {target!r}")


# --- helpers -------------------------------------------------------------------------------


def _make_sqlite_parent(url: str) -> None:
    """Create the folder of a SQLite file (``sqlite:///dse_runs/studies.db`` just works)."""
    try:
        u = make_url(url)
    except Exception:  # noqa: BLE001 - make_engine reports a malformed URL
        return
    if u.get_backend_name() != "sqlite" or u.database in (None, "", ":memory:"):
        return
    parent = Path(u.database).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(f"cannot create the folder of the SQLite database {parent}: {e}") from e


def _check_json(value: Any, what: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be JSON-serializable: {e}") from e


def _release_imported(s: Session, study: StudyModel) -> None:
    held = s.scalars(
        select(TrialModel).where(
            TrialModel.study_id == study.id,
            (TrialModel.state == "running")
            | ((TrialModel.state == "queued") & TrialModel.runner.is_not(None)),
        )
    ).all()
    for row in held:
        _requeue_row(row, "imported: it was unfinished where the study was exported")
    if study.state in ("running", "stopping"):
        study.state = "stopped"


def _set_metrics(row: TrialModel, metrics: dict[str, Any]) -> None:
    """Store a trial's metrics with the GPU-time columns they give
    (:func:`dse.stats.gpu_figures.trial_gpu_figures`, summed by :meth:`Storage.gpu_totals`)."""
    row.metrics = metrics
    for k, v in trial_gpu_figures(metrics).items():
        setattr(row, k, v)


def _requeue_row(row: TrialModel, reason: str) -> None:
    """Put an unfinished trial row back in the queue, ownerless (``reason`` in its history)."""
    entry = {
        "at": time.time(),
        "reason": reason,
        "state": row.state,
        "runner": row.runner,
        "host": row.host,
        "started_at": row.started_at,
        "log_path": row.log_path,
    }
    row.history = [*(row.history or []), entry]
    row.attempts = (row.attempts or 0) + 1
    row.state = "queued"
    row.runner = None
    row.host = None
    row.started_at = None
    row.heartbeat_at = None


def _insert_study(
    s: Session,
    name: str,
    space_yaml: str,
    space_hash: str,
    direction: str,
    metric: str,
    model: dict[str, Any],
    hardware: dict[str, Any],
) -> StudyModel:
    now = time.time()
    row = StudyModel(
        name=name,
        space_yaml=redact_passwords(space_yaml),
        space_hash=space_hash,
        state="created",
        direction=direction,
        metric=metric,
        model=dict(model),
        hardware=dict(hardware),
        created_at=now,
        updated_at=now,
    )
    s.add(row)
    s.flush()
    return row


def _bump(s: Session, study_id: int, *, best: bool = True) -> None:
    """Move the study's change counters in this transaction: ``studies.version``, and with
    ``best`` (every write that can change the study's best) ``studies.best_version`` too.

    ``best=False`` is only for writes to trials that are not finished and stay so (queue,
    acquire, start, re-queue): the best is chosen among complete trials alone
    (:meth:`Storage.best_configurations`, :func:`dse.results.noise.study_best`).

    Called last in a write (after its trial row locks): PostgreSQL then locks the study row
    only until the commit, in the same order (trial, then study) as every other writer.
    """
    values: dict[str, Any] = {"version": StudyModel.version + 1}
    if best:
        values["best_version"] = StudyModel.best_version + 1
    s.execute(
        update(StudyModel)
        .where(StudyModel.id == study_id)
        .values(values)
        .execution_options(synchronize_session=False)
    )
