"""Hostile study exports: ``dse import`` refuses them with exit 2 and a message naming the field
(never a traceback, never a raw pydantic dump), and nothing is written."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from dse.cli.main import main
from dse.core.exceptions import StudyFormatError
from dse.core.records import Outcome, StepMetrics
from dse.space.searchspace import parse_space_text
from dse.storage import open_storage, read_export_text
from dse.storage._study_file import parse_export
from tests.conftest import EXAMPLES

#: A real space file (the CPU demo's, as study "src").
SPACE = (EXAMPLES / "tiny_gpt_cpu.yaml").read_text().replace("study: tiny-gpt-cpu", "study: src")


def _export(tmp_path: Path, space: str = SPACE) -> dict[str, Any]:
    """A real export: a study with a complete trial (one NaN loss) and a queued one."""
    url = f"sqlite:///{tmp_path / 'src.db'}"
    with open_storage(url) as st:
        s = st.create_study(
            space_yaml=space, **parse_space_text(space, "space.yaml").study_fields()
        )
        for tp in (1, 2):
            p = {"tensor_model_parallel_size": tp}
            t = st.claim_trial(study_id=s.id, params=p, params_key=json.dumps(p), budget=10)
            assert t is not None
            if tp == 1:
                steps = (StepMetrics(0, 1.0, 100.0, 1.0, 1.0, float("nan"), None),)
                st.finish_trial(
                    t.id, Outcome("ok", {"tflops_per_gpu": 100.0}, steps=steps), value=100.0
                )
        data = st.export_study("src")
    return json.loads(json.dumps(data))


def _import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, *extra: str
) -> tuple[int, str]:
    p = tmp_path / "study.json"
    p.write_bytes(
        doc
        if isinstance(doc, bytes)
        else (doc if isinstance(doc, str) else json.dumps(doc)).encode()
    )
    db = tmp_path / "dst.db"
    rc = main(["import", str(p), "--storage", f"sqlite:///{db}", *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any) -> str:
    rc, err = _import(tmp_path, capsys, doc)
    assert rc == 2, err
    assert str(tmp_path / "study.json") in err
    with open_storage(f"sqlite:///{tmp_path / 'dst.db'}") as st:
        assert st.list_studies() == []  # nothing written
    return err


def test_a_real_export_imports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _import(tmp_path, capsys, _export(tmp_path))
    assert rc == 0, err
    with open_storage(f"sqlite:///{tmp_path / 'dst.db'}") as st:
        (t0, _t1) = st.list_trials(st.get_study("src").id, with_steps=True)
        assert t0.value == 100.0 and math.isnan(t0.steps[0].loss or 0.0)  # NaN loss kept


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("number", 2**63, "the integer 9223372036854775808 is out of the 64-bit range"),
        ("number", 2**62, "Input should be less than or equal to 2147483647"),
        ("attempts", 2**31, "Input should be less than or equal to 2147483647"),
    ],
)
def test_large_ints_in_columns_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: int, message: str
) -> None:
    doc = _export(tmp_path)
    doc["trials"][0][field] = value
    assert f"trials[0].{field}: {message}" in _refused(tmp_path, capsys, doc)


def test_large_ints_anywhere_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _export(tmp_path)
    doc["trials"][0]["params"]["tensor_model_parallel_size"] = 2**63
    err = _refused(tmp_path, capsys, doc)
    assert "trials[0].params.tensor_model_parallel_size: the integer" in err
    assert "out of the 64-bit range" in err
    doc["trials"][0]["params"]["tensor_model_parallel_size"] = 1
    text = json.dumps(doc).replace('"tensor_model_parallel_size": 1', '"x": ' + "9" * 5000, 1)
    assert "an integer of 5000 digits is out of range" in _refused(tmp_path, capsys, text)


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deep_json_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int) -> None:
    doc = json.dumps(_export(tmp_path))
    doc = doc.replace('"attrs": {}', '"attrs": {"x": ' + "[" * depth + "]" * depth + "}")
    assert "nested deeper than 32 levels" in _refused(tmp_path, capsys, doc)


def test_schema_errors_exit_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _export(tmp_path)
    doc["trials"][1]["state"] = 7
    doc["study"]["direction"] = "sideways"
    doc["rejections"] = [{"params": {}}]
    err = _refused(tmp_path, capsys, doc)
    assert "invalid dse study export" in err
    assert "trials[1].state: Input should be a valid string" in err
    assert "study.direction: Input should be 'minimize' or 'maximize'" in err
    assert "rejections[0].kind: Field required" in err
    assert "pydantic" not in err and "For further information" not in err


def test_name_clash_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _export(tmp_path)
    assert _import(tmp_path, capsys, doc)[0] == 0
    rc, err = _import(tmp_path, capsys, doc)
    assert rc == 2
    assert "a study named 'src' already exists" in err and "--study NAME" in err
    assert _import(tmp_path, capsys, doc, "--study", "src-2")[0] == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "value",
            1e308,
            "trials[0].value: Input should be less than or equal to 1000000000000000",
        ),
        ("value", -1e300, "trials[0].value: Input should be greater than or equal to"),
        ("value", float("inf"), "trials[0].value: Input should be a finite number"),
        ("value", float("nan"), "trials[0].value: Input should be a finite number"),
        ("started_at", float("inf"), "trials[0].started_at: Input should be a finite number"),
    ],
)
def test_absurd_values_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: float, message: str
) -> None:
    doc = _export(tmp_path)
    doc["trials"][0][field] = value
    assert message in _refused(tmp_path, capsys, doc)


def test_not_utf8_or_not_json_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "not UTF-8 text" in _refused(tmp_path, capsys, b'{"format": "\xff"}')
    assert "not JSON" in _refused(tmp_path, capsys, "{")


def test_control_characters_not_echoed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _export(tmp_path)
    doc["format"] = "\x1b[2J\x00"
    doc2 = json.loads(json.dumps(doc))
    doc2["format"] = "dse-study"
    doc2["trials"][0]["state"] = "\x1b[31mzombie"
    for d in (doc, doc2):
        err = _refused(tmp_path, capsys, d)
        assert "\x1b" not in err and "\x00" not in err


@pytest.mark.parametrize(
    ("where", "escape", "message"),
    [
        ('"reason": null', '"reason": "a\\u0000b"', "trials[0].reason: a string with a NUL"),
        ('"reason": null', '"reason": "\\ud800"', "trials[0].reason: a string with a lone"),
        ('"host": null', '"host": "\\udfff x"', "trials[0].host: a string with a lone"),
        ('"metrics": {', '"metrics": {"a\\u0000": 1, ', "trials[0].metrics: a key with a NUL"),
        ('"attrs": {}', '"attrs": {"\\ud83d": 1}', "attrs: a key with a lone surrogate"),
    ],
    ids=["nul", "surrogate", "surrogate-host", "nul-key", "surrogate-key"],
)
def test_strings_that_cannot_be_stored_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, escape: str, message: str
) -> None:
    """A NUL (PostgreSQL refuses it in text) or a lone surrogate escape (no UTF-8 encoder
    takes it: the import ended in a UnicodeEncodeError traceback) is refused naming where."""
    text = json.dumps(_export(tmp_path))
    assert where in text
    assert message in _refused(tmp_path, capsys, text.replace(where, escape, 1))


def test_duplicate_numbers_found_in_linear_time() -> None:
    trial = {"state": "queued", "params": {}, "params_key": "{}"}
    doc = {
        "format": "dse-study",
        "format_version": 1,
        "study": {
            "name": "s",
            "space_yaml": "",
            "space_hash": "h",
            "state": "created",
            "direction": "maximize",
            "metric": "m",
            "created_at": 0.0,
        },
        "trials": [{**trial, "number": i} for i in range(20_000)] + [{**trial, "number": 7}],
    }
    with pytest.raises(StudyFormatError, match=r"trial numbers must be unique, repeated: \[7\]"):
        parse_export(doc)
    with pytest.raises(StudyFormatError, match="not JSON"):
        read_export_text("[1, 2")


def test_hostile_stored_space_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An export's space file is parsed again by resume, best and the API: an alias chain or
    a duplicate key there is refused at import, like in a space file."""
    doc = _export(tmp_path)
    chain = ["a0: &a0 [" + ", ".join(["x"] * 9) + "]"]
    chain += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    doc["study"]["space_yaml"] = SPACE + "\n".join(chain) + "\n"
    err = _refused(tmp_path, capsys, doc)
    assert "study.space_yaml: not a readable space file at line" in err
    assert "expands to more than 50000 nodes" in err
    doc["study"]["space_yaml"] = SPACE + "study: other\n"
    assert "duplicate key 'study'" in _refused(tmp_path, capsys, doc)


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda t: t.replace('"format": "dse-study"', '"format": "x", "format": "dse-study"', 1),
         "(top level): the key 'format'"),
        (lambda t: t.replace('"state": "complete"', '"value": 1e6, "state": "complete"', 1),
         "trials[0]: the key 'value'"),
        (lambda t: t.replace('"metric": "tflops_per_gpu"',
                             '"metric": "tflops_per_gpu", "metric": "step_time_s"', 1),
         "study: the key 'metric'"),
    ],
    ids=["top", "trial", "study"],
)  # fmt: skip
def test_duplicate_keys_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, where: str
) -> None:
    """A JSON object with a key twice (Python's json keeps the last silently: an edited value
    would win unseen) is refused, naming the key, where it is and its line."""
    text = json.dumps(_export(tmp_path), indent=1)
    changed = edit(text)
    assert changed != text
    err = _refused(tmp_path, capsys, changed)
    assert where in err and "more than once" in err
    assert "line " in err


