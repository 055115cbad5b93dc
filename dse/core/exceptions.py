"""The one exception hierarchy of dse.

Expected trial failures (OOM, invalid configuration, hang, NaN loss) are *values*
(:class:`dse.core.records.Outcome`), never exceptions. Exceptions are for bad input and bugs.
"""

from __future__ import annotations

__all__ = [
    "DSEError",
    "SpaceError",
    "UnknownKnobError",
    "ConstraintEvalError",
    "StorageError",
    "StorageURLError",
    "StudyNotFoundError",
    "NoCompleteTrialError",
    "DuplicatedStudyError",
    "TrialNotFoundError",
    "SchemaVersionError",
    "StudyFormatError",
    "TrialLaunchError",
    "WorkloadError",
    "NoEquivalentError",
]


class DSEError(Exception):
    """Root of every error dse raises on purpose."""


class SpaceError(DSEError, ValueError):
    """A space file is malformed or impossible. The message names the file and field."""


class UnknownKnobError(SpaceError):
    """A knob name that the catalog does not know."""


class ConstraintEvalError(SpaceError):
    """A space's constraint could not be evaluated on a configuration (a division by zero,
    a type mismatch, a result beyond the bounds). ``expr`` is the constraint, ``reason`` why,
    ``where`` its place in the space file (``constraints[2]``; "constraint" when unknown)."""

    def __init__(self, expr: str, reason: str, where: str = "constraint") -> None:
        self.expr = expr
        self.reason = reason
        self.where = where
        shown = repr(expr) if len(expr) <= 200 else repr(expr[:200]) + "..."
        super().__init__(f"{where} {shown} cannot be evaluated: {reason}")


class StorageError(DSEError):
    """A database operation failed (translated from the driver's error)."""


class StorageURLError(StorageError, ValueError):
    """A storage URL that is malformed or names a database driver that is not installed
    (bad input: the message names the URL)."""


class StudyNotFoundError(StorageError, LookupError):
    """No study of that name in the storage."""


class NoCompleteTrialError(DSEError, LookupError):
    """The study exists but has no complete trial yet (not bad input: ask again later)."""


class DuplicatedStudyError(StorageError):
    """A study of that name already exists with a different space."""


class TrialNotFoundError(StorageError, LookupError):
    """No trial with that id."""


class SchemaVersionError(StorageError):
    """The database was written by a newer dse than this one."""


class StudyFormatError(DSEError, ValueError):
    """An exported study file is malformed or of an unknown format version."""


class TrialLaunchError(DSEError):
    """The runner could not start a trial process at all (infrastructure, not the config)."""


class WorkloadError(DSEError):
    """A workload is misconfigured (missing table, unknown backend)."""


class NoEquivalentError(DSEError, ValueError):
    """A knob value that a recipe target cannot express (``dse best --format megatron`` of a
    configuration with ``attention_backend=sdpa``, dse's own): the message names the knob,
    the value, the target and why, with the nearest upstream setting where there is one.
    Nothing is translated silently instead."""

    def __init__(self, knob: str, value: object, target: str, why: str) -> None:
        self.knob = knob
        self.value = value
        self.target = target
        self.why = why
        super().__init__(f"{knob}={value!r} has no {target} equivalent: {why}")
