"""The study repository: every read and write of a study database, as frozen records.

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

import functools
import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    Select,
    Text,
    bindparam,
    delete,
    func,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.orm import Session

from dse.core.exceptions import (
    DuplicatedStudyError,
    StorageError,
    StudyFormatError,
    StudyNotFoundError,
    TrialNotFoundError,
)
from dse.core.names import study_name_problem
from dse.core.records import (
    ANSWERED_STATES,
    DIRECTIONS,
    FINISHED_STATES,
    IMPORTED_ATTR,
    MEASURED_STATES,
    NUMERICS_STATUSES,
    STUDY_STATES,
    TAKEN_STATES,
    TRIAL_STATES,
    ConfigStats,
    FinishedState,
    Outcome,
    OutcomeStatus,
    RejectionRecord,
    StudyRecord,
    TrialPoint,
    TrialRecord,
    TrialRun,
    finite,
    gpu_slots_of,
    numerics_status,
)
from dse.results.gpu_usage import TRIAL_GPU_FIGURES, GpuTotals, trial_gpu_figures
from dse.storage._engine import (
    SessionScope,
    is_ephemeral,
    make_engine,
    migrate,
    normalize_url,
    redact_passwords,
    safe_url,
)
from dse.storage._export import (
    StudyExport,
    check_trials_of_space,
    derive_study_fields,
    dump_study,
    load_study,
    parse_export,
)
from dse.storage._models import (
    JSONText,
    RejectionModel,
    StudyAttrModel,
    StudyModel,
    TrialModel,
    TrialParamModel,
    TrialStepModel,
)
from dse.storage._rows import (
    TRIAL_COLUMNS,
    StoredTrialRow,
    param_rows,
    rejection_record,
    step_rows,
    steps_of,
    steps_of_conn,
    study_record,
    trial_from_row,
    trial_record,
)

__all__ = ["Storage", "open_storage"]

#: Trial orders accepted by :meth:`Storage.list_trials`.
TRIAL_ORDERS: tuple[str, ...] = ("number", "-number", "value", "-value")

_Sel = TypeVar("_Sel", bound=Select[Any])

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


class Storage:
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

    def get_study(self, name: str) -> StudyRecord:
        """The study of that name.

        Raises:
            StudyNotFoundError: no such study.
        """

        def fn(s: Session) -> StudyRecord:
            return study_record(_study_or_raise(s, name))

        return self._db.run(fn, write=False, what=f"get study {name!r}")

    def get_study_by_id(self, study_id: int) -> StudyRecord:
        """The study with that id.

        Raises:
            StudyNotFoundError: no such study.
        """

        def fn(s: Session) -> StudyRecord:
            return study_record(_study_id_or_raise(s, study_id))

        return self._db.run(fn, write=False, what=f"get study {study_id}")

    def list_studies(self) -> list[StudyRecord]:
        """Every study, oldest first."""

        def fn(s: Session) -> list[StudyRecord]:
            rows = s.scalars(select(StudyModel).order_by(StudyModel.id)).all()
            return [study_record(r) for r in rows]

        return self._db.run(fn, write=False, what="list studies")

    def study_versions(self) -> dict[str, tuple[int, int]]:
        """Every study's ``(id, version)`` by name: one narrow query (the key of answers
        that are reused while a study's version does not move; see :attr:`StudyRecord.version`
        for what moves it)."""
        return {name: (v.id, v.version) for name, v in self.study_change_counters().items()}

    def study_change_counters(self) -> dict[str, StudyCounters]:
        """Every study's id and change counters by name, in one narrow query: ``version``
        (moved by every write of the study's trials, rejections, state or attributes) and
        ``best_version`` (by those of them that can change its best: not queuing, acquiring,
        starting or re-queuing a trial that has not finished)."""

        def fn(conn: Connection) -> dict[str, StudyCounters]:
            return {
                name: StudyCounters(sid, version or 0, best or 0)
                for name, sid, version, best in conn.execute(_COUNTERS)
            }

        return self._db.read(fn, what="read study versions")

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

    def get_study_attrs(self, study_id: int) -> dict[str, Any]:
        """Every attribute of a study (an empty dict if none; no check that it exists)."""

        def fn(s: Session) -> dict[str, Any]:
            rows = s.scalars(
                select(StudyAttrModel)
                .where(StudyAttrModel.study_id == study_id)
                .order_by(StudyAttrModel.key)
            ).all()
            return {r.key: r.value for r in rows}

        return self._db.run(fn, write=False, what="get study attributes")

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

    # --- trials: reads --------------------------------------------------------------------

    def get_trial(self, trial_id: int, *, with_steps: bool = True) -> TrialRecord:
        """The trial with that id.

        Raises:
            TrialNotFoundError: no such trial.
        """

        def fn(s: Session) -> TrialRecord:
            row = _trial_or_raise(s, trial_id)
            steps = steps_of(s, [row.id]).get(row.id, ()) if with_steps else ()
            return trial_record(row, steps)

        return self._db.run(fn, write=False, what=f"get trial {trial_id}")

    def get_trial_by_number(
        self, study_id: int, number: int, *, with_steps: bool = True
    ) -> TrialRecord:
        """The trial of that number in a study.

        Raises:
            TrialNotFoundError: no such trial.
        """

        def fn(s: Session) -> TrialRecord:
            row = s.scalars(
                select(TrialModel).where(
                    TrialModel.study_id == study_id, TrialModel.number == number
                )
            ).one_or_none()
            if row is None:
                raise TrialNotFoundError(f"no trial number {number} in study {study_id}")
            steps = steps_of(s, [row.id]).get(row.id, ()) if with_steps else ()
            return trial_record(row, steps)

        return self._db.run(fn, write=False, what=f"get trial number {number}")

    def list_trials(
        self,
        study_id: int,
        *,
        state: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        order: str = "number",
        with_steps: bool = False,
        params_key: str | Sequence[str] | None = None,
        remeasure: bool | None = None,
        numbers: Sequence[int] | None = None,
    ) -> list[TrialRecord]:
        """A study's trials.

        Args:
            state: only this state.
            params_key: only trials of this configuration (or of these).
            remeasure: True: only re-measurements (``remeasure_of`` set); False: only the
                others.
            numbers: only these trial numbers.
            limit, offset: a page.
            order: ``number``, ``-number``, ``value`` or ``-value`` (trials without a value
                last, ties by number).
            with_steps: also load the per-step metrics.
        """
        if state is not None and state not in TRIAL_STATES:
            raise ValueError(f"trial state must be one of {TRIAL_STATES}, got {state!r}")
        if order not in TRIAL_ORDERS:
            raise ValueError(f"order must be one of {TRIAL_ORDERS}, got {order!r}")

        where = [TrialModel.study_id == study_id]
        if state is not None:
            where.append(TrialModel.state == state)

        def fn(s: Session) -> list[TrialRecord]:
            where = [TrialModel.study_id == study_id]
            if state is not None:
                where.append(TrialModel.state == state)
            if isinstance(params_key, str):
                where.append(TrialModel.params_key == params_key)
            elif params_key is not None:
                where.append(TrialModel.params_key.in_(list(params_key)))
            if remeasure is not None:
                col = TrialModel.remeasure_of
                where.append(col.is_not(None) if remeasure else col.is_(None))
            if numbers is not None:
                where.append(TrialModel.number.in_(list(numbers)))
            rows: Sequence[TrialModel]
            if limit is None and offset == 0:
                rows = s.scalars(_ordered(select(TrialModel).where(*where), order)).all()
            else:
                # A page: sort and skip narrow id rows first, then load only the page's rows
                # (sorting whole rows, JSON columns and all, is what made deep pages slow).
                ids_q = _ordered(select(TrialModel.id).where(*where), order).offset(offset)
                if limit is not None:
                    ids_q = ids_q.limit(limit)
                ids = list(s.scalars(ids_q))
                # plain rows, not ORM objects: half the CPU of a page (same attribute names)
                page = select(*TrialModel.__table__.c).where(TrialModel.id.in_(ids))
                by_id = {r.id: r for r in s.execute(page)} if ids else {}
                rows = [cast(TrialModel, by_id[i]) for i in ids]
            steps = steps_of(s, [r.id for r in rows]) if with_steps and rows else {}
            return [trial_record(r, steps.get(r.id, ())) for r in rows]

        if limit is None and offset == 0:
            return self._db.run(fn, write=False, what="list trials")

        # A page: sort and skip narrow id rows first (in index order: see _ordered), then
        # load only the page's rows, as plain rows on a plain connection (no ORM objects:
        # most of a page's CPU was theirs).
        ids_q = _ordered(select(TrialModel.id).where(*where), order).offset(offset)
        if limit is not None:
            ids_q = ids_q.limit(limit)

        def page(conn: Connection) -> list[TrialRecord]:
            ids = list(conn.scalars(ids_q))
            if not ids:
                return []
            rows = conn.execute(_TRIAL_ROWS.where(TrialModel.id.in_(ids))).all()
            by_id = {r[0]: r for r in rows}
            steps = steps_of_conn(conn, ids) if with_steps else {}
            return [trial_from_row(by_id[i], steps.get(i, ())) for i in ids]

        return self._db.read(page, what="list trials")

    def trial_page(
        self,
        study_id: int,
        *,
        state: str | None = None,
        limit: int = 100,
        offset: int = 0,
        order: str = "number",
    ) -> list[StoredTrialRow]:
        """A page of a study's trials as stored rows (:data:`TRIAL_COLUMNS`, the JSON columns
        as their stored text, not decoded; :func:`trial_from_stored` makes the records): the
        trials of ``list_trials(study_id, state=..., limit=..., offset=..., order=...)``, in
        its order, in one query.

        A reader that keeps what it derives from a row (a serialized table row, say) can
        reuse it while the stored row is equal, without decoding the row again: equal rows
        hold equal trials.
        """
        if state is not None and state not in TRIAL_STATES:
            raise ValueError(f"trial state must be one of {TRIAL_STATES}, got {state!r}")
        if order not in TRIAL_ORDERS:
            raise ValueError(f"order must be one of {TRIAL_ORDERS}, got {order!r}")
        if limit < 1 or offset < 0:
            raise ValueError(f"a page needs limit >= 1 and offset >= 0, got {limit}, {offset}")
        query = _page_query(order, state is not None)
        params: dict[str, Any] = {"study_id": study_id, "limit": limit, "offset": offset}
        if state is not None:
            params["state"] = state

        def page(conn: Connection) -> list[StoredTrialRow]:
            return [tuple(r) for r in conn.execute(query, params)]

        return self._db.read(page, what="list trials")

    def list_trial_points(self, study_id: int) -> list[TrialPoint]:
        """Every trial of a study in brief, by number: state, value, knobs, failure, GPU-seconds
        and the summary throughput / memory / step time (what charts of a whole study need).

        Much cheaper than :meth:`list_trials` on large studies: narrow rows, no ORM objects.
        """

        def fn(s: Session) -> list[TrialPoint]:
            t = TrialModel
            rows = s.execute(
                select(
                    t.id, t.number, t.state, t.params, t.value, t.failure_class, t.reason,
                    t.gpu_seconds, t.metrics, t.numerics, t.remeasure_of,
                )
                .where(t.study_id == study_id)
                .order_by(t.number)
            ).all()  # fmt: skip
            out = []
            for r in rows:
                m = r.metrics or {}
                out.append(
                    TrialPoint(
                        id=r.id,
                        number=r.number,
                        state=r.state,
                        params=dict(r.params or {}),
                        value=r.value,
                        failure_class=r.failure_class,
                        reason=r.reason,
                        gpu_seconds=r.gpu_seconds,
                        tflops_per_gpu=finite(m.get("tflops_per_gpu")),
                        peak_mem_gib=finite(m.get("peak_mem_gib")),
                        step_time_s=finite(m.get("step_time_s")),
                        numerics=r.numerics,
                        remeasure_of=r.remeasure_of,
                    )  # fmt: skip
                )
            return out

        return self._db.run(fn, write=False, what="list trial points")

    def list_trial_runs(self, study_id: int, *, last: int | None = None) -> list[TrialRun]:
        """Where and when a study's trials ran (those that started, or were re-queued after
        starting), the latest ``last`` starts (all when None), by start time.

        Narrow rows like :meth:`list_trial_points` (a timeline of 10,000 trials reads a
        fraction of what :meth:`list_trials` does).
        """

        def fn(s: Session) -> list[TrialRun]:
            t = TrialModel
            q = (
                select(
                    t.number, t.state, t.host, t.started_at, t.finished_at, t.value,
                    t.failure_class, t.reason, t.metrics, t.history,
                )
                .where(t.study_id == study_id, (t.started_at.is_not(None)) | (t.attempts > 0))
                .order_by(t.started_at.desc().nulls_last(), t.number.desc())
            )  # fmt: skip
            if last is not None:
                q = q.limit(last)
            rows = s.execute(q).all()
            runs = [
                TrialRun(
                    number=r.number,
                    state=r.state,
                    host=r.host,
                    started_at=r.started_at,
                    finished_at=r.finished_at,
                    value=r.value,
                    failure_class=r.failure_class,
                    reason=r.reason,
                    gpu_slots=gpu_slots_of(r.metrics),
                    history=tuple(dict(h) for h in (r.history or [])),
                )
                for r in rows
            ]
            runs.reverse()
            return runs

        return self._db.run(fn, write=False, what="list trial runs")

    def count_trial_runs(self, study_id: int) -> int:
        """How many of a study's trials ran (started, or were re-queued after starting)."""

        def fn(s: Session) -> int:
            t = TrialModel
            n = s.execute(
                select(func.count(t.id)).where(
                    t.study_id == study_id, (t.started_at.is_not(None)) | (t.attempts > 0)
                )
            ).scalar_one()
            return int(n)

        return self._db.run(fn, write=False, what="count trial runs")

    def count_trials(self, study_id: int) -> dict[str, int]:
        """Trials per state (every state present, 0 if none) and ``"total"``."""

        def fn(s: Session) -> dict[str, int]:
            rows = s.execute(
                # count(*), not count(id): PostgreSQL then counts from the index alone
                select(TrialModel.state, func.count())
                .where(TrialModel.study_id == study_id)
                .group_by(TrialModel.state)
            ).all()
            counts: dict[str, int] = dict.fromkeys(TRIAL_STATES, 0)
            for st, n in rows:
                counts[st] = int(n)
            counts["total"] = sum(int(n) for _, n in rows)
            return counts

        return self._db.run(fn, write=False, what="count trials")

    def count_numerics(self, study_id: int) -> dict[str, int]:
        """Complete trials per loss-parity status (every status present, 0 if none), and
        ``"remeasure"``: the study's re-measurement trials (any state)."""

        def fn(s: Session) -> dict[str, int]:
            rows = s.execute(
                select(TrialModel.numerics, func.count(TrialModel.id))
                .where(
                    TrialModel.study_id == study_id,
                    TrialModel.numerics.is_not(None),
                    TrialModel.state == "complete",
                )
                .group_by(TrialModel.numerics)
            ).all()
            out: dict[str, int] = dict.fromkeys(NUMERICS_STATUSES, 0)
            for st, n in rows:
                if st is not None:
                    out[st] = int(n)
            out["remeasure"] = int(
                s.execute(
                    select(func.count(TrialModel.id)).where(
                        TrialModel.study_id == study_id, TrialModel.remeasure_of.is_not(None)
                    )
                ).scalar_one()
            )
            return out

        return self._db.run(fn, write=False, what="count numerics")

    def gpu_seconds(self, study_id: int) -> float:
        """GPU-seconds spent by a study's trials (the sum over trials that recorded it; 0.0
        when none did)."""

        def fn(s: Session) -> float:
            total = s.execute(
                select(func.sum(TrialModel.gpu_seconds)).where(TrialModel.study_id == study_id)
            ).scalar_one()
            return float(total or 0.0)

        return self._db.run(fn, write=False, what="sum GPU-seconds")

    def gpu_totals(self, study_id: int) -> GpuTotals:
        """A study's trials added up for its GPU-time figures
        (:class:`dse.results.gpu_usage.GpuTotals`,
        what :func:`dse.results.gpu_usage.gpu_totals` computes from the records): one aggregate
        query
        over the trials' GPU-time columns, read from the index
        ``ix_trials_study_id_first_step_s_gpu`` alone, the median first step by walking it."""
        t = TrialModel
        estimate = t.source == "estimate"
        mine = or_(t.source.is_(None), t.source != "estimate")
        g = t.gpu_seconds
        split = (t.study_id == study_id, mine, t.first_step_s.is_not(None))
        # the median of an odd or even count: the element at count // 2 in ascending order
        median = (
            select(t.first_step_s)
            .where(*split)
            .order_by(t.first_step_s)
            .limit(1)
            .offset(select(func.count() // 2).where(*split).scalar_subquery())
            .scalar_subquery()
        )
        summed = [c for c in TRIAL_GPU_FIGURES if c != "first_step_s"]
        query = select(
            func.count().filter(estimate),
            func.count().filter(mine),
            func.sum(g).filter(mine, func.abs(g) <= _MAX_FLOAT),  # finite (NaN: not <=)
            func.count(g).filter(mine, g != 0),
            func.sum(g).filter(mine, g != 0),
            func.count(t.device_seconds).filter(mine),
            func.count(t.first_step_s).filter(mine),
            func.max(t.first_step_s).filter(mine),
            median,
            *(func.sum(getattr(t, c)).filter(mine) for c in summed),
        ).where(t.study_id == study_id)

        def fn(s: Session) -> GpuTotals:
            est, n, spent, ran, ran_s, timed, n_split, top, mid, *sums = s.execute(query).one()
            return GpuTotals(
                estimates=int(est),
                trials=int(n),
                gpu_seconds=_total(spent),
                ran=int(ran),
                ran_seconds=_total(ran_s),
                timed=int(timed),
                split=int(n_split),
                first_step_s_median=None if mid is None else float(mid),
                first_step_s_max=None if top is None else float(top),
                **{c: _total(x) for c, x in zip(summed, sums, strict=True)},
            )

        return self._db.run(fn, write=False, what="sum GPU time")

    def find_trial(self, study_id: int, params_key: str) -> TrialRecord | None:
        """The first answered (complete, infeasible or pruned) trial of that configuration,
        if any.

        Answers a duplicate proposal from storage instead of running it again.
        """

        def fn(s: Session) -> TrialRecord | None:
            row = s.scalars(
                select(TrialModel)
                .where(
                    TrialModel.study_id == study_id,
                    TrialModel.params_key == params_key,
                    TrialModel.state.in_(ANSWERED_STATES),
                )
                .order_by(TrialModel.number)
                .limit(1)
            ).first()
            return None if row is None else trial_record(row)

        return self._db.run(fn, write=False, what="find trial")

    def best_trial(
        self,
        study_id: int,
        direction: str,
        *,
        value_range: tuple[float, float] | None = None,
        exclude_changed: bool = False,
    ) -> TrialRecord | None:
        """The complete trial with the best value (ties: the lowest number), or None. A
        ``pruned`` trial is never the best (it stopped early, dominated).

        ``value_range=(low, high)``: only values with ``low < value <= high`` count (this
        also leaves out infinities and NaN). ``exclude_changed``: trials the loss-parity
        guard flagged (numerics ``changed``) do not count.
        """
        _check_direction(direction)
        where = _best_where(study_id, value_range, exclude_changed)

        def fn(s: Session) -> TrialRecord | None:
            # Two index walks on (study_id, value, number): the best value, then the lowest
            # number with it. One ``ORDER BY value DESC, number`` mixes directions, which
            # PostgreSQL cannot walk that index for: it sorted every complete trial (200 ms
            # at 100,000 trials).
            value = TrialModel.value.desc() if direction == "maximize" else TrialModel.value
            best = s.execute(
                select(TrialModel.value).where(*where).order_by(value).limit(1)
            ).scalar_one_or_none()
            if best is None:
                return None
            row = s.scalars(
                select(TrialModel)
                .where(*where, TrialModel.value == best)
                .order_by(TrialModel.number)
                .limit(1)
            ).first()
            return None if row is None else trial_record(row)

        return self._db.run(fn, write=False, what="best trial")

    def best_candidates(
        self,
        study_id: int,
        direction: str,
        *,
        limit: int,
        value_range: tuple[float, float] | None = None,
        exclude_changed: bool = False,
        with_steps: bool = True,
    ) -> list[TrialRecord]:
        """The complete trials a noise-aware best chooses among: the ``limit`` best by value
        (as :meth:`best_trial` counts them), and every other complete trial of the same
        configurations (``params_key``), whatever its value (re-measures of them), by number.
        """
        _check_direction(direction)
        where = _best_where(study_id, value_range, exclude_changed)

        def fn(s: Session) -> list[TrialRecord]:
            value = TrialModel.value.desc() if direction == "maximize" else TrialModel.value
            # one index walk on (study_id, value, number), as in best_trial
            top = s.execute(
                select(TrialModel.id, TrialModel.params_key)
                .where(*where)
                .order_by(value)
                .limit(limit)
            ).all()
            if not top:
                return []
            keys = sorted({k for _, k in top})
            # plain rows, not ORM objects (same attribute names), as in list_trials' pages
            rows = [
                cast(TrialModel, r)
                for r in s.execute(
                    select(*TrialModel.__table__.c)
                    .where(*where, TrialModel.params_key.in_(keys))
                    .order_by(TrialModel.number)
                )
            ]
            steps = steps_of(s, [r.id for r in rows]) if with_steps else {}
            return [trial_record(r, steps.get(r.id, ())) for r in rows]

        return self._db.run(fn, write=False, what="best candidates")

    def trials_of_configurations(
        self,
        study_id: int,
        params_keys: Sequence[str],
        *,
        state: str | None = None,
        with_steps: bool = False,
    ) -> list[TrialRecord]:
        """Every trial of these configurations (``params_key``), by number (one index walk
        per configuration, whatever the size of the study)."""
        keys = sorted(set(params_keys))
        if not keys:
            return []

        def fn(s: Session) -> list[TrialRecord]:
            where = [TrialModel.study_id == study_id, TrialModel.params_key.in_(keys)]
            if state is not None:
                where.append(TrialModel.state == state)
            # no ORDER BY: sorting by number in SQL made SQLite walk the study by number
            rows = [
                cast(TrialModel, r)
                for r in s.execute(select(*TrialModel.__table__.c).where(*where))
            ]
            rows.sort(key=lambda r: r.number)
            steps = steps_of(s, [r.id for r in rows]) if with_steps and rows else {}
            return [trial_record(r, steps.get(r.id, ())) for r in rows]

        return self._db.run(fn, write=False, what="trials of configurations")

    def best_configurations(
        self,
        study_id: int,
        direction: str,
        *,
        limit: int,
        value_range: tuple[float, float] | None = None,
        exclude_changed: bool = False,
    ) -> list[ConfigStats]:
        """The configurations (``params_key``) of the ``limit`` best trials by value (as
        :meth:`best_trial` counts them), each with an aggregate of every such trial of it:
        count, mean value, mean squared value, first trial. Three index walks, whatever the
        number of trials of a configuration."""
        _check_direction(direction)
        where = _best_where(study_id, value_range, exclude_changed)

        def fn(s: Session) -> list[ConfigStats]:
            value = TrialModel.value.desc() if direction == "maximize" else TrialModel.value
            keys = sorted(
                set(
                    s.scalars(
                        select(TrialModel.params_key).where(*where).order_by(value).limit(limit)
                    )
                )
            )
            if not keys:
                return []
            v = TrialModel.value
            agg = s.execute(
                select(
                    TrialModel.params_key,
                    func.count(TrialModel.id),
                    func.avg(v),
                    func.avg(v * v),
                    func.min(TrialModel.number),
                )
                .where(*where, TrialModel.params_key.in_(keys))
                .group_by(TrialModel.params_key)
            ).all()
            firsts = {r[4] for r in agg}
            params: dict[int, Any] = dict(
                s.execute(
                    select(TrialModel.number, TrialModel.params).where(
                        TrialModel.study_id == study_id, TrialModel.number.in_(firsts)
                    )
                ).all()
            )
            return [
                ConfigStats(
                    params_key=k,
                    params=dict(params.get(first) or {}),
                    first_number=first,
                    n=int(n),
                    mean=float(mean),
                    mean_sq=float(mean_sq),
                )  # fmt: skip
                for k, n, mean, mean_sq, first in agg
            ]

        return self._db.run(fn, write=False, what="best configurations")

    def stale_trials(
        self,
        study_id: int,
        *,
        older_than_s: float,
        states: Sequence[str] = ("running",),
    ) -> list[TrialRecord]:
        """Trials in ``states`` whose owner has not sent a heartbeat for ``older_than_s``.

        The last sign of life is the heartbeat, else the start, else the queueing time.
        Reconcile each with :meth:`finish_trial` (its metrics file has a result) or
        :meth:`requeue_trial`; both are safe against a racing controller.
        """
        bad = [st for st in states if st not in TRIAL_STATES]
        if bad:
            raise ValueError(f"trial states must be among {TRIAL_STATES}, got {bad}")

        def fn(s: Session) -> list[TrialRecord]:
            seen = func.coalesce(
                TrialModel.heartbeat_at, TrialModel.started_at, TrialModel.queued_at
            )
            rows = s.scalars(
                select(TrialModel)
                .where(
                    TrialModel.study_id == study_id,
                    TrialModel.state.in_(list(states)),
                    seen < time.time() - older_than_s,
                )
                .order_by(TrialModel.number)
            ).all()
            return [trial_record(r) for r in rows]

        return self._db.run(fn, write=False, what="stale trials")

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

    def list_rejections(
        self,
        study_id: int,
        *,
        limit: int | None = None,
        offset: int = 0,
        kind: str | None = None,
    ) -> list[RejectionRecord]:
        """A study's rejections, oldest first (``kind``: only those; a page with ``limit``
        and ``offset``)."""

        def fn(s: Session) -> list[RejectionRecord]:
            where = [RejectionModel.study_id == study_id]
            if kind is not None:
                where.append(RejectionModel.kind == kind)
            q = select(RejectionModel).where(*where).order_by(RejectionModel.id)
            if offset:
                q = q.offset(offset)
            if limit is not None:
                q = q.limit(limit)
            return [rejection_record(r) for r in s.scalars(q).all()]

        return self._db.run(fn, write=False, what="list rejections")

    def count_rejections(
        self, study_id: int, *, by: Literal["kind", "rule"] = "kind"
    ) -> dict[str, int]:
        """Rejections per kind (or per rule); no total key, so ``sum(...values())`` is it."""
        col = RejectionModel.kind if by == "kind" else RejectionModel.rule

        def fn(s: Session) -> dict[str, int]:
            rows = s.execute(
                select(col, func.count(RejectionModel.id))
                .where(RejectionModel.study_id == study_id)
                .group_by(col)
                .order_by(col)
            ).all()
            return {str(k): int(n) for k, n in rows}

        return self._db.run(fn, write=False, what="count rejections")

    # --- export / import ------------------------------------------------------------------

    def export_study(self, name: str) -> dict[str, Any]:
        """Everything a study has as one JSON-serializable dict (see :mod:`._export`).

        Raises:
            StudyNotFoundError: no such study.
        """

        def fn(s: Session) -> dict[str, Any]:
            return dump_study(s, _study_or_raise(s, name), revision=self.revision)

        return self._db.run(fn, write=False, what=f"export study {name!r}")

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
        :func:`~dse.storage._export.derive_study_fields`). With ``release``, what the
        export says is running is let go: nothing of this database runs it (its owners are
        controllers where it was exported, and its heartbeat may say anything): its running
        trials and those queued for a controller are re-queued ownerless, and a running or
        stopping study is stopped (``dse resume`` continues it). Every trial must be a
        configuration of the export's space (``trials_of_space``; off only for synthetic
        test data): :func:`~dse.storage._export.check_trials_of_space`.

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


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def _best_where(
    study_id: int, value_range: tuple[float, float] | None, exclude_changed: bool
) -> list[ColumnElement[bool]]:
    """Which trials a best counts: complete, with a value (in ``value_range``), and not
    flagged numerics ``changed`` when ``exclude_changed``."""
    where: list[ColumnElement[bool]] = [
        TrialModel.study_id == study_id,
        TrialModel.state == "complete",
        TrialModel.value.is_not(None),
    ]
    if value_range is not None:
        where += [TrialModel.value > value_range[0], TrialModel.value <= value_range[1]]
    if exclude_changed:
        where.append(TrialModel.numerics.is_(None) | (TrialModel.numerics != "changed"))
    return where


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