def test_duplicate_key_path_inside_arrays_and_escaped_keys() -> None:
    text = '{"a": [1, {"k": [{}]}, {"x\\"y": 1, "z": {"x\\"y": 0}, "x\\"y": 2}]}'
    with pytest.raises(StudyFormatError) as e:
        read_export_text(text)
    assert str(e.value).startswith(
        "a[2]: the key 'x\"y' is given more than once (again at line 1)"
    )
    with pytest.raises(StudyFormatError, match="not a dse study export"):
        read_export_text('{"a": {"b": 1}, "c": {"b": 2}}')  # the same key in two objects


# --- the space file is the source of truth of what a study is ------------------------------

#: A MoE variant of SPACE (what a file claiming "dense" would hide).
MOE_SPACE = SPACE.replace(
    "  vocab_size: 1024\n", "  vocab_size: 1024\n  num_moe_experts: 4\n  moe_ffn_hidden_size: 64\n"
)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda st: st["model"].update(num_layers=8), "study.model.num_layers"),
        (lambda st: st["model"].update(num_moe_experts=None), "study.model.num_moe_experts"),
        (lambda st: st["model"].update(experts=4), "study.model.experts"),
        (lambda st: st["hardware"].update(gpu="NVIDIA H200"), "study.hardware.gpu"),
        (lambda st: st["hardware"].update(world_size=64), "study.hardware.world_size"),
        (lambda st: st.update(metric="step_time_s"), "study.metric"),
        (lambda st: st.update(direction="minimize"), "study.direction"),
    ],
    ids=["layers", "moe-hidden", "unknown", "gpu", "world", "metric", "direction"],
)
def test_stated_fields_that_disagree_with_the_space_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, field: str
) -> None:
    """An export says what its study is twice: in its space file and in the descriptors the
    cross-study best matches by. A file whose descriptors disagree with its space is refused
    (exit 2, naming the field): the values were edited, or came from another space."""
    doc = _export(tmp_path, MOE_SPACE)
    edit(doc["study"])
    err = _refused(tmp_path, capsys, doc)
    assert f"{field}: " in err and "space_yaml" in err


