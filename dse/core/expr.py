"""Constraint expressions of a space file: a small, bounded subset of Python.

A constraint is a Python-like boolean expression over knob names, ``world_size`` and ``dp``
(``micro_batch_size * tensor_model_parallel_size <= 8``). It is parsed once with
:func:`ast.parse` and checked against a whitelist of syntax; it is then turned, once per
expression, into a tree of small Python functions, one per syntax node (never compiled to
bytecode nor given to ``eval``), so that each operation can be bounded:

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
    "joint_values",
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
        fn = _compiled(expr)
        _EVALUATED[0] += node_count(expr)
    else:
        fn = _compile(expr.body)
        _EVALUATED[0] += sum(1 for _ in ast.walk(expr))
    try:
        return fn(env)
    except ConstraintError:
        raise
    except ZeroDivisionError:
        raise ConstraintError("division by zero") from None
    except (ArithmeticError, TypeError, ValueError, MemoryError, RecursionError) as e:
        raise ConstraintError(f"{type(e).__name__}: {e}") from None


#: Values kept per expression by :func:`_compiled` (emptied when full).
MEMO_ENTRIES = 4096


@functools.lru_cache(maxsize=512)
def _compiled(expr: str) -> Callable[[Mapping[str, Any]], Any]:
    """The function of a checked constraint (:func:`_compile` of :func:`parse_expr`), made once
    per expression: a space's check evaluates each constraint on thousands of configurations.

    A constraint is a pure function of the names it reads, and those are usually a few knobs
    of a few values each, so its value is kept per tuple of those names' values (at most
    :data:`MEMO_ENTRIES`; an unhashable value, a list, is not kept)."""
    tree = parse_expr(expr)
    fn = _compile(tree.body)
    names = tuple(sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}))
    memo: dict[tuple[Any, ...], Any] = {}

    def memoized(env: Mapping[str, Any]) -> Any:
        try:
            # the type beside each value: 1, 1.0 and True are equal keys but not equal values
            key = tuple((type(v), v) for v in (env[n] for n in names))
            hash(key)
        except (KeyError, TypeError):  # a missing name says so in fn; a list is not kept
            return fn(env)
        if key in memo:
            return memo[key]
        value = fn(env)
        if type(value) is list:  # a caller may change a list: never hand out a kept one
            return value
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        memo[key] = value
        return value

    return memoized


class JointValues:
    """The values of a list of constraints kept together, per tuple of the values of every
    name any of them reads (at most :data:`MEMO_ENTRIES`): a configuration whose constraint
    inputs were seen already costs one lookup, not one per constraint. A hit counts in
    :func:`evaluated_nodes` as the evaluation of every constraint it stands for."""

    def __init__(self, exprs: tuple[str, ...]) -> None:
        names: set[str] = set()
        for expr in exprs:
            names.update(n.id for n in ast.walk(parse_expr(expr)) if isinstance(n, ast.Name))
        self._names = tuple(sorted(names))
        self._nodes = sum(node_count(e) for e in exprs)
        self._memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def _key(self, env: Mapping[str, Any]) -> tuple[Any, ...] | None:
        try:
            # the type beside each value: 1, 1.0 and True are equal keys but not equal values
            key = tuple((type(v), v) for v in (env[n] for n in self._names))
            hash(key)
        except (KeyError, TypeError):  # a missing name, or a list: not kept
            return None
        return key

    def get(self, env: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The kept values of the constraints on ``env`` (None: not kept)."""
        key = self._key(env)
        got = None if key is None else self._memo.get(key)
        if got is not None:
            _EVALUATED[0] += self._nodes
        return got

    def put(self, env: Mapping[str, Any], values: tuple[Any, ...]) -> None:
        """Keep the constraints' values on ``env`` (immutable values only)."""
        key = self._key(env)
        if key is None or any(type(v) is list for v in values):
            return
        if len(self._memo) >= MEMO_ENTRIES:
            self._memo.clear()
        self._memo[key] = values


