"""The ``cmd_args`` of a CloudAI test are read through a model of its workload template
(dse/interop/cloudai/cmd_args.py, learned from CloudAI's ``NeMoRunCmdArgs`` /
``MegatronBridgeCmdArgs``): a bad value is refused naming the file, the field and what is
wrong; a field the model does not know still imports as before (a newer CloudAI file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dse.cli.main import main
from dse.core.exceptions import SpaceError
from dse.interop.cloudai import import_scenario
from dse.space.searchspace import parse_space

CUR = Path(__file__).resolve().parents[1] / "fixtures" / "cloudai_current"
NANO = CUR / "test" / "megatron_bridge_nemotron_nano_pytorch_profiler.toml"
NEMO = CUR / "test" / "nemo_run_llama3_8b.toml"


def _bridge_with(tmp_path: Path, field: str, toml_value: str) -> Path:
    text = re.sub(rf"(?m)^{field} = .*\n", "", NANO.read_text())
    path = tmp_path / "bridge.toml"
    path.write_text(text.replace("[cmd_args]\n", f"[cmd_args]\n{field} = {toml_value}\n", 1))
    return path


def _nemo_with(tmp_path: Path, old: str, new: str, name: str = "nemo.toml") -> Path:
    text = NEMO.read_text()
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("tp", '"abc"', "must be an integer, got 'abc'"),
        ("tp", "true", "must be an integer, got True"),
        ("num_gpus", "-8", "must be at least 1, got -8"),
        ("mb", "0", "must be at least 1, got 0"),
        ("pp", '[1, "x"]', "item 1 of the sweep [1, 'x'] must be an integer, got 'x'"),
        ("use_megatron_fsdp", '"maybe"', "must be true or false, got 'maybe'"),
        ("compute_dtype", "8", "must be text, got 8"),
        ("first_k_dense_replace", "-1", "must be at least 0, got -1"),
    ],
)
def test_a_bad_megatron_bridge_value_names_the_file_the_field_and_the_problem(
    tmp_path: Path, field: str, value: str, why: str
) -> None:
    path = _bridge_with(tmp_path, field, value)
    with pytest.raises(SpaceError) as e:
        import_scenario(path)
    assert str(e.value).startswith(f"{path}: cmd_args.{field} {why}")


@pytest.mark.parametrize(
    ("old", "new", "field", "why"),
    [
        ("tensor_model_parallel_size = 4", 'tensor_model_parallel_size = "abc"',
         "trainer.strategy.tensor_model_parallel_size", "must be an integer, got 'abc'"),
        ("micro_batch_size = 1", "micro_batch_size = -1",
         "data.micro_batch_size", "must be at least 1, got -1"),
        ("max_steps = 30", "max_steps = 2.5", "trainer.max_steps", "must be an integer, got 2.5"),
        ("[extra_env_vars]\n", "[cmd_args.trainer.plugins]\nfp8_params = [true, 3]\n"
         "[extra_env_vars]\n", "trainer.plugins.fp8_params",
         "item 1 of the sweep [True, 3] must be true or false, got 3"),
    ],
)  # fmt: skip
def test_a_bad_nemorun_value_names_its_dotted_field(
    tmp_path: Path, old: str, new: str, field: str, why: str
) -> None:
    path = _nemo_with(tmp_path, old, new)
    with pytest.raises(SpaceError) as e:
        import_scenario(path)
    assert str(e.value).startswith(f"{path}: cmd_args.{field} {why}")


def test_the_error_names_the_file_that_gives_the_value(tmp_path: Path) -> None:
    """A scenario runs a test definition by name: a bad value in the test file names the
    test file; a bad value the scenario's own [Tests.cmd_args] sets names the scenario."""
    tests = tmp_path / "tests"
    tests.mkdir()
    bad_test = _nemo_with(tests, "tensor_model_parallel_size = 4", "tensor_model_parallel_size"
                          ' = "four"', name="t.toml")  # fmt: skip
    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "s"\n[[Tests]]\nid = "a"\ntest_name = "nemo_run_llama3_8b"\n')
    with pytest.raises(SpaceError) as e:
        import_scenario(scenario, tests_dir=tests)
    assert str(e.value).startswith(
        f"{bad_test}: cmd_args.trainer.strategy.tensor_model_parallel_size must be an integer"
    )
    bad_test.write_text(NEMO.read_text())  # the test is good again; the scenario sets a bad one
    scenario.write_text(
        scenario.read_text() + "[Tests.cmd_args.data]\nglobal_batch_size = [128, -1]\n"
    )
    with pytest.raises(SpaceError) as e:
        import_scenario(scenario, tests_dir=tests)
    assert str(e.value).startswith(f"{scenario}: cmd_args.data.global_batch_size item 1 of")


def test_several_bad_values_are_named_together_and_the_cli_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _bridge_with(tmp_path, "tp", '"abc"')
    path.write_text(path.read_text().replace("[cmd_args]\n", "[cmd_args]\ncp = -2\n", 1))
    assert main(["cloudai", "import", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: cmd_args.tp must be an integer, got 'abc'" in err
    assert f"{path}: cmd_args.cp must be at least 1, got -2" in err


def test_fields_the_models_do_not_know_still_import_and_values_read_as_cloudai_reads_them(
    tmp_path: Path,
) -> None:
    """A newer CloudAI file's fields: a MegatronBridge one is listed as not mapped, a NeMoRun
    one travels as the recipe's override; "2" is CloudAI's 2 (its models read text numbers)."""
    path = _bridge_with(tmp_path, "tp", '"2"')
    path.write_text(path.read_text().replace("[cmd_args]\n", "[cmd_args]\nfuture_flag = [1, 2]\n"))
    got = import_scenario(path)
    assert "cmd_args.future_flag" in {u.key for u in got.unmapped}
    space = parse_space(got.space, "t")
    assert space.full_params(space.baseline())["tensor_model_parallel_size"] == 2
    nemo = _nemo_with(tmp_path, "context_parallel_size = 2",
                      "context_parallel_size = 2\n    future_field = 3")  # fmt: skip
    got = import_scenario(nemo)
    assert got.space["workload"]["launcher"]["overrides"]["trainer.strategy.future_field"] == 3
    assert not got.unmapped


def test_the_import_is_a_driver_over_sections_and_template_strategies() -> None:
    """import_scenario calls one function per section; what differs per CloudAI template is
    a method of its strategy (importer._STRATEGIES), so no code outside the strategies asks
    which workload it reads (it had four such branches over 330 lines)."""
    import ast
    import inspect

    from dse.interop.cloudai import importer

    tree = ast.parse(inspect.getsource(importer))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [n for n in (node.left, *node.comparators) if isinstance(n, ast.Name)]
            consts = [c.value for c in node.comparators if isinstance(c, ast.Constant)]
            assert not (
                {"workload"} & {n.id for n in names} and {"nemo", "bridge"} & set(consts)
            ), ast.unparse(node)
    driver = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "import_scenario"
    )
    branches = [n for n in ast.walk(driver) if isinstance(n, (ast.If, ast.For, ast.While))]
    assert not branches  # a straight sequence of sections
    assert len(driver.body) <= 20
