"""Hostile space files: each case of the hostile-input review is refused at parse or validate
time with a message naming the field (or the line), quickly, never with a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.cli.main import main
from dse.core import bounds
from dse.core.exceptions import SpaceError
from dse.model.rules import check, check_space
from dse.space.searchspace import (
    RayOptions,
    SearchSpace,
    SlurmOptions,
    parse_space,
    parse_space_text,
)
from tests.conftest import EXAMPLES

TINY = (EXAMPLES / "tiny_gpt_cpu.yaml").read_text()


def _tiny() -> dict[str, Any]:
    return yaml.safe_load(TINY)


def _validate(tmp_path: Path, text: str | bytes, capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``dse validate`` on ``text``: it must exit 2; returns stderr."""
    p = tmp_path / "space.yaml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err
    assert "Traceback" not in err
    return err


def _bomb(levels: int = 9, width: int = 9) -> str:
    """The review's anchor chain in runner.options (1.8 KB of YAML, width**levels strings)."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    body = "".join(f"    {line}\n" for line in lines)
    runner = "runner: {name: local, max_parallel: 1, workdir: dse_runs}\n"
    return TINY.replace(runner, "runner:\n  name: local\n  options:\n" + body)


# --- YAML -----------------------------------------------------------------------------------
def test_alias_bomb_in_runner_options_refused_at_parse_time() -> None:
    text = _bomb()
    assert len(text) - len(TINY) < 2500
    with pytest.raises(SpaceError, match=r"line \d+.*expands to more than 50000 nodes"):
        parse_space_text(text, "bomb.yaml")


def test_few_aliases_still_work() -> None:
    text = TINY.replace(
        "knobs:\n", "knobs:\n  recompute: &r {values: [none, full], baseline: none}\n", 1
    ).replace("  recompute: {values: [none, selective, full], baseline: none}\n", "")
    assert parse_space_text(text, "x").knobs["recompute"].values() == ["none", "full"]


def test_many_aliases_refused() -> None:
    refs = ", ".join(["*v"] * (bounds.MAX_YAML_ALIASES + 1))
    text = TINY + f"x: &v 1\ny: [{refs}]\n"
    with pytest.raises(SpaceError, match=f"more than {bounds.MAX_YAML_ALIASES} aliases"):
        parse_space_text(text, "x")


def test_recursive_alias_refused() -> None:
    with pytest.raises(SpaceError, match="refers to itself"):
        parse_space_text(TINY + "recipe: &a [*a]\n", "x")


def test_deep_nesting_refused() -> None:
    with pytest.raises(SpaceError, match="nested deeper than 32 levels"):
        parse_space_text(TINY + "recipe: " + "[" * 5000 + "]" * 5000 + "\n", "x")


def test_duplicate_key_names_key_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = TINY.replace("  steps: 4\n", "  steps: 4\n  steps: 40\n")
    line = text.splitlines().index("  steps: 40") + 1
    err = _validate(tmp_path, text, capsys)
    assert f"line {line}," in err
    assert "duplicate key 'steps' (first given at line" in err


def test_yaml_merge_keys_are_not_duplicates() -> None:
    # an override through a merge key is YAML's own rule, not a duplicate key
    text = TINY.replace(
        "budget:\n  n_trials: 10\n", "budget:\n  <<: {n_trials: 3}\n  n_trials: 5\n"
    )
    assert parse_space_text(text, "x").budget.n_trials == 5


def test_non_utf8_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _validate(tmp_path, TINY.encode() + b"\n# \xff\xfe caf\xe9\n", capsys)
    assert "not UTF-8 text" in err


@pytest.mark.parametrize("digits", [41, 4301, 20_000])
def test_long_integer_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], digits: int
) -> None:
    text = TINY.replace("agent: {name: tpe, seed: 0", "agent: {name: tpe, seed: " + "9" * digits)
    err = _validate(tmp_path, text, capsys)
    assert f"a number of {digits} characters is too long" in err
    assert "line " in err


def test_file_size_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TINY + "#" + "x" * bounds.MAX_SPACE_BYTES + "\n"
    err = _validate(tmp_path, text, capsys)
    assert f"at most {bounds.MAX_SPACE_BYTES} bytes" in err
    with pytest.raises(SpaceError, match="at most"):
        parse_space_text(text, "request body")


# --- runner options --------------------------------------------------------------------------
def test_runner_options_typed_per_runner() -> None:
    d = _tiny()
    d["runner"] = {"name": "ray", "options": {"address": "auto"}}
    sp = parse_space(d, "x")
    assert isinstance(sp.runner.options, RayOptions)
    assert sp.runner.options.address == "auto"
    d["runner"] = {"name": "slurm", "options": {"partition": "batch"}}
    assert isinstance(parse_space(d, "x").runner.options, SlurmOptions)
    # the options of another runner, or free-form keys, are errors naming the field
    d["runner"] = {"name": "local", "options": {"address": "auto"}}
    with pytest.raises(SpaceError, match=r"x: runner\.options\.address: Extra inputs"):
        parse_space(d, "x")
    d["runner"] = {"name": "slurm", "options": {"partition": "p" * 10_000}}
    with pytest.raises(SpaceError, match=r"runner\.options\.partition: String should have at"):
        parse_space(d, "x")


def test_runner_options_keep_the_digest_and_survive_a_runner_override() -> None:
    sp = parse_space(_tiny(), "x")
    assert "options" in sp.model_dump()["runner"]
    assert sp.model_dump()["runner"]["options"] == {}  # the tag is not part of the hash
    data = sp.model_dump()
    data["runner"]["name"] = "slurm"  # what `dse start --runner slurm` does
    assert isinstance(parse_space(data, "x").runner.options, SlurmOptions)


# --- bounds on fields ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("agent", "seed"), 2**32, "agent.seed: Input should be less than or equal to 4294967295"),
        (("agent", "seed"), -1, "agent.seed: Input should be greater than or equal to 0"),
        (("semantics", "seed"), 2**40, "semantics.seed: Input should be less than or equal"),
        (("model", "hidden_size"), 2**31, "model.hidden_size: Input should be less than or equal"),
        (("study",), "s" * 129, "study: String should have at most 128 characters"),
        (("recipe",), "r" * 300, "recipe: String should have at most 256 characters"),
        (("runner", "workdir"), "w" * 5000, "runner.workdir: String should have at most 4096"),
        (("storage",), "s" * 5000, "storage: String should have at most 4096"),
        (("constraints",), ["world_size > 0"] * 65, "constraints: List should have at most 64"),
        (("constraints",), ["1 + " * 300 + "1 > 0"], "constraints[0]: String should have at most"),
        (
            ("budget", "trial_timeout_s"),
            float("inf"),
            "budget.trial_timeout_s: Input should be a ",
        ),
        (
            ("budget", "trial_timeout_s"),
            1e300,  # a 300-digit Slurm --time
            "budget.trial_timeout_s: Input should be less than or equal to 2592000",
        ),
        (("budget", "hang_timeout_s"), 1e300, "budget.hang_timeout_s: Input should be less than"),
        (("budget", "wall_clock_s"), 1e300, "budget.wall_clock_s: Input should be less than"),
        (("runner", "gpus"), list(range(2000)), "runner.gpus: List should have at most 1024"),
        (
            ("knobs", "micro_batch_size"),
            {"values": list(range(1, 5000))},
            "knobs.micro_batch_size.domain.values: List should have at most 4096",
        ),
        (
            ("knobs", "micro_batch_size"),
            {"values": [1, "x" * 300]},
            "knobs.micro_batch_size.domain.values[1]",
        ),
    ],
)
def test_field_bounds(path: tuple[str, ...], value: Any, message: str) -> None:
    d = _tiny()
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SpaceError) as e:
        parse_space(d, "x")
    assert message in str(e.value)


def test_durations_at_the_bound_accepted() -> None:
    d = _tiny()
    d["budget"].update(
        trial_timeout_s=bounds.MAX_DURATION_S,
        hang_timeout_s=bounds.MAX_DURATION_S,
        wall_clock_s=bounds.MAX_DURATION_S,
    )
    assert parse_space(d, "x").budget.trial_timeout_s == 30 * 86400


@pytest.mark.parametrize(
    ("arg", "refused"),
    [
        ("--array=0-9999", "array"),
        ("--arr=1-3", "array"),  # sbatch takes an unambiguous prefix
        ("--hold", "hold"),
        ("--uid=0", "uid"),
        ("--gid=0", "gid"),
        ("--container=/tmp/bundle", "container"),
        ("--container-id=x", "container-id"),
        ("--bbf=/tmp/bb.conf", "bbf"),
        ("--bb=capacity=1G", "bb"),
    ],
)
@pytest.mark.parametrize("field", ["sbatch_args", "srun_args"])
def test_slurm_options_that_change_who_or_what_runs_are_refused(
    field: str, arg: str, refused: str
) -> None:
    d = _tiny()
    d["runner"] = {"name": "slurm", "options": {field: ["--reservation=r1", arg]}}
    with pytest.raises(SpaceError) as e:
        parse_space(d, "x")
    assert f"x: runner.options.{field}[1]: {arg!r}: the option --{refused} is refused (" in str(
        e.value
    )


def test_slurm_options_near_the_refused_ones_are_kept() -> None:
    d = _tiny()
    kept = ["--hint=nomultithread", "--gres=gpu:8", "--container-image=nvcr.io/x", "--begin=now"]
    d["runner"] = {"name": "slurm", "options": {"sbatch_args": kept, "srun_args": kept}}
    assert parse_space(d, "x").runner.options.sbatch_args == kept  # type: ignore[union-attr]


def test_agent_seed_limits_accepted() -> None:
    d = _tiny()
    d["agent"]["seed"] = 2**32 - 1
    assert parse_space(d, "x").agent.seed == 2**32 - 1


@pytest.mark.parametrize("high", [10**12, 2**31 - 1, 100_000])
def test_int_knob_range_bounded(high: int) -> None:
    d = _tiny()
    d["knobs"]["micro_batch_size"] = {"type": "int", "low": 1, "high": high}
    with pytest.raises(SpaceError, match=r"knobs\.micro_batch_size\.domain"):
        parse_space(d, "x")


def test_int_knob_log_range_allowed() -> None:
    d = _tiny()
    d["knobs"]["micro_batch_size"] = {"type": "int", "low": 1, "high": 2**31 - 1, "log": True}
    assert len(parse_space(d, "x").knobs["micro_batch_size"].values()) == 31


# --- the space check is bounded --------------------------------------------------------------
def _collapsing() -> SearchSpace:
    """Five int knobs active only when recompute is 'full', which it never is: 64**5
    combinations, one distinct configuration."""
    d = _tiny()
    d["knobs"] = {"recompute": {"values": ["none"]}}
    for name in ("pipeline_model_parallel_size", "context_parallel_size", "micro_batch_size"):
        d["knobs"][name] = {"type": "int", "low": 1, "high": 64, "when": {"recompute": "full"}}
    d["knobs"]["expert_model_parallel_size"] = {
        "type": "int",
        "low": 1,
        "high": 64,
        "when": {"recompute": "full"},
    }
    d["knobs"]["tensor_model_parallel_size"] = {
        "type": "int",
        "low": 1,
        "high": 64,
        "when": {"recompute": "full"},
    }
    return parse_space(d, "x")


def test_check_space_bounds_combinations_not_only_configs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sp = _collapsing()
    assert sp.size() == 64**5
    calls = 0
    original = SearchSpace.apply_conditions

    def counting(self: SearchSpace, params: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls > 5 * bounds.MAX_SPACE_COMBINATIONS:
            raise AssertionError("the space check looks at combinations without a bound")
        return original(self, params)

    monkeypatch.setattr(SearchSpace, "apply_conditions", counting)
    got = check_space(sp, "x")
    assert (got.looked_at, got.valid, got.estimated_valid) == (1, 1, 1)
    assert not got.complete
    assert calls <= bounds.MAX_SPACE_COMBINATIONS + 10


# --- constraints ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("7**10**6 > 0", "'**' result too large"),
        ("9**9**9**9 > 0", "'**' result too large"),
        ("2**200 * 2**200 > 0", "exceeds 256 bits"),
        ("micro_batch_size / (tensor_model_parallel_size - 1) > 0", "division by zero"),
        ("micro_batch_size % (tensor_model_parallel_size - 1) == 0", "division by zero"),
        ("recompute + 1 > 0", "'+' needs numbers, got str 'none'"),
        ("recompute * 10**9 == 'x'", "'*' needs numbers"),
        ("recompute < 3", "TypeError"),
        ("1e300 ** 2 > 0", "OverflowError"),
        ("2.0 ** 100000 > 0", "exponent of '**' is at most 256"),
        ("micro_batch_size in 3", "TypeError"),
    ],
)
def test_constraint_evaluation_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], expr: str, message: str
) -> None:
    d = _tiny()
    d["constraints"] = ["micro_batch_size >= 1", expr]
    err = _validate(tmp_path, yaml.safe_dump(d), capsys)
    assert "space_constraint_error" in err
    assert f"constraints[1] {expr!r} cannot be evaluated" in err
    assert message in err


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("(" * 300 + "1" + ")" * 300, "not an expression"),
        ("1 + " * 240 + "1 > 0", "at most 200 terms"),
        ("not " * 210 + "True", "at most 200 terms"),
        ("micro_batch_size.__class__", "Attribute is not allowed"),
        ("1j == 0", "the constant 1j is not allowed"),
        ("2" * 100 + " > 0", "exceeds 256 bits"),
        ("__import__('os')", "Call is not allowed"),
    ],
    ids=["parens", "terms", "nots", "attribute", "complex", "long-int", "call"],
)
def test_constraint_syntax_bounded(expr: str, message: str) -> None:
    d = _tiny()
    d["constraints"] = [expr]
    with pytest.raises(SpaceError) as e:
        parse_space(d, "x")
    assert "constraints[0]: " in str(e.value)
    assert len(str(e.value)) < 600  # the constraint is quoted shortened
    assert message in str(e.value)


def test_constraint_error_on_a_later_configuration() -> None:
    """A constraint that fails only on some configuration: refused by the space check
    (naming the constraint and the values), and a rejection, not a crash, in a study."""
    d = _tiny()
    d["constraints"] = ["micro_batch_size / (micro_batch_size - 2) != 0.5"]
    sp = parse_space(d, "x")
    with pytest.raises(
        SpaceError,
        match=r"x: constraints\[0\]: space_constraint_error: constraints\[0\] .*division",
    ):
        check_space(sp, "x")
    cfg = {**sp.baseline(), "micro_batch_size": 2}
    (v,) = [v for v in check(sp, cfg, []) if v.rule == "space_constraint_error"]
    assert "constraints[0] 'micro_batch_size / (micro_batch_size - 2) != 0.5'" in v.message
    assert "division by zero" in v.message
    assert v.values == {"micro_batch_size": 2}


def test_constraints_still_evaluate_like_python() -> None:
    d = _tiny()
    d["constraints"] = [
        "micro_batch_size * tensor_model_parallel_size <= 4",
        "recompute in ('none', 'full') or attention_backend == 'sdpa'",
        "1 < micro_batch_size + 1 <= 8 and not (dp == 0)",
        "(world_size // tensor_model_parallel_size) % 1 == 0 if dp else False",
        "-micro_batch_size < 0 and 2 ** 10 == 1024 and 7 / 2 == 3.5",
    ]
    sp = parse_space(d, "x")
    base = sp.baseline()
    assert all(ok for _, ok in sp.constraint_values(base))
    cfg = {**base, "micro_batch_size": 4, "tensor_model_parallel_size": 2}
    assert [ok for _, ok in sp.constraint_values(cfg)] == [False, True, True, True, True]
    cfg = {**base, "recompute": "selective", "attention_backend": "unfused"}
    assert [ok for _, ok in sp.constraint_values(cfg)][1] is False


# --- control characters ----------------------------------------------------------------------
def test_messages_do_not_echo_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = TINY.replace("knobs:\n", 'knobs:\n  "micro\\e[2J\\0batch": {values: [1]}\n', 1)
    err = _validate(tmp_path, text, capsys)
    assert "\x1b" not in err and "\x00" not in err
    assert "unknown knob" in err
    text = TINY.replace("study: tiny-gpt-cpu", 'study: "\\e[31m' + "x" * 200 + '"')
    err = _validate(tmp_path, text, capsys)
    assert "\x1b" not in err
    assert "study: String should have at most 128" in err
    # in a file name, too
    p = tmp_path / "bad\x1b[2Jname.yaml"
    p.write_text("study: [")
    assert main(["validate", str(p)]) == 2
    assert "\x1b" not in capsys.readouterr().err


def test_a_false_constraint_is_named_by_its_place() -> None:
    """A rejection by a constraint names it as ``constraints[i]`` and its text (two
    constraints of the same text are told apart by the place)."""
    d = _tiny()
    d["constraints"] = ["micro_batch_size >= 1", "micro_batch_size <= 2"]
    sp = parse_space(d, "x")
    cfg = {**sp.baseline(), "micro_batch_size": 4}
    (v,) = [v for v in check(sp, cfg, []) if v.rule == "space_constraint"]
    assert v.message == "constraints[1] 'micro_batch_size <= 2' is false"
    with pytest.raises(Exception, match=r"constraints\[1\] 'micro_batch_size / 0 > 0'"):
        parse_space(
            {**d, "constraints": ["True", "micro_batch_size / 0 > 0"]}, "x"
        ).constraint_values(sp.baseline())


def test_validate_warnings_name_the_constraint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A knob value that only a constraint rules out: the warning says which constraint."""
    d = _tiny()
    d["constraints"] = ["micro_batch_size >= 1", "micro_batch_size <= 2"]
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(d))
    assert main(["validate", str(p)]) == 0
    err = capsys.readouterr().err
    assert "knobs.micro_batch_size: value 4 is in no valid configuration" in err
    assert "breaks space_constraint constraints[1] (" in err


