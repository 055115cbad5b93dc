"""SQLAlchemy 2.0 ORM models of a study database (private: records leave as frozen DTOs).

Closed sets of values (states, failure classes, metrics...) are the vocabulary's
:mod:`dse.core.records` literals; the columns are plain strings (no database enum), so a value
added there needs no migration. The schema is owned by the Alembic migrations in
``dse/storage/migrations/versions``; these models must match them exactly
(``tests/storage/test_migrations.py`` compares the two on every backend). Times are float
epoch seconds (portable across SQLite and PostgreSQL). JSON is kept in ``TEXT`` columns
through :class:`JSONText`, so values round-trip exactly on both backends, including
non-finite floats (a NaN loss), which PostgreSQL's ``json`` type would refuse.
"""

from __future__ import annotations

import json
from typing import Any

try:  # optional (the api extra): parses a trial page's JSON columns several times faster
    import orjson
except ImportError:  # pragma: no cover - json alone gives the same values
    orjson = None  # type: ignore[assignment]

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from dse.core.records import (
    Direction,
    FailureClass,
    Metric,
    NumericsStatus,
    RejectionKind,
    Source,
    StudyState,
    TrialState,
)
from dse.stats.gpu_figures import TRIAL_GPU_FIGURES

__all__ = [
    "Base",
    "JSONText",
    "json_value",
    "StudyModel",
    "StudyAttrModel",
    "TrialModel",
    "TrialParamModel",
    "TrialStepModel",
    "RejectionModel",
]


# Deterministic constraint names, identical on every backend (Alembic relies on them).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class JSONText(TypeDecorator[Any]):
    """A JSON value stored as ``TEXT`` (exact round trip; NaN/Infinity allowed)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else json.dumps(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        return json_value(value)


def json_value(text: str | None) -> Any:
    """The value of a :class:`JSONText` column's stored text (None stays None)."""
    if text is None:
        return None
    if orjson is not None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:  # NaN or Infinity (json writes them), huge ints
            pass
    return json.loads(text)


class FreeText(TypeDecorator[str]):
    """``TEXT`` that any string can be written to: a NUL (which PostgreSQL refuses in text)
    and a lone surrogate (which no UTF-8 encoder takes) are stored as ``\\x00`` / ``\\ud800``.
    For text that comes from outside, such as a failure reason quoting a trial's last log
    line (read back the same way, rows written before included)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return _storable(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return _storable(value)  # a row written before (SQLite took NULs)


def _storable(value: str | None) -> str | None:
    if value is None or ("\x00" not in value and value.isascii()):
        return value
    value = value.replace("\x00", "\\x00")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


class Base(DeclarativeBase):
    """Declarative base of the dse schema."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StudyModel(Base):
    """One study: the space file as given, its hash, the objective and its state."""

    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    space_yaml: Mapped[str] = mapped_column(Text)
    space_hash: Mapped[str] = mapped_column(String(128))
    state: Mapped[StudyState] = mapped_column(String(16))
    direction: Mapped[Direction] = mapped_column(String(16))
    metric: Mapped[Metric] = mapped_column(String(128))
    model: Mapped[Any] = mapped_column(JSONText, nullable=False)
    hardware: Mapped[Any] = mapped_column(JSONText, nullable=False)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    #: Bumped by every write of the study's trials, rejections, state or attributes (not by
    #: heartbeats), in the same transaction (0003): the key of cached answers.
    version: Mapped[int] = mapped_column(Integer, server_default=text("0"), default=0)
    #: Bumped with ``version`` by every write that can change the study's best: all of them
    #: but those that only queue, acquire, start or re-queue unfinished trials (0005). The
    #: key of the cached best, which a controller's claims and starts then leave in place.
    best_version: Mapped[int] = mapped_column(Integer, server_default=text("0"), default=0)


