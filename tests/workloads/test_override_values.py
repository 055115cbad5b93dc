"""The value syntax of the recipe launchers on its own: a value dse renders as a Hydra
override (Megatron-Bridge, dse/workloads/launchers/bridge.py) reads back as the same value the
way Hydra/YAML reads it (``resolved_expectations``), and a NeMo-Run override value
(dse/workloads/launchers/nemo.py) is the Python literal of the value."""

from __future__ import annotations

import ast
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from dse.workloads.launchers.bridge import hydra_value, resolved_expectations
from dse.workloads.launchers.nemo import python_value

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
)
#: Words as knob values are (backends, dispatchers, dtypes): no YAML keyword or number.
WORDS = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True).filter(
    lambda s: s not in ("true", "false", "null", "yes", "no", "on", "off", "y", "n", "nan", "inf")
)


def _read_back(value: Any) -> Any:
    return resolved_expectations([f"model.field={hydra_value(value)}"])["model.field"]


@given(SCALARS | WORDS | st.lists(SCALARS | WORDS, max_size=4))
@example(1e-05)  # Python prints it without a dot: a float to Hydra, a string to YAML 1.1
@example(-2.5e20)
@example([1e-07, 3])
def test_hydra_values_read_back_as_given(value: Any) -> None:
    assert _read_back(value) == value


def test_exponent_floats_read_back_as_floats() -> None:
    """``optimizer.min_lr=1e-05`` sets a float in the ConfigContainer; the expectation the
    resolved check compares with must be that float, not the string '1e-05'."""
    got = resolved_expectations(["optimizer.min_lr=1e-05", "optimizer.lr=3E-4", "a.b=1e5x"])
    assert got == {"optimizer.min_lr": 1e-05, "optimizer.lr": 3e-4, "a.b": "1e5x"}
    assert type(got["optimizer.min_lr"]) is float


def test_hydra_spelling() -> None:
    assert [hydra_value(v) for v in (None, True, False, 4, 0.5, "te", [1, 2], [True, None])] == [
        "null", "true", "false", "4", "0.5", "te", "[1,2]", "[true,null]",
    ]  # fmt: skip


def test_resolved_expectations_keeps_only_dotted_overrides() -> None:
    argv = ["torchrun", "--nproc-per-node=2", "run_recipe.py", "--recipe", "llama3_8b",
            "model.tensor_model_parallel_size=2", "+train.extra=true", "~model.drop=1",
            "plain=3", "model.bad key=1", "optimizer.lr=", "dataset.seq_length=4096"]  # fmt: skip
    assert resolved_expectations(argv) == {
        "model.tensor_model_parallel_size": 2, "train.extra": True, "optimizer.lr": None,
        "dataset.seq_length": 4096,
    }  # fmt: skip


@given(SCALARS | st.lists(SCALARS, max_size=4) | st.tuples(SCALARS, SCALARS))
def test_nemo_values_are_python_literals(value: Any) -> None:
    assert ast.literal_eval(python_value(value)) == value


def test_nemo_strings_pass_as_written() -> None:
    """NeMo-Run's CLI takes a bare word as a string (and a quoted one would keep the quotes)."""
    assert python_value("alltoall") == "alltoall"
    assert python_value(True) == "True" and python_value(None) == "None"