def test_descriptors_are_derived_from_the_space(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What is stored comes from the space file, not the file's descriptors: an export that
    leaves them out (or comes from a dse that kept fewer fields, or no sequence length) is
    stored with the derived ones; a space_hash of another recipe is replaced (and said)."""
    doc = _export(tmp_path, MOE_SPACE)
    derived = parse_space_text(MOE_SPACE, "s").study_fields()
    doc["study"]["model"] = {"num_layers": 4, "seq_length": None}  # fewer fields, no seq
    doc["study"]["hardware"] = {}
    doc["study"]["space_hash"] = "0" * 64
    rc, err = _import(tmp_path, capsys, doc)
    assert rc == 0, err
    assert "space_hash" in err and "recomputed" in err
    with open_storage(f"sqlite:///{tmp_path / 'dst.db'}") as st:
        rec = st.get_study("src")
    assert rec.model == derived["model"] and rec.model["num_moe_experts"] == 4
    assert rec.model["seq_length"] == 64
    assert rec.hardware == derived["hardware"]
    assert rec.space_hash == derived["space_hash"]
    assert (rec.metric, rec.direction) == (derived["metric"], derived["direction"])


def test_a_space_this_dse_cannot_read_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _export(tmp_path)
    doc["study"]["space_yaml"] = SPACE.replace("num_layers: 4", "num_layerz: 4")
    err = _refused(tmp_path, capsys, doc)
    assert "study.space_yaml" in err and "model.num_layerz" in err
