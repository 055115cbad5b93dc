"""Constraint expressions of a space file: a small, bounded subset of Python.

A constraint is a Python-like boolean expression over knob names, ``world_size`` and ``dp``
(``micro_batch_size * tensor_model_parallel_size <= 8``). It is parsed once with
:func:`ast.parse` and checked against a whitelist of syntax; it is then *interpreted* here
node by node, never compiled nor given to ``eval``, so that each operation can be bounded:

- the text is at most :data:`~dse.core.bounds.MAX_CONSTRAINT_CHARS` characters and
  :data:`~dse.core.bounds.MAX_CONSTRAINT_NODES` syntax nodes (this bounds the work per evaluation);
- arithmetic takes numbers only (no string or list repetition), integers of at most
  :data:`~dse.core.bounds.MAX_INT_BITS` bits, and ``**`` an exponent of at most
  :data:`~dse.core.bounds.MAX_EXPONENT` whose result stays within that size;
- every failure (a division by zero, a type mismatch, an overflow) is a
  :class:`ConstraintError` whose message names the problem; callers add which constraint.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any

from dse.core.bounds import (
    MAX_CONSTRAINT_CHARS,
    MAX_CONSTRAINT_NODES,
    MAX_EXPONENT,
    MAX_INT_BITS,
)

__all__ = [
    "ConstraintError",
    "parse_expr",
    "check_expr",
    "eval_expr",
    "node_count",
    "evaluated_nodes",
    "EXTRA_NAMES",
]

#: Names a constraint may use besides the knobs.
EXTRA_NAMES = frozenset({"world_size", "dp"})


class ConstraintError(ValueError):
    """A constraint that cannot be parsed, or cannot be evaluated on a configuration."""


_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_SYNTAX = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.BinOp,
    ast.Compare,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Tuple,
    ast.List,
    ast.IfExp,
    *_BINOPS,
    *_CMPOPS,
)
_OP_TEXT = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}


@functools.lru_cache(maxsize=512)
def parse_expr(expr: str) -> ast.Expression:
    """Parse and check the syntax of a constraint (not its names).

    Raises:
        ConstraintError: too long, not an expression, or a construct outside the subset.
    """
    if not isinstance(expr, str):
        raise ConstraintError(f"a constraint must be a string, got {type(expr).__name__}")
    if len(expr) > MAX_CONSTRAINT_CHARS:
        raise ConstraintError(
            f"a constraint has at most {MAX_CONSTRAINT_CHARS} characters, this has {len(expr)}"
        )
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ConstraintError(f"not an expression ({e.msg})") from None
    except (RecursionError, MemoryError, ValueError) as e:  # ValueError: NUL bytes
        raise ConstraintError(f"not an expression ({type(e).__name__})") from None
    n = 0
    for node in ast.walk(tree):
        n += 1
        if n > MAX_CONSTRAINT_NODES:
            raise ConstraintError(
                f"a constraint has at most {MAX_CONSTRAINT_NODES} terms and operators"
            )
        if not isinstance(node, _SYNTAX):
            raise ConstraintError(f"{type(node).__name__} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(
            node.value, (bool, int, float, str, type(None))
        ):
            raise ConstraintError(f"the constant {node.value!r} is not allowed")
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            _check_int(node.value)
    return tree


@functools.lru_cache(maxsize=512)
def node_count(expr: str) -> int:
    """Syntax nodes of a constraint (at most :data:`~dse.core.bounds.MAX_CONSTRAINT_NODES`): an
    evaluation visits at most this many."""
    return sum(1 for _ in ast.walk(parse_expr(expr)))


#: Syntax nodes of the constraints evaluated in this process so far (:func:`evaluated_nodes`).
_EVALUATED = [0]


def evaluated_nodes() -> int:
    """Syntax nodes of the constraints evaluated in this process so far, each evaluation
    counted at every node of its expression: the work a caller that checks many
    configurations bounds (the agents' searches for a valid configuration)."""
    return _EVALUATED[0]


def check_expr(expr: str, names: set[str] | frozenset[str]) -> ast.Expression:
    """:func:`parse_expr`, and every name must be a knob (or ``world_size``, ``dp``)."""
    tree = parse_expr(expr)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in names and node.id not in EXTRA_NAMES:
            raise ConstraintError(f"{node.id!r} is not a knob (nor world_size, dp)")
    return tree


def eval_expr(expr: str | ast.Expression, env: Mapping[str, Any]) -> Any:
    """The value of a constraint with names bound by ``env``.

    Raises:
        ConstraintError: the expression is malformed, or an operation fails or exceeds the
            bounds (the message says which operation and why).
    """
    if isinstance(expr, str):
        tree = parse_expr(expr)
        _EVALUATED[0] += node_count(expr)
    else:
        tree = expr
        _EVALUATED[0] += sum(1 for _ in ast.walk(tree))
    try:
        return _eval(tree.body, env)
    except ConstraintError:
        raise
    except ZeroDivisionError:
        raise ConstraintError("division by zero") from None
    except (ArithmeticError, TypeError, ValueError, MemoryError, RecursionError) as e:
        raise ConstraintError(f"{type(e).__name__}: {e}") from None


def _check_int(v: Any) -> None:
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
        raise ConstraintError(f"an integer exceeds {MAX_INT_BITS} bits")


def _number(v: Any, op: str) -> Any:
    if isinstance(v, (int, float)):  # bool is an int
        return v
    raise ConstraintError(f"{op!r} needs numbers, got {type(v).__name__} {v!r}")


def _pow(a: Any, b: Any) -> Any:
    if isinstance(b, float) or isinstance(a, float):
        if abs(b) > MAX_EXPONENT:
            raise ConstraintError(f"the exponent of '**' is at most {MAX_EXPONENT}, got {b!r}")
        r = a**b
        if isinstance(r, complex):
            raise ConstraintError(f"'**' of a negative number to a fractional power ({a}, {b})")
        return r
    # (bits - 1) * exponent bounds the result's size from below: refuse before computing
    if abs(b) > MAX_EXPONENT or (abs(a) > 1 and (a.bit_length() - 1) * abs(b) > MAX_INT_BITS):
        raise ConstraintError(
            f"'**' result too large (base of {a.bit_length()} bits, exponent {b}; "
            f"at most {MAX_INT_BITS} bits)"
        )
    return a**b


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ConstraintError(f"{node.id!r} has no value in this configuration")
        return env[node.id]
    if isinstance(node, ast.BoolOp):
        out: Any = None
        for v in node.values:
            out = _eval(v, env)
            if isinstance(node.op, ast.And) and not out:
                return out
            if isinstance(node.op, ast.Or) and out:
                return out
        return out
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not v
        v = _number(v, "-" if isinstance(node.op, ast.USub) else "+")
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp):
        sym = _OP_TEXT[type(node.op)]
        a = _number(_eval(node.left, env), sym)
        b = _number(_eval(node.right, env), sym)
        _check_int(a)
        _check_int(b)
        r = _pow(a, b) if isinstance(node.op, ast.Pow) else _BINOPS[type(node.op)](a, b)
        _check_int(r)
        return r
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, env)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_eval(e, env) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    raise ConstraintError(f"{type(node).__name__} is not allowed")
