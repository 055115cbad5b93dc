"""The read queries of a study database: what the dashboard, the API, the CLI and an agent's
restore ask of it. :class:`StorageReads` holds them, apart from the writes of
:class:`~dse.storage._repository.Storage` (which adds the writes to these reads); each read runs
in its own transaction and returns frozen records, as the repository's contract says.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    Select,
    Text,
    bindparam,
    func,
    or_,
    select,
    type_coerce,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from dse.core.exceptions import (
    StudyNotFoundError,
    TrialNotFoundError,
)
from dse.core.records import (
    ANSWERED_STATES,
    DIRECTIONS,
    NUMERICS_STATUSES,
    TRIAL_STATES,
    ConfigStats,
    RejectionRecord,
    StudyRecord,
    TrialPoint,
    TrialRecord,
    TrialRun,
    finite,
    gpu_slots_of,
    sample_numbers,
)
from dse.stats.gpu_figures import TRIAL_GPU_FIGURES, GpuTotals
from dse.storage._engine import (
    SessionScope,
)
from dse.storage._models import (
    JSONText,
    RejectionModel,
    StudyAttrModel,
    StudyModel,
    TrialModel,
)
from dse.storage._rows import (
    TRIAL_COLUMNS,
    StoredTrialRow,
    rejection_record,
    steps_of,
    steps_of_conn,
    study_record,
    trial_from_row,
    trial_record,
)
from dse.storage._study_file import (
    dump_study,
)

__all__ = ["StorageReads", "StudyCounters", "TRIAL_ORDERS"]

#: Trial orders accepted by :meth:`Storage.list_trials`.
TRIAL_ORDERS: tuple[str, ...] = ("number", "-number", "value", "-value")


_Sel = TypeVar("_Sel", bound=Select[Any])


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


#: The largest finite float: ``abs(x) <= it`` holds for the finite numbers only, on SQLite
#: (which stores a NaN as NULL) and PostgreSQL (where NaN is above every number).
_MAX_FLOAT = 1.7976931348623157e308


def _total(x: Any) -> float:
    """A SUM of floats as a float (0.0 for none)."""
    return 0.0 if x is None else float(x)


class StudyCounters(NamedTuple):
    """A study's id and change counters (:meth:`Storage.study_change_counters`)."""

    id: int
    version: int
    best_version: int


_COUNTERS = select(StudyModel.name, StudyModel.id, StudyModel.version, StudyModel.best_version)


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


def _study_by_name(s: Session, name: str) -> StudyModel | None:
    return s.scalars(select(StudyModel).where(StudyModel.name == name)).one_or_none()


class StorageReads:
    """The read queries of :class:`~dse.storage._repository.Storage` (its base class): studies,
    trials, pages, points, counts, GPU totals, best configurations, rejections, exports.

    The subclass provides the session scope (``_db``) these run in and the revision.
    """

    _db: SessionScope
    #: the schema revision the database is at (set by the subclass)
    revision: str

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

    def sample_complete(
        self, study_id: int, limit: int, *, seed: int = 0
    ) -> tuple[int, list[tuple[int, dict[str, Any], float]]]:
        """At most ``limit`` of a study's complete trials that have a value, as
        ``(number, params, value)`` by number, and how many such trials there are.

        All of them when there are ``limit`` or fewer; else the ``limit`` whose numbers hash
        lowest (with ``seed``): a uniform sample that a new trial changes by at most one
        member, so figures drawn from it do not jump as a study grows. Two narrow queries:
        every such trial's number, then the sample's knobs; the cost is bounded by ``limit``
        apart from reading numbers.
        """
        if limit < 1:
            raise ValueError(f"sample_complete: limit must be >= 1, got {limit}")
        t = TrialModel
        done = (t.study_id == study_id, t.state == "complete", t.value.is_not(None))

        def fn(s: Session) -> tuple[int, list[tuple[int, dict[str, Any], float]]]:
            numbers = list(s.scalars(select(t.number).where(*done)))
            chosen: list[int] | None = None
            if len(numbers) > limit:
                chosen = sample_numbers(numbers, limit, seed)
            rows: list[tuple[int, dict[str, Any], float]] = []
            q = select(t.number, t.params, t.value).where(*done)
            batches = [None] if chosen is None else [
                chosen[i : i + 500] for i in range(0, len(chosen), 500)
            ]  # fmt: skip
            for batch in batches:
                qb = q if batch is None else q.where(t.number.in_(batch))
                rows.extend((r.number, dict(r.params or {}), r.value) for r in s.execute(qb))
            rows.sort(key=lambda r: r[0])
            return len(numbers), rows

        return self._db.run(fn, write=False, what="sample complete trials")

    def trial_sources(self, study_id: int) -> set[str]:
        """The distinct ``source`` of a study's trials (``measured``, ``replay``,
        ``estimate``; trials without one left out)."""
        t = TrialModel
        query = select(t.source).where(t.study_id == study_id, t.source.is_not(None)).distinct()
        return self._db.run(
            lambda s: {str(v) for v in s.scalars(query)}, write=False, what="trial sources"
        )

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
        (:class:`dse.stats.gpu_figures.GpuTotals`,
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

    def configuration_stats(
        self,
        study_id: int,
        *,
        params_keys: Sequence[str] | None = None,
        repeated: bool = False,
        value_range: tuple[float, float] | None = None,
        exclude_changed: bool = False,
    ) -> list[ConfigStats]:
        """The eligible trials (as :meth:`best_configurations` counts them) of configurations
        in aggregate, one :class:`ConfigStats` per ``params_key``: those of ``params_keys``,
        or with ``repeated`` every configuration measured more than once (the study's
        run-to-run evidence, one grouped index walk)."""
        where = _best_where(study_id, value_range, exclude_changed)
        if params_keys is not None:
            keys = sorted(set(params_keys))
            if not keys:
                return []
            where.append(TrialModel.params_key.in_(keys))

        def fn(s: Session) -> list[ConfigStats]:
            v = TrialModel.value
            q = (
                select(
                    TrialModel.params_key,
                    func.count(TrialModel.id),
                    func.avg(v),
                    func.avg(v * v),
                    func.min(TrialModel.number),
                )
                .where(*where)
                .group_by(TrialModel.params_key)
            )
            if repeated:
                q = q.having(func.count(TrialModel.id) > 1)
            agg = s.execute(q).all()
            if not agg:
                return []
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

        return self._db.run(fn, write=False, what="configuration statistics")

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

    def export_study(self, name: str) -> dict[str, Any]:
        """Everything a study has as one JSON-serializable dict (see :mod:`._study_file`).

        Raises:
            StudyNotFoundError: no such study.
        """

        def fn(s: Session) -> dict[str, Any]:
            return dump_study(s, _study_or_raise(s, name), revision=self.revision)

        return self._db.run(fn, write=False, what=f"export study {name!r}")