# --- the space check at the bounds ------------------------------------------------------------
def test_validate_at_the_knob_bounds_checks_the_env_policy_once_per_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_KNOBS environment knobs of 16 values (16**256 combinations, past any float): the
    space check samples MAX_SPACE_COMBINATIONS of them; the environment policy, which does
    not depend on the sample, is asked once per variable (it was asked for every knob of
    every sampled configuration, 2.56 million times), and the estimate is exact integer
    arithmetic (it was an OverflowError traceback)."""
    import dse.space.knobs as knobs_module

    asked: list[str] = []
    policy = knobs_module.env_var_problem

    def counted(name: str) -> str | None:
        asked.append(name)
        return policy(name)

    monkeypatch.setattr(knobs_module, "env_var_problem", counted)
    getattr(knobs_module._env_knob, "cache_clear", lambda: None)()  # names asked before
    d = _tiny()
    d["knobs"] = {
        f"env.NCCL_X{i}": {"type": "int", "low": 1, "high": 16} for i in range(bounds.MAX_KNOBS)
    }
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(d))
    assert main(["validate", str(p)]) == 0
    out = capsys.readouterr().out
    assert f"{16**bounds.MAX_KNOBS} knob combinations" in out and "(an estimate)" in out
    assert len(asked) <= 2 * bounds.MAX_KNOBS, f"the policy was asked {len(asked)} times"


def test_the_limits_hold_on_libyamls_parser() -> None:
    """Large space files are scanned by libyaml (C) where PyYAML has it; the composer with
    the limits above stays dse's, so each refusal of this file runs on that path too."""
    from dse.core import safeyaml

    pytest.importorskip("yaml._yaml")
    assert safeyaml._Loader is not safeyaml._BoundedLoader
    assert issubclass(safeyaml._Loader, safeyaml._BoundedLoader)
    with pytest.raises(Exception, match="line 1, column 17"):  # not a line after the text
        safeyaml.safe_load("study: [unclosed")
