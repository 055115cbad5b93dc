"""Figures are shown with four significant digits, by one rule (dse.core.figures.figure)."""

from __future__ import annotations

import math

import pytest

from dse.core.figures import figure

#: (value, shown). The dashboard's fmt() is checked on the same cases in the browser tests.
CASES: list[tuple[float | int | None, str]] = [
    (350.0, "350.0"),
    (123.456789, "123.5"),
    (0.5, "0.5000"),
    (2 / 3, "0.6667"),
    (80.0, "80.00"),
    (1000.0, "1000"),
    (9999.4, "9999"),
    (9999.7, "10000"),
    (12345.6, "12350"),
    (123456789.0, "123500000"),
    (0.001, "0.001000"),
    (0.0001234, "0.0001234"),
    (0.00001234, "1.234e-5"),
    (1e-9, "1.000e-9"),
    (12.125, "12.13"),  # an exact binary half: away from zero
    (-12.125, "-12.13"),
    (-0.04567, "-0.04567"),
    (140.99999, "141.0"),
    (400, "400.0"),  # JSON cannot tell 400 from 400.0: neither can the rule
    (0, "0"),
    (0.0, "0"),
    (None, ""),
]


@pytest.mark.parametrize(("x", "shown"), CASES)
def test_four_significant_digits(x: float | int | None, shown: str) -> None:
    assert figure(x) == shown


def test_non_finite_and_non_numbers() -> None:
    assert figure(math.nan) == "NaN"
    assert figure(math.inf) == "inf"
    assert figure(-math.inf) == "-inf"
    assert figure("oom") == "oom"
    assert figure(True) == "True"
