"""How a measured or estimated figure is shown: four significant digits, one rule.

:func:`figure` is the only formatter of figures (TFLOP/s, memory, step time, GPU-hours,
objective values) in the CLI's text output; the dashboard's ``fmt`` in
``dse/api/static/dashboard.js`` follows the same rule (a test checks both on the same numbers).
Counts, trial numbers and knob values are exact and are not passed through it.

The rule: missing is ``""``; NaN is ``NaN``; infinities ``inf`` / ``-inf``; zero ``0``;
otherwise the value rounded to four significant digits (halves away from zero, on the exact
binary value, as JavaScript's ``toPrecision`` does), trailing zeros kept (``0.5000``,
``350.0``): positional from 1e-4 up to 9999.5, whole numbers above (``12350``), and
``d.ddde-N`` below 1e-4.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

__all__ = ["figure", "SIGNIFICANT_DIGITS"]

SIGNIFICANT_DIGITS = 4


def figure(x: object) -> str:
    """``x`` with four significant digits (see the module docstring); ``""`` for None."""
    if x is None:
        return ""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    f = float(x)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if f == 0:
        return "0"
    sign = "-" if f < 0 else ""
    d = Decimal(abs(f))  # the exact binary value
    exp = d.adjusted()  # position of the leading digit
    q = d.quantize(Decimal(1).scaleb(exp - SIGNIFICANT_DIGITS + 1), rounding=ROUND_HALF_UP)
    exp = q.adjusted()  # 9999.7 rounds up to 1.000e4
    if exp < -4:
        digits = q.scaleb(-exp).quantize(Decimal("1.000"))
        return f"{sign}{digits}e{exp}"
    if exp >= SIGNIFICANT_DIGITS:
        return f"{sign}{int(q)}"
    places = max(0, SIGNIFICANT_DIGITS - 1 - exp)
    return f"{sign}{q:.{places}f}"
