from __future__ import annotations

import pytest

from dse.core.exceptions import UnknownKnobError
from dse.space.knobs import KNOBS, assignments, get_knob


def test_every_knob_has_fields_and_description() -> None:
    for k in KNOBS.values():
        assert k.description
        sample = k.choices[0] if k.kind == "choice" else (True if k.kind == "bool" else 2)
        assert k.fields(sample), k.name


def test_unknown_knob_suggests() -> None:
    with pytest.raises(UnknownKnobError, match="did you mean 'micro_batch_size'"):
        get_knob("micro_batch_sise")


def test_recompute_fields() -> None:
    full = {(a.field, a.value) for a in assignments({"recompute": "full"})}
    assert full == {
        ("recompute_granularity", "full"),
        ("recompute_method", "uniform"),
        ("recompute_num_layers", 1),
    }