#: The largest finite float: ``abs(x) <= it`` holds for the finite numbers only, on SQLite
#: (which stores a NaN as NULL) and PostgreSQL (where NaN is above every number).
_MAX_FLOAT = 1.7976931348623157e308


def _total(x: Any) -> float:
    """A SUM of floats as a float (0.0 for none)."""
    return 0.0 if x is None else float(x)


def _set_metrics(row: TrialModel, metrics: dict[str, Any]) -> None:
    """Store a trial's metrics with the GPU-time columns they give
    (:func:`dse.results.gpu_usage.trial_gpu_figures`, summed by :meth:`Storage.gpu_totals`)."""
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


class StudyCounters(NamedTuple):
    """A study's id and change counters (:meth:`Storage.study_change_counters`)."""

    id: int
    version: int
    best_version: int


_COUNTERS = select(StudyModel.name, StudyModel.id, StudyModel.version, StudyModel.best_version)


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


def _study_by_name(s: Session, name: str) -> StudyModel | None:
    return s.scalars(select(StudyModel).where(StudyModel.name == name)).one_or_none()


def _study_or_raise(s: Session, name: str) -> StudyModel:
    row = _study_by_name(s, name)
    if row is None:
        raise StudyNotFoundError(f"no study named {name!r}")
    return row


