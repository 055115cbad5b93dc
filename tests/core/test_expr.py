"""dse/core/expr.py on its own: the constraint subset, evaluated node by node with bounds, every
failure a ConstraintError naming the problem (the space tests reach it through parse_space)."""

from __future__ import annotations

import ast

import pytest

from dse.core.bounds import MAX_CONSTRAINT_CHARS, MAX_CONSTRAINT_NODES, MAX_EXPONENT, MAX_INT_BITS
from dse.core.expr import EXTRA_NAMES, ConstraintError, check_expr, eval_expr, parse_expr

ENV = {"tensor_model_parallel_size": 2, "micro_batch_size": 4, "dp": 4, "world_size": 8,
       "recompute": "selective", "use_distributed_optimizer": True}  # fmt: skip


@pytest.mark.parametrize(
    "expr,value",
    [
        ("dp * micro_batch_size <= 16", True),
        ("dp * micro_batch_size < 16", False),
        ("world_size // tensor_model_parallel_size == dp", True),
        ("world_size % 3", 2),
        ("world_size / 16", 0.5),
        ("2 ** tensor_model_parallel_size", 4),
        ("-micro_batch_size + +dp", 0),
        ("1 < tensor_model_parallel_size <= 2 < dp", True),  # chained, as Python
        ("1 < tensor_model_parallel_size > 3", False),
        ("recompute in ('selective', 'full')", True),
        ("recompute not in ['none']", True),
        ("use_distributed_optimizer and dp > 1", True),
        ("not use_distributed_optimizer or dp == 1", False),
        ("micro_batch_size if dp > 2 else 0", 4),
        ("micro_batch_size if dp > 8 else 0", 0),
        ("0 or 5", 5),  # or/and return the deciding operand, as Python
        ("3 and 0", 0),
        ("True + True", 2),  # bool is a number
    ],
)
def test_values_are_those_of_python(expr: str, value: object) -> None:
    assert eval_expr(expr, ENV) == value
    assert eval_expr(expr, ENV) == eval(expr, {}, dict(ENV))  # the subset means what Python does


def test_short_circuit_skips_what_it_does_not_need() -> None:
    """``and``/``or``/``if`` evaluate only what decides: a missing name or a division by
    zero on the other side is never reached (a rule guarded by its condition)."""
    assert eval_expr("dp == 1 and missing > 0", ENV) is False
    assert eval_expr("dp > 1 or 1 / 0", ENV) is True
    assert eval_expr("1 / 0 if dp == 1 else 7", ENV) == 7


