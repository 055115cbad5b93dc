"""A whole study as one JSON document, and back.

Format (``format_version`` 1)::

    {
      "format": "dse-study",
      "format_version": 1,
      "schema_revision": "0001",          # the database schema it was exported from
      "exported_at": 1767225600.0,
      "study": {"name", "space_yaml", "space_hash", "state", "direction", "metric",
                "model", "hardware", "created_at", "updated_at"},
      "attrs": {"<key>": <JSON value>, ...},
      "trials": [{"number", "state", "params", "params_key", "metrics", "value",
                  "failure_class", "reason", "source", "runner", "host", "log_path",
                  "metrics_path", "queued_at", "started_at", "finished_at", "heartbeat_at",
                  "gpu_seconds", "attempts", "history", "remeasure_of",
                  "steps": [{"step", "step_time_s", "tflops_per_gpu", "peak_mem_gib",
                             "peak_reserved_gib", "loss", "grad_norm"}, ...]}, ...],
      "rejections": [{"params", "params_key", "kind", "rule", "reason", "values",
                      "created_at"}, ...]
    }

Database ids are not exported (trials are identified by number). Non-finite floats (a NaN
loss) are written as Python's ``json`` writes them (``NaN``), which Python reads back.

An export comes from elsewhere, so reading one is bounded (:func:`read_export_text`): its size,
its nesting, its integers (64-bit, 32-bit where the column is) and its trial values (finite,
at most :data:`~dse.core.bounds.MAX_ABS_VALUE` in magnitude: an imported 1e308 would otherwise win
every cross-study ranking). Every refusal is a :class:`StudyFormatError` naming the field.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections import Counter
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from dse.core.bounds import (
    MAX_ABS_VALUE,
    MAX_EXPORT_BYTES,
    MAX_JSON_DEPTH,
    MAX_SPACE_BYTES,
    printable,
)
from dse.core.exceptions import SpaceError, StudyFormatError
from dse.core.records import STUDY_STATES, TRIAL_STATES, Direction, numerics_status
from dse.core.safeyaml import safe_load
from dse.space.searchspace import parse_space_text
from dse.stats.gpu_figures import trial_gpu_figures
from dse.storage._engine import redact_passwords
from dse.storage._models import (
    RejectionModel,
    StudyAttrModel,
    StudyModel,
    TrialModel,
    TrialParamModel,
    TrialStepModel,
)
from dse.storage._rows import param_rows, steps_of

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "StudyExport",
    "dump_study",
    "parse_export",
    "read_export_text",
    "load_study",
    "derive_study_fields",
    "check_trials_of_space",
    "DERIVED_FIELDS",
]

FORMAT = "dse-study"
FORMAT_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


#: An INTEGER column (32-bit in PostgreSQL).
_Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
#: A trial value or a timing: finite (allow_inf_nan=False) and not absurd.
_Value = Annotated[float, Field(ge=-MAX_ABS_VALUE, le=MAX_ABS_VALUE)]


class StepExport(_Strict):
    # a diverged step has a NaN (or infinite) loss: that is data, not an error
    model_config = ConfigDict(extra="forbid", allow_inf_nan=True)

    step: _Int32
    step_time_s: float | None
    tflops_per_gpu: float | None
    peak_mem_gib: float | None
    peak_reserved_gib: float | None
    loss: float | None
    grad_norm: float | None = None


class TrialExport(_Strict):
    number: int = Field(ge=0, le=2**31 - 1)
    state: str
    params: dict[str, Any]
    params_key: str
    metrics: dict[str, Any] = Field(default_factory=dict)
    value: _Value | None = None
    failure_class: str | None = None
    reason: str | None = None
    source: str | None = None
    runner: str | None = None
    host: str | None = None
    log_path: str | None = None
    metrics_path: str | None = None
    queued_at: _Value | None = None
    started_at: _Value | None = None
    finished_at: _Value | None = None
    heartbeat_at: _Value | None = None
    gpu_seconds: _Value | None = None
    attempts: int = Field(0, ge=0, le=2**31 - 1)
    history: list[dict[str, Any]] = Field(default_factory=list)
    remeasure_of: int | None = Field(None, ge=0, le=2**31 - 1)
    steps: list[StepExport] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_state(self) -> TrialExport:
        if self.state not in TRIAL_STATES:
            raise ValueError(
                f"trial {self.number}: state must be one of {TRIAL_STATES}, got {self.state!r}"
            )
        return self


class RejectionExport(_Strict):
    params: dict[str, Any]
    params_key: str
    kind: str
    rule: str
    reason: str
    values: dict[str, Any] = Field(default_factory=dict)
    created_at: float


class StudyMetaExport(_Strict):
    name: str = Field(min_length=1, max_length=255)
    space_yaml: str = Field(max_length=MAX_SPACE_BYTES)
    space_hash: str
    state: str
    direction: Direction
    metric: str
    model: dict[str, Any] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    updated_at: float | None = None

    @field_validator("space_yaml")
    @classmethod
    def _readable_space(cls, v: str) -> str:
        # resume, best and the API parse it later: refuse what the space-file reader refuses
        # (an alias bomb, duplicate keys, ...) now, before it is stored
        try:
            safe_load(v)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise ValueError(
                f"not a readable space file{where}: {getattr(e, 'problem', None) or e}"
            ) from None
        except RecursionError:
            raise ValueError("not a readable space file: nested too deeply") from None
        return v

    @model_validator(mode="after")
    def _known_state(self) -> StudyMetaExport:
        if self.state not in STUDY_STATES:
            raise ValueError(f"study state must be one of {STUDY_STATES}, got {self.state!r}")
        return self


class StudyExport(_Strict):
    """The validated form of an export document."""

    format: Literal["dse-study"]
    format_version: int
    schema_revision: str | None = None
    exported_at: float | None = None
    study: StudyMetaExport
    attrs: dict[str, Any] = Field(default_factory=dict)
    trials: list[TrialExport] = Field(default_factory=list)
    rejections: list[RejectionExport] = Field(default_factory=list)

    @model_validator(mode="after")
    def _checks(self) -> StudyExport:
        if not 1 <= self.format_version <= FORMAT_VERSION:
            raise ValueError(
                f"format_version {self.format_version} is not readable by this dse "
                f"(it reads 1..{FORMAT_VERSION}); export it with this dse's version"
            )
        counts = Counter(t.number for t in self.trials)
        dup = sorted(n for n, c in counts.items() if c > 1)
        if dup:
            raise ValueError(f"trial numbers must be unique, repeated: {dup}")
        return self


def parse_export(data: Any) -> StudyExport:
    """Validate an export document.

    Raises:
        StudyFormatError: not a dse study export this dse can read (the message says why).
    """
    if not isinstance(data, dict):
        raise StudyFormatError(f"a study export must be a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise StudyFormatError(
            f"not a dse study export: 'format' is {data.get('format')!r}, expected {FORMAT!r}"
        )
    _check_json(data)
    try:
        return StudyExport.model_validate(data)
    except ValidationError as e:
        raise StudyFormatError(_readable(e)) from None
    except RecursionError:
        raise StudyFormatError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None


def read_export_text(text: str | bytes) -> StudyExport:
    """Parse and validate the JSON text of an export (a file's bytes must be UTF-8).

    Raises:
        StudyFormatError: too large, not UTF-8, not JSON, nested too deeply, an integer
            out of range, or not a valid export (the message names the field).
    """
    if len(text) > MAX_EXPORT_BYTES:
        raise StudyFormatError(f"larger than {MAX_EXPORT_BYTES} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise StudyFormatError(f"not UTF-8 text (byte {e.start}: {e.reason})") from None
    repeated: list[str] = []
    try:
        data = json.loads(
            text, parse_int=_parse_int, object_pairs_hook=functools.partial(_object, repeated)
        )
    except RecursionError:
        raise StudyFormatError(f"not JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # json.JSONDecodeError, _parse_int
        raise StudyFormatError(printable(f"not JSON: {e}")) from None
    if repeated:  # json keeps the last value silently: an edited copy would win unseen
        raise StudyFormatError(_duplicate_key(text, repeated[0]))
    return parse_export(data)


def _object(repeated: list[str], pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object (``object_pairs_hook``), noting in ``repeated`` a key given twice."""
    d = dict(pairs)
    if len(d) != len(pairs) and not repeated:
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                repeated.append(k)
                break
            seen.add(k)
    return d


#: What locates a duplicate key: strings (keys among them) and the punctuation that says
#: where in the document one is; numbers and literals need no look.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],]')


def _duplicate_key(text: str, key: str) -> str:
    """Where the first key given twice in one object is: its JSON path and line (the text
    is valid JSON: the parser read it)."""
    # each open container: [keys seen (object) or None (array), key or index now]
    stack: list[list[Any]] = []
    expect_key = False
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok == "{":
            stack.append([set(), None])
            expect_key = True
        elif tok == "[":
            stack.append([None, 0])
            expect_key = False
        elif tok in "}]":
            stack.pop()
            expect_key = False
        elif tok == ",":
            top = stack[-1]
            if top[0] is None:
                top[1] += 1
            else:
                expect_key = True
        elif expect_key:  # a key
            expect_key = False
            name = json.loads(tok)
            top = stack[-1]
            if name in top[0]:
                line = text.count("\n", 0, m.start()) + 1
                path = _path_of(stack[:-1])
                return printable(
                    f"{_escaped(path) or '(top level)'}: the key {_escaped(repr(name))} is "
                    f"given more than once (again at line {line}); keep one"
                )
            top[0].add(name)
            top[1] = name
    return printable(f"the key {_escaped(repr(key))} is given more than once in an object")


def _path_of(stack: list[list[Any]]) -> str:
    path = ""
    for keys, at in stack:
        if keys is None:
            path += f"[{at}]"
        else:
            path += f".{at}" if path else str(at)
    return path


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > 19:  # beyond any 64-bit integer
        raise ValueError(f"an integer of {len(s.lstrip('-'))} digits is out of range")
    return int(s)


def _text_problem(v: str) -> str | None:
    """Why a string cannot be stored as text (None when it can): a NUL character, or a lone
    surrogate (a ``\\ud800`` escape that is half of a pair: no UTF-8 encoder takes it)."""
    if v.isascii():
        return "a NUL character (\\u0000)" if "\x00" in v else None
    if "\x00" in v:
        return "a NUL character (\\u0000)"
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (half of a UTF-16 pair, not a character)"
    return None


def _check_json(data: Any) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH, integers beyond 64 bits and strings that
    cannot be stored as text (NUL, lone surrogates), naming where (iterative: a deep document
    cannot exhaust the stack)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise StudyFormatError(
                printable(f"{path or '(top level)'}: nested deeper than {MAX_JSON_DEPTH} levels")
            )
        if isinstance(v, str):
            why = _text_problem(v)
            if why is not None:
                raise StudyFormatError(f"{_escaped(path) or '(top level)'}: a string with {why}")
        elif isinstance(v, dict):
            for k in v:
                why = _text_problem(k)
                if why is not None:
                    raise StudyFormatError(f"{_escaped(path) or '(top level)'}: a key with {why}")
            stack.extend((x, f"{path}.{k}" if path else str(k), depth + 1) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
        elif isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
            raise StudyFormatError(
                printable(f"{path or '(top level)'}: the integer {v} is out of the 64-bit range")
            )


def _escaped(path: str) -> str:
    """A JSON path safe to print (keys may hold any character)."""
    return printable(path.encode("utf-8", "backslashreplace").decode("utf-8"))


def _readable(e: ValidationError, limit: int = 20) -> str:
    """A validation error as 'field.path: message' lines (at most ``limit``)."""
    lines = []
    for err in e.errors()[:limit]:
        where = ""
        for part in err["loc"]:
            where += f"[{part}]" if isinstance(part, int) else ("." if where else "") + str(part)
        msg = err["msg"].removeprefix("Value error, ")
        line = f"{where or '(top level)'}: {msg}"
        lines.append(printable(line if len(line) <= 1000 else line[:997] + "..."))
    if e.error_count() > limit:
        lines.append(f"... and {e.error_count() - limit} more errors")
    return "invalid dse study export:\n  " + "\n  ".join(lines)


def dump_study(s: Session, study: StudyModel, *, revision: str) -> dict[str, Any]:
    """Everything ``study`` has, as a JSON-serializable dict (inside the caller's session)."""
    attrs = s.scalars(
        select(StudyAttrModel)
        .where(StudyAttrModel.study_id == study.id)
        .order_by(StudyAttrModel.key)
    ).all()
    trials = s.scalars(
        select(TrialModel).where(TrialModel.study_id == study.id).order_by(TrialModel.number)
    ).all()
    steps = steps_of(s, [t.id for t in trials]) if trials else {}
    rejections = s.scalars(
        select(RejectionModel)
        .where(RejectionModel.study_id == study.id)
        .order_by(RejectionModel.id)
    ).all()
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "schema_revision": revision,
        "exported_at": time.time(),
        "study": {
            "name": study.name,
            "space_yaml": redact_passwords(study.space_yaml),
            "space_hash": study.space_hash,
            "state": study.state,
            "direction": study.direction,
            "metric": study.metric,
            "model": study.model,
            "hardware": study.hardware,
            "created_at": study.created_at,
            "updated_at": study.updated_at,
        },
        "attrs": {a.key: a.value for a in attrs},
        "trials": [
            {
                "number": t.number,
                "state": t.state,
                "params": t.params,
                "params_key": t.params_key,
                "metrics": t.metrics,
                "value": t.value,
                "failure_class": t.failure_class,
                "reason": t.reason,
                "source": t.source,
                "runner": t.runner,
                "host": t.host,
                "log_path": t.log_path,
                "metrics_path": t.metrics_path,
                "queued_at": t.queued_at,
                "started_at": t.started_at,
                "finished_at": t.finished_at,
                "heartbeat_at": t.heartbeat_at,
                "gpu_seconds": t.gpu_seconds,
                "attempts": t.attempts,
                "history": list(t.history or []),
                "remeasure_of": t.remeasure_of,
                "steps": [
                    {
                        "step": st.step,
                        "step_time_s": st.step_time_s,
                        "tflops_per_gpu": st.tflops_per_gpu,
                        "peak_mem_gib": st.peak_mem_gib,
                        "peak_reserved_gib": st.peak_reserved_gib,
                        "loss": st.loss,
                        "grad_norm": st.grad_norm,
                    }
                    for st in steps.get(t.id, ())
                ],
            }
            for t in trials
        ],
        "rejections": [
            {
                "params": r.params,
                "params_key": r.params_key,
                "kind": r.kind,
                "rule": r.rule,
                "reason": r.reason,
                "values": r.values,
                "created_at": r.created_at,
            }
            for r in rejections
        ],
    }


#: What a study record keeps of its space besides the text (:meth:`SearchSpace.study_fields`);
#: an import takes them from the export's space file, never from the file's own copy.
DERIVED_FIELDS = ("space_hash", "direction", "metric", "model", "hardware")


def derive_study_fields(meta: StudyMetaExport) -> dict[str, Any]:
    """The :data:`DERIVED_FIELDS` of an exported study, from its space file.

    The export also states them. A stated value that disagrees with the space's is refused:
    the file was edited, or its descriptors came from another space (and a cross-study best
    would match the study by them). Tolerated, as what an earlier dse wrote: a field left out
    (it kept fewer), ``model.seq_length`` null (it did not keep it) and any ``space_hash``
    (its recipe changed between versions; the hash is recomputed, never compared).

    Raises:
        StudyFormatError: the space file is not one this dse reads, or a stated field
            disagrees with it (naming the field and both values).
    """

    try:
        space = parse_space_text(meta.space_yaml, "study.space_yaml")
    except SpaceError as e:
        raise StudyFormatError(
            f"{e}\n(an export's space file says what its study is: it must be one this dse reads)"
        ) from None
    derived = space.study_fields()
    wrong: list[str] = []

    def differs(field: str, stated: Any, got: Any) -> None:
        wrong.append(
            printable(f"study.{field}: the export says {stated!r}, its space_yaml gives {got!r}")
        )

    for field in ("direction", "metric"):
        if getattr(meta, field) != derived[field]:
            differs(field, getattr(meta, field), derived[field])
    for part in ("model", "hardware"):
        given: dict[str, Any] = getattr(meta, part)
        for key, stated in given.items():
            if key not in derived[part]:
                wrong.append(
                    printable(
                        f"study.{part}.{_escaped(key)}: not a field its space_yaml gives "
                        f"(known: {', '.join(derived[part])})"
                    )
                )
            elif stated is None and (part, key) == ("model", "seq_length"):
                continue  # an earlier dse did not keep it
            elif not _same(stated, derived[part][key]):
                differs(f"{part}.{key}", stated, derived[part][key])
    if wrong:
        shown = wrong[:20] + ([f"... and {len(wrong) - 20} more"] if len(wrong) > 20 else [])
        raise StudyFormatError(
            "the export's study fields disagree with its space file (the space is what the "
            "study is; remove or correct the stated values):\n  " + "\n  ".join(shown)
        )
    return {k: derived[k] for k in DERIVED_FIELDS}


def check_trials_of_space(export: StudyExport) -> None:
    """Refuse an export whose trials are not configurations of its own space file: a trial
    that sets a knob the space does not have, or a value outside that knob's domain, came
    from another space (the file was edited, or trials were pasted in). Such a study could
    never be resumed (its agent is told every stored trial, and cannot place that one).

    Raises:
        StudyFormatError: names the first trials (by number), the parameter and its value.
    """

    space = parse_space_text(export.study.space_yaml, "study.space_yaml")
    domains = {
        name: {(type(v) is bool, v) for v in spec.values()} for name, spec in space.knobs.items()
    }
    wrong: list[str] = []
    for t in export.trials:
        for name, value in t.params.items():
            where = f"trials[number={t.number}].params.{_escaped(name)}"
            if name not in domains:
                wrong.append(
                    printable(
                        f"{where}: not a knob of its space_yaml (knobs: {', '.join(domains)})"
                    )
                )
            elif not isinstance(value, (int, float, str, bool)) or (
                (type(value) is bool, value) not in domains[name]
            ):
                wrong.append(printable(f"{where}: {value!r} is not a value of that knob's domain"))
        if len(wrong) > 20:
            break
    if wrong:
        shown = wrong[:20] + (["..."] if len(wrong) > 20 else [])
        raise StudyFormatError(
            "the export's trials are not configurations of its space file (trials of another "
            "space: the study could never be resumed):\n  " + "\n  ".join(shown)
        )


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values (1 and 1.0 alike; True and 1 not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def load_study(
    s: Session, export: StudyExport, *, name: str, fields: dict[str, Any]
) -> StudyModel:
    """Insert an exported study under ``name`` (inside the caller's write session), with the
    :data:`DERIVED_FIELDS` of :func:`derive_study_fields`."""
    meta = export.study
    study = StudyModel(
        name=name,
        space_yaml=redact_passwords(meta.space_yaml),
        space_hash=fields["space_hash"],
        state=meta.state,
        direction=fields["direction"],
        metric=fields["metric"],
        model=fields["model"],
        hardware=fields["hardware"],
        created_at=meta.created_at,
        updated_at=meta.updated_at if meta.updated_at is not None else meta.created_at,
    )
    s.add(study)
    s.flush()
    s.add_all(StudyAttrModel(study_id=study.id, key=k, value=v) for k, v in export.attrs.items())
    # one bulk INSERT per table (executemany, trial ids back through RETURNING in the order
    # given): a 10,000-trial export imports in seconds, not a flush per trial
    rows = [
        {
            "study_id": study.id,
            "numerics": numerics_status(t.metrics),  # the column follows the metrics' verdict
            **trial_gpu_figures(t.metrics),  # and the GPU-time columns its figures
            **t.model_dump(exclude={"steps"}),
        }
        for t in export.trials
    ]
    ids = (
        list(
            s.scalars(
                insert(TrialModel).returning(TrialModel.id, sort_by_parameter_order=True), rows
            )
        )
        if rows
        else []
    )
    params = [
        {"trial_id": tid, "name": n, "value_json": v}
        for tid, t in zip(ids, export.trials, strict=True)
        for n, v in param_rows(t.params)
    ]
    steps = [
        {"trial_id": tid, **st.model_dump()}
        for tid, t in zip(ids, export.trials, strict=True)
        for st in t.steps
    ]
    rejections = [{"study_id": study.id, **r.model_dump()} for r in export.rejections]
    for model, batch in ((TrialParamModel, params), (TrialStepModel, steps),
                         (RejectionModel, rejections)):  # fmt: skip
        if batch:
            s.execute(insert(model), batch)
    s.flush()
    return study
