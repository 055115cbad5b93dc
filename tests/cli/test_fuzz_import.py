"""Fuzz: hostile study exports (mutated fields, huge or deep JSON, bytes that are not UTF-8)
are imported, or refused with a StudyFormatError naming the field (``dse import``: exit 2);
never a traceback, and what is accepted is stored without a database error."""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dse.cli.main import main
from dse.core.exceptions import StudyFormatError
from dse.core.records import Outcome, StepMetrics
from dse.space.searchspace import parse_space_text
from dse.storage import Storage, open_storage, read_export_text
from tests.conftest import EXAMPLES
from tests.hostile import assert_clean_message, mutated_doc

#: A real space file (an import derives the study's fields from it), as study "src".
SPACE = (EXAMPLES / "tiny_gpt_cpu.yaml").read_text().replace("study: tiny-gpt-cpu", "study: src")

_EXTRA = ["value", "number", "steps", "history", "metrics", "surprise", "attempts"]


def _real_export(url: str) -> dict[str, Any]:
    with open_storage(url) as st_:
        s = st_.create_study(space_yaml=SPACE, **parse_space_text(SPACE, "s").study_fields())
        st_.set_study_attr(s.id, "costmodel", {"scale": 1.0})
        for tp in (1, 2, 4):
            p = {"tensor_model_parallel_size": tp}
            t = st_.claim_trial(study_id=s.id, params=p, params_key=json.dumps(p), budget=10)
            assert t is not None
            if tp < 4:
                steps = tuple(StepMetrics(i, 1.0, 100.0, 1.0, 1.0, 2.0 - i) for i in range(2))
                out = Outcome("ok", {"tflops_per_gpu": 100.0 * tp}, steps=steps)
                st_.finish_trial(t.id, out, value=100.0 * tp)
        st_.add_rejection(
            study_id=s.id,
            params={"tensor_model_parallel_size": 3},
            params_key="k",
            kind="invalid",
            rule="r",
            reason="why",
            values={"heads": 4},
        )
        return json.loads(json.dumps(st_.export_study("src")))


@pytest.fixture(scope="module")
def where() -> Iterator[tuple[dict[str, Any], Storage]]:
    with tempfile.TemporaryDirectory(prefix="dse-fuzz-import-") as d:
        doc = _real_export(f"sqlite:///{Path(d) / 'src.db'}")
        with open_storage(f"sqlite:///{Path(d) / 'dst.db'}") as storage:
            yield doc, storage


_JSON_EDITS = st.sampled_from(
    [
        lambda t: t,
        lambda t: t.replace('"attempts": 0', '"attempts": ' + "9" * 30, 1),
        lambda t: t.replace('"attrs": {', '"attrs": {"deep": ' + "[" * 3000 + "]" * 3000 + ",", 1),
        lambda t: t.replace('"number": 1', '"number": 1e400', 1),
        lambda t: t.replace('"value": 100.0', '"value": Infinity', 1),
        lambda t: t[: len(t) // 2],
        lambda t: t.replace('"src"', '"\\u001b[2J\\u0000"', 1),
    ]
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_read_and_import_fuzz(where: tuple[dict[str, Any], Storage], data: st.DataObject) -> None:
    base, storage = where
    doc = data.draw(mutated_doc(base, _EXTRA))
    text = data.draw(_JSON_EDITS)(json.dumps(doc))
    try:
        export = read_export_text(text.encode())
    except StudyFormatError as e:
        assert_clean_message(str(e), "")  # names a field or says what is wrong
        return
    try:  # no database error
        storage.import_study(export, name=f"n-{uuid.uuid4().hex[:8]}")
    except StudyFormatError as e:  # a mutated space file or study field
        assert_clean_message(str(e), "")


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_cli_import_fuzz(
    where: tuple[dict[str, Any], Storage],
    data: st.DataObject,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, _ = where
    doc = data.draw(mutated_doc(base, _EXTRA))
    raw = data.draw(_JSON_EDITS)(json.dumps(doc)).encode()
    if data.draw(st.booleans()):
        raw += data.draw(st.binary(min_size=1, max_size=4))
    p = tmp_path / "fuzz.json"
    p.write_bytes(raw)
    db = tmp_path / f"{uuid.uuid4().hex[:8]}.db"
    rc = main(["import", str(p), "--storage", f"sqlite:///{db}"])
    err = capsys.readouterr().err
    assert rc in (0, 2), err
    if rc == 2:
        assert_clean_message(err, str(p))