@functools.lru_cache(maxsize=64)
def joint_values(exprs: tuple[str, ...]) -> JointValues:
    """The :class:`JointValues` of a space's constraints (one per tuple of checked
    expressions, made once)."""
    return JointValues(exprs)


def _check_int(v: Any) -> None:
    if type(v) is int and v.bit_length() > MAX_INT_BITS:  # bool (an int's subclass) is small
        raise ConstraintError(f"an integer exceeds {MAX_INT_BITS} bits")


_NUMBER_TYPES = (int, float, bool)


def _number(v: Any, op: str) -> Any:
    if type(v) in _NUMBER_TYPES or isinstance(v, (int, float)):  # bool is an int
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


Fn = Callable[[Mapping[str, Any]], Any]


def _bounded(node: ast.AST) -> bool:
    """Whether the value of ``node`` is known to be within the integer bound without a check:
    a constant (checked when parsed), an arithmetic operation (its result is checked), or a
    sign of one of those."""
    if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
        return _bounded(node.operand)
    return isinstance(node, (ast.Constant, ast.BinOp))


def _compile(node: ast.AST) -> Fn:
    """The function computing ``node``'s value from the names of a configuration, with the
    bounds of the module docstring checked at every operation."""
    if isinstance(node, ast.Constant):
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id

        def read(env: Mapping[str, Any]) -> Any:
            try:
                return env[name]
            except KeyError:
                raise ConstraintError(f"{name!r} has no value in this configuration") from None

        return read
    if isinstance(node, ast.BoolOp):
        parts = [_compile(v) for v in node.values]
        if isinstance(node.op, ast.And):

            def all_of(env: Mapping[str, Any]) -> Any:
                out: Any = None
                for f in parts:
                    out = f(env)
                    if not out:
                        return out
                return out

            return all_of

        def any_of(env: Mapping[str, Any]) -> Any:
            out: Any = None
            for f in parts:
                out = f(env)
                if out:
                    return out
            return out

        return any_of
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand)
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        if isinstance(node.op, ast.USub):
            return lambda env: -_number(operand(env), "-")
        return lambda env: +_number(operand(env), "+")
    if isinstance(node, ast.BinOp):
        sym = _OP_TEXT[type(node.op)]
        left, right = _compile(node.left), _compile(node.right)
        fn = _pow if isinstance(node.op, ast.Pow) else _BINOPS[type(node.op)]
        # an operand that is a constant (checked when parsed) or an operation (its result
        # checked below) is within the bounds already: only a name's value is checked here
        check_a, check_b = not _bounded(node.left), not _bounded(node.right)

        def binop(env: Mapping[str, Any]) -> Any:
            a = left(env)
            if type(a) not in _NUMBER_TYPES:
                a = _number(a, sym)
            b = right(env)
            if type(b) not in _NUMBER_TYPES:
                b = _number(b, sym)
            if check_a:
                _check_int(a)
            if check_b:
                _check_int(b)
            r = fn(a, b)
            if type(r) is int and r.bit_length() > MAX_INT_BITS:
                raise ConstraintError(f"an integer exceeds {MAX_INT_BITS} bits")
            return r

        return binop
    if isinstance(node, ast.Compare):
        first = _compile(node.left)
        steps = [
            (_CMPOPS[type(op)], _compile(comp))
            for op, comp in zip(node.ops, node.comparators, strict=True)
        ]

        def compare(env: Mapping[str, Any]) -> bool:
            left = first(env)
            for op, comp in steps:
                right = comp(env)
                if not op(left, right):
                    return False
                left = right
            return True

        return compare
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_compile(e) for e in node.elts]
        if isinstance(node, ast.Tuple):
            return lambda env: tuple(f(env) for f in items)
        return lambda env: [f(env) for f in items]
    if isinstance(node, ast.IfExp):
        test, body, orelse = _compile(node.test), _compile(node.body), _compile(node.orelse)
        return lambda env: body(env) if test(env) else orelse(env)
    raise ConstraintError(f"{type(node).__name__} is not allowed")