class StudyAttrModel(Base):
    """A JSON attribute of a study (cost-model calibration, agent info, ...)."""

    __tablename__ = "study_attrs"

    study_id: Mapped[int] = mapped_column(
        ForeignKey("studies.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[Any] = mapped_column(JSONText, nullable=True)


class TrialModel(Base):
    """One trial: its configuration, state, outcome, where and when it ran."""

    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number"),
        # covering: trial counts per state and GPU-seconds read only the index (0002)
        Index("ix_trials_study_id_state_gpu_seconds", "study_id", "state", "gpu_seconds"),
        # ordered pages by value (ties by number) and the best trial walk the index, pages
        # by number this one; the page's ids from the index alone (0005: PostgreSQL's
        # indexes do not carry the primary key as SQLite's do)
        Index("ix_trials_study_id_value_number_id", "study_id", "value", "number", "id"),
        Index("ix_trials_study_id_number_id", "study_id", "number", "id"),
        # duplicates of a configuration, and the noise-aware best's aggregates per
        # configuration from the index alone (0003)
        Index(
            "ix_trials_study_id_params_key_state_value",
            "study_id",
            "params_key",
            "state",
            "numerics",
            "value",
            "number",
        ),  # fmt: skip
        # best without numerics-changed trials, and their count per study (0003)
        Index("ix_trials_study_id_numerics", "study_id", "numerics"),
        # covering: a study's GPU-time totals (Storage.gpu_totals) from the index alone, the
        # median first step by walking it (0006)
        Index(
            "ix_trials_study_id_first_step_s_gpu",
            "study_id",
            "first_step_s",
            "source",
            "gpu_seconds",
            *(f for f in TRIAL_GPU_FIGURES if f != "first_step_s"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[TrialState] = mapped_column(String(16))
    params: Mapped[Any] = mapped_column(JSONText, nullable=False)
    params_key: Mapped[str] = mapped_column(Text)
    metrics: Mapped[Any] = mapped_column(JSONText, nullable=False)
    value: Mapped[float | None] = mapped_column(Float)
    failure_class: Mapped[FailureClass | None] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(FreeText)
    source: Mapped[Source | None] = mapped_column(String(16))
    runner: Mapped[str | None] = mapped_column(String(255))
    host: Mapped[str | None] = mapped_column(String(255))
    log_path: Mapped[str | None] = mapped_column(Text)
    metrics_path: Mapped[str | None] = mapped_column(Text)
    queued_at: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)
    gpu_seconds: Mapped[float | None] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer)
    history: Mapped[Any] = mapped_column(JSONText, nullable=False)
    #: the status of ``metrics["numerics"]`` (kept in step with it by the repository)
    numerics: Mapped[NumericsStatus | None] = mapped_column(String(16))
    #: the number of the trial whose configuration this one re-measures
    remeasure_of: Mapped[int | None] = mapped_column(Integer)
    # the trial's part of its study's GPU time (dse.stats.gpu_figures.trial_gpu_figures of its
    # metrics, written with them by the repository; 0006)
    gpu_seconds_startup: Mapped[float | None] = mapped_column(Float)
    gpu_seconds_measure: Mapped[float | None] = mapped_column(Float)
    device_seconds: Mapped[float | None] = mapped_column(Float)
    device_seconds_measure: Mapped[float | None] = mapped_column(Float)
    device_seconds_measured: Mapped[float | None] = mapped_column(Float)
    device_seconds_kernel: Mapped[float | None] = mapped_column(Float)
    device_seconds_first_step: Mapped[float | None] = mapped_column(Float)
    first_step_s: Mapped[float | None] = mapped_column(Float)


# The figures are named once, in dse.stats.gpu_figures; the columns above are declared for the
# type checker, and a figure without its column (or a column left behind) stops the import.
_GPU_PREFIXES = ("gpu_", "device_", "first_")
_GPU_COLUMNS = {c.name for c in TrialModel.__table__.columns if c.name.startswith(_GPU_PREFIXES)}
_GPU_COLUMNS -= {"gpu_seconds"}  # the trial's whole GPU time, older than the figures
if _GPU_COLUMNS != set(TRIAL_GPU_FIGURES):  # pragma: no cover - a developer's slip
    raise RuntimeError(
        f"TrialModel's GPU-time columns {sorted(_GPU_COLUMNS)} are not "
        f"dse.stats.gpu_figures.TRIAL_GPU_FIGURES {sorted(TRIAL_GPU_FIGURES)}"
    )


# Pages by -value (best first, ties by number, no value last) walk this one (0003, with the id
# since 0005); on SQLite the migration leaves out NULLS LAST (a descending index has them
# last; it refuses the words).
Index(
    "ix_trials_study_id_value_desc_number_id",
    TrialModel.study_id,
    TrialModel.value.desc().nulls_last(),
    TrialModel.number,
    TrialModel.id,
)


class TrialParamModel(Base):
    """One knob value of a trial (the same values as ``trials.params``, queryable per knob)."""

    __tablename__ = "trial_params"

    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    value_json: Mapped[str] = mapped_column(Text)


class TrialStepModel(Base):
    """One training step of a trial (rows are replaced as a whole when a trial finishes).

    ``loss`` is nullable because SQLite stores a NaN as NULL; a NULL loss reads back as NaN.
    """

    __tablename__ = "trial_steps"
    __table_args__ = (Index("ix_trial_steps_trial_id_step", "trial_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    tflops_per_gpu: Mapped[float | None] = mapped_column(Float)
    peak_mem_gib: Mapped[float | None] = mapped_column(Float)
    peak_reserved_gib: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    grad_norm: Mapped[float | None] = mapped_column(Float)


class RejectionModel(Base):
    """A proposal rejected before launch (a validity rule or the cost-model pre-screen)."""

    __tablename__ = "rejections"
    __table_args__ = (Index("ix_rejections_study_id_kind", "study_id", "kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    params: Mapped[Any] = mapped_column(JSONText, nullable=False)
    params_key: Mapped[str] = mapped_column(Text)
    kind: Mapped[RejectionKind] = mapped_column(String(32))
    rule: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(FreeText)
    values: Mapped[Any] = mapped_column(JSONText, nullable=False)
    created_at: Mapped[float] = mapped_column(Float)