@pytest.mark.parametrize(
    "expr,message",
    [
        ("__import__('os')", "Call is not allowed"),
        ("dp.real", "Attribute is not allowed"),
        ("[x for x in (1, 2)]", "ListComp is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("(dp := 3)", "NamedExpr is not allowed"),
        ("{1: 2}", "Dict is not allowed"),
        ("dp[0]", "Subscript is not allowed"),
        ("dp << 2", "LShift is not allowed"),
        ("b'x' == dp", "the constant b'x' is not allowed"),
        ("dp >", "not an expression"),
        ("dp = 1", "not an expression"),
        ("dp\x00", "not an expression"),
        (str(2 ** (MAX_INT_BITS + 1)), f"an integer exceeds {MAX_INT_BITS} bits"),
    ],
)
def test_syntax_outside_the_subset_is_refused_naming_it(expr: str, message: str) -> None:
    with pytest.raises(ConstraintError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_expr(expr)


def test_size_bounds() -> None:
    with pytest.raises(ConstraintError, match=f"at most {MAX_CONSTRAINT_CHARS} characters"):
        parse_expr("1" + " " * MAX_CONSTRAINT_CHARS)
    many = " + ".join(["dp"] * MAX_CONSTRAINT_NODES)
    assert len(many) <= MAX_CONSTRAINT_CHARS
    with pytest.raises(ConstraintError, match=f"at most {MAX_CONSTRAINT_NODES} terms"):
        parse_expr(many)
    with pytest.raises(ConstraintError, match="must be a string, got int"):
        parse_expr(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "expr,message",
    [
        ("dp / (micro_batch_size - 4)", "division by zero"),
        ("dp % 0", "division by zero"),
        ("recompute * 2", "'\\*' needs numbers, got str 'selective'"),
        ("-recompute", "'-' needs numbers, got str"),
        ("(1, 2) + (3,)", "'\\+' needs numbers, got tuple"),
        (f"2 ** {MAX_EXPONENT + 1}", "result too large"),
        ("4 ** 200", "result too large"),  # (3 - 1) bits x 200 > 256: refused before computing
        ("3 ** 200", f"exceeds {MAX_INT_BITS} bits"),  # passes the estimate, its result does not
        (f"2.0 ** {MAX_EXPONENT + 1}", f"exponent of '\\*\\*' is at most {MAX_EXPONENT}"),
        ("(-8) ** 0.5", "negative number to a fractional power"),
        ("nothing > 1", "'nothing' has no value in this configuration"),
        ("2 ** 255 * 4", f"exceeds {MAX_INT_BITS} bits"),
        ("1e300 ** 2 > 1", "OverflowError"),
        ("dp < 'a'", "TypeError"),
    ],
)
def test_evaluation_failures_name_the_problem(expr: str, message: str) -> None:
    with pytest.raises(ConstraintError, match=message):
        eval_expr(expr, ENV)


def test_powers_within_the_bounds_are_exact() -> None:
    assert eval_expr("2 ** 255", {}) == 2**255
    assert eval_expr(f"(-1) ** {MAX_EXPONENT}", {}) == 1
    assert eval_expr("10.0 ** 200 * 10.0 ** 200", {}) == float("inf")  # floats overflow to inf
    assert eval_expr("2 ** -1", {}) == 0.5


def test_check_expr_names_an_unknown_knob() -> None:
    names = frozenset({"micro_batch_size"})
    check_expr("micro_batch_size * dp <= world_size", names)  # dp, world_size are extra
    assert {"dp", "world_size"} == EXTRA_NAMES
    with pytest.raises(ConstraintError, match="'tp' is not a knob \\(nor world_size, dp\\)"):
        check_expr("tp * micro_batch_size <= 8", names)


def test_a_parsed_tree_evaluates_like_its_text() -> None:
    tree = parse_expr("micro_batch_size * dp")
    assert eval_expr(tree, ENV) == eval_expr("micro_batch_size * dp", ENV) == 16
    assert parse_expr("micro_batch_size * dp") is tree  # parsed once (cached)


def test_a_constraint_is_computed_once_per_values_of_the_names_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A space's check evaluates each constraint on up to 10,000 configurations (64
    constraints of 200 nodes took 66 CPU s in `dse validate`): the value is kept per tuple of
    the values of the names the constraint reads, so a name it does not read changes nothing."""
    import dse.core.expr as ex

    runs = [0]
    compile_ = ex._compile

    def counting(node):  # type: ignore[no-untyped-def]
        fn = compile_(node)
        if not isinstance(node, ast.BoolOp):  # count the root (the one 'and') only
            return fn

        def run(env):  # type: ignore[no-untyped-def]
            runs[0] += 1
            return fn(env)

        return run

    monkeypatch.setattr(ex, "_compile", counting)
    ex._compiled.cache_clear()
    expr = "micro_batch_size * tensor_model_parallel_size <= 8 and dp >= 1"
    envs = [
        {"micro_batch_size": m, "tensor_model_parallel_size": 2, "dp": 1, "env.NCCL_X": i}
        for i in range(250)
        for m in (1, 2, 4, 8)
    ]
    got = [eval_expr(expr, e) for e in envs]
    assert got == [e["micro_batch_size"] * 2 <= 8 for e in envs]
    assert runs[0] == 4  # once per micro-batch size, not once per configuration
    # equal values of another type are another key: 4 // 1 is 4, 4.0 // 1 is 4.0
    assert type(eval_expr("x // 1", {"x": 4})) is int
    assert type(eval_expr("x // 1", {"x": 4.0})) is float
    assert eval_expr("x // 1", {"x": True}) == 1
    # a list value is computed afresh: changing one handed out changes nothing kept
    first = eval_expr("[x, 1]", {"x": 3})
    first.append(9)
    assert eval_expr("[x, 1]", {"x": 3}) == [3, 1]
    ex._compiled.cache_clear()
