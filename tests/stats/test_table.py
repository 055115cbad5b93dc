"""The measured-table reader shared by the replay workload and the cost model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dse.core.bounds import MAX_TABLE_BYTES
from dse.core.exceptions import WorkloadError
from dse.space.searchspace import ModelSpec
from dse.space.tablemodel import space_model_fields
from dse.stats.table import TableError, read_table


def test_reads_rows_with_their_lines(tmp_path: Path) -> None:
    t = tmp_path / "t.jsonl"
    rows = [
        {"params": {"micro_batch_size": 1}, "status": "ok", "metrics": {"loss": 2.0}},
        {"params": {"micro_batch_size": 2}, "status": "oom", "metrics": {"peak_mem_gib": 80},
         "world_size": 2, "hardware": {"gpu_memory_gib": 79.6}},
    ]  # fmt: skip
    t.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    got = read_table(t)
    assert [r.line for r in got] == [1, 3]
    assert got[0].losses == [2.0] and got[0].world_size == 1 and got[0].model == {}
    assert got[1].status == "oom" and got[1].world_size == 2
    assert got[1].hardware == {"gpu_memory_gib": 79.6}


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"params": {"a": 1}, "status": "ok", "world_size": 0}', r":1: 'world_size' must be"),
        ('{"params": {"a": 1}, "status": "ok", "world_size": true}', r":1: 'world_size' must be"),
        ('{"params": {"a": 1}, "status": "oom", "metrics": {"peak_mem_gib": "x"}}', "a number"),
        ('{"params": {"a": 1}, "status": "ok", "model": [1]}', "must be objects"),
        ('{"params": {"a": 1}, "status": "ok", "metrics": 3}', "'metrics' must be an object"),
    ],
)
def test_bad_rows_name_the_line(tmp_path: Path, line: str, match: str) -> None:
    t = tmp_path / "t.jsonl"
    t.write_text(line + "\n")
    with pytest.raises(TableError, match=match) as info:
        read_table(t)
    # the replay workload and the cost model both catch it as their own error type
    assert isinstance(info.value, WorkloadError) and isinstance(info.value, ValueError)


def test_space_model_fields_activation() -> None:
    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "ffn_hidden_size": 128, "vocab_size": 100, "seq_length": 32,
            "global_batch_size": 8, "precision": "bf16"}  # fmt: skip
    assert (
        space_model_fields({**base, "activation": "swiglu", "gated_linear_unit": True})[
            "activation"
        ]
        == "swiglu"
    )
    assert (
        space_model_fields({**base, "activation": "silu", "gated_linear_unit": True})["activation"]
        == "swiglu"
    )
    assert (
        space_model_fields({**base, "activation": "swiglu", "gated_linear_unit": False})[
            "activation"
        ]
        == "silu"
    )
    assert space_model_fields({**base, "activation": "gelu"})["activation"] == "gelu"
    fields = space_model_fields(base)
    assert "activation" not in fields and "global_batch_size" not in fields
    ModelSpec.model_validate(fields)  # the space's model section accepts it as is


def test_shared_table_reads(shared_table: Path) -> None:
    rows = read_table(shared_table)
    assert len(rows) == 48
    assert {r.status for r in rows} <= {"ok", "oom", "invalid", "error"}
    m = ModelSpec.model_validate(space_model_fields(rows[0].model))
    assert m.gated_linear_unit and m.num_layers == 16


def test_space_model_fields_keep_dropout() -> None:
    """A table measured with dropout on is estimated with its dropout masks."""
    got = space_model_fields({"num_layers": 2, "hidden_dropout": 0.1, "attention_dropout": 0.1})
    assert got["hidden_dropout"] == 0.1 and got["attention_dropout"] == 0.1


def _special(kind: str, tmp_path: Path) -> tuple[Path, str]:
    """A path that is no regular file, and the kind the refusal names."""
    if kind == "fifo":  # its reader would wait for a writer forever
        os.mkfifo(tmp_path / "t.jsonl")
        return tmp_path / "t.jsonl", "FIFO"
    if kind == "folder":
        return tmp_path, "folder"
    return Path(kind), "character device"  # /dev/zero is endless, /dev/null empty


@pytest.mark.parametrize("kind", ["/dev/zero", "/dev/null", "fifo", "folder"])
def test_a_table_that_is_no_regular_file_is_refused_unread(tmp_path: Path, kind: str) -> None:
    path, named = _special(kind, tmp_path)
    with pytest.raises(TableError) as info:
        read_table(path)
    assert str(info.value) == (
        f"replay table {path}: not a regular file (a {named}); a table is a JSON-lines file"
    )


def test_a_table_past_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:  # sparse: no disk used
        f.truncate(MAX_TABLE_BYTES + 1)
    with pytest.raises(TableError, match=rf"big.jsonl: {MAX_TABLE_BYTES + 1} bytes, more than"):
        read_table(big)