def _study_id_or_raise(s: Session, study_id: int) -> StudyModel:
    row = s.get(StudyModel, study_id)
    if row is None:
        raise StudyNotFoundError(f"no study with id {study_id}")
    return row


def _trial_or_raise(s: Session, trial_id: int, *, for_update: bool = False) -> TrialModel:
    q = select(TrialModel).where(TrialModel.id == trial_id)
    if for_update:
        q = q.with_for_update()
    row = s.scalars(q).one_or_none()
    if row is None:
        raise TrialNotFoundError(f"no trial with id {trial_id}")
    return row


#: Every column of a trial, in :data:`TRIAL_COLUMNS` order (for :func:`trial_from_row`).
_TRIAL_ROWS = select(*(getattr(TrialModel, c) for c in TRIAL_COLUMNS))


#: Every column of a trial as stored: JSON columns as their text (see :meth:`trial_page`).
_STORED_TRIAL_ROWS = select(
    *(
        type_coerce(c, Text) if isinstance(c.type, JSONText) else c
        for c in (TrialModel.__table__.c[name] for name in TRIAL_COLUMNS)
    )
)


@functools.cache
def _page_query(order: str, by_state: bool) -> Select[Any]:
    """One query for a page of :meth:`Storage.trial_page`: the page's ids in index order
    (narrow rows sorted and skipped), then only their rows, sorted again (100 rows)."""
    where = [TrialModel.study_id == bindparam("study_id")]
    if by_state:
        where.append(TrialModel.state == bindparam("state"))
    ids = (
        _ordered(select(TrialModel.id).where(*where), order)
        .limit(bindparam("limit"))
        .offset(bindparam("offset"))
    )
    return _ordered(_STORED_TRIAL_ROWS.where(TrialModel.id.in_(ids.scalar_subquery())), order)


def _ordered(q: _Sel, order: str) -> _Sel:
    if order == "number":
        return q.order_by(TrialModel.number)
    if order == "-number":
        return q.order_by(TrialModel.number.desc())
    # NULLS LAST (SQLite >= 3.30, PostgreSQL) rather than a CASE key: the planner can then
    # walk ix_trials_study_id_value_number_id (value) or ix_trials_study_id_value_desc_number_id
    # (-value) instead of sorting every row of the study.
    value = TrialModel.value.asc() if order == "value" else TrialModel.value.desc()
    return q.order_by(value.nulls_last(), TrialModel.number)
