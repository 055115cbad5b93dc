"""Bad input is refused with exit code 2 and a message naming what is wrong; nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
from tests.conftest import EXAMPLES


def _write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def _tiny() -> dict:
    return yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())


@pytest.mark.parametrize("command", ["validate", "start"])
@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["model"].update(num_layerz=4), "model.num_layerz: Extra inputs"),
        (lambda d: d["knobs"].update(micro_batch=None), "unknown knob 'micro_batch'"),
        (
            lambda d: d["semantics"].update(global_batch_size="eight"),
            "semantics.global_batch_size: Input should be a valid integer",
        ),
        (
            lambda d: d["knobs"]["recompute"].update(values=["none", "partial"]),
            "knobs.recompute: expected one of ['none', 'selective', 'full'], got 'partial'",
        ),
        (
            lambda d: d.update(constraints=["micro_batch_size > 100"]),
            "the baseline configuration is invalid: space_constraint: constraints[0] "
            "'micro_batch_size > 100' is false (micro_batch_size=1)",
        ),
        (
            lambda d: d["semantics"].update(global_batch_size=3),
            "the baseline configuration is invalid: gbs_divisible",
        ),
    ],
)
def test_bad_space_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, mutate, message: str
) -> None:
    d = _tiny()
    mutate(d)
    p = _write(tmp_path, d)
    db = tmp_path / "x.db"
    args = ["validate", str(p)] if command == "validate" else [
        "start", "--space", str(p), "--storage", f"sqlite:///{db}"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert str(p) in err
    assert not db.exists() or command == "start"  # validate never touches storage


@pytest.mark.parametrize(
    ("measurement", "message"),
    [
        ({"mode": "quick"}, "measurement.mode: Input should be 'adaptive' or 'fixed'"),
        (
            {"mode": "adaptive", "min_steps": 50, "max_steps": 20},
            "measurement: min_steps (50) must not exceed max_steps (20)",
        ),
        ({"min_steps": 2}, "measurement.min_steps: Input should be greater than or equal to 5"),
        ({"rel_halfwidth": 0}, "measurement.rel_halfwidth: Input should be greater than 0"),
        ({"confidence": 1.0}, "measurement.confidence: Input should be less than 1"),
        ({"prune_margin": -0.1}, "measurement.prune_margin: Input should be greater than or"),
        ({"prune": "often"}, "measurement.prune: Input should be a valid boolean"),
        ({"window": 5}, "measurement.window: Extra inputs are not permitted"),
    ],
)
def test_bad_measurement_section_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], measurement: dict, message: str
) -> None:
    d = _tiny()
    d["measurement"] = measurement
    p = _write(tmp_path, d)
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(p) in err


def test_pruning_needs_one_throughput_objective(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _tiny()
    d["measurement"] = {"mode": "adaptive", "prune": True}
    d["objective"] = {"metric": "peak_mem_gib", "direction": "minimize"}
    assert main(["validate", str(_write(tmp_path, d))]) == 2
    err = capsys.readouterr().err
    assert "measurement.prune stops trials dominated by the best of one objective" in err
    assert "peak_mem_gib (minimize)" in err


def test_malformed_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _write(tmp_path, "study: x\nknobs: {a: [1, 2}\n")
    assert main(["validate", str(p)]) == 2
    assert "not valid YAML at line 2" in capsys.readouterr().err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read the space file" in capsys.readouterr().err


def test_unknown_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dse.storage import open_storage

    url = f"sqlite:///{tmp_path / 'x.db'}"
    open_storage(url).close()
    assert main(["best", "--storage", url, "--study", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["best"],
        ["export"],
        ["resume"],
        ["report", "-o", "report-out"],
        ["cloudai", "export", "-o", "best.toml"],
        ["export", "--format", "optuna", "--storage-out", "sqlite:///optuna-out.db"],
    ],
)
def test_mistyped_storage_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    db = tmp_path / "typo" / "studies.db"
    assert main([*command, "--storage", f"sqlite:///{db}"]) == 2
    assert "no study database at" in capsys.readouterr().err
    assert not db.exists() and not db.parent.exists()


def test_validate_refuses_runners_start_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dse.core.registry import REGISTRY

    # a runner this installation lacks: validate and start ask the same registry
    d = _tiny()
    d["runner"] = {"name": "slurm"}
    p = _write(tmp_path, d)
    with REGISTRY.hidden("runner", "slurm"):
        assert main(["validate", str(p)]) == 2
        assert "runner 'slurm' is not available" in capsys.readouterr().err
        assert main(["start", "--space", str(p), "--storage", f"sqlite:///{tmp_path}/s.db"]) == 2


def test_validate_prints_the_cap_as_a_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dse.model.rules

    monkeypatch.setattr(dse.model.rules, "CHECK_SPACE_CAP", 20)
    rc = main(["validate", str(_write(tmp_path, _tiny()))])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "72 knob combinations, more than the 20 the check looks at (the cap)" in out
    assert "of a random sample of" in out and "(an estimate)" in out


def _plain_bridge() -> dict:
    """The Bridge-style MoE example without its derived settings: SP stays on at TP 1."""
    d = yaml.safe_load((EXAMPLES / "bridge_moe_sim.yaml").read_text())
    del d["derived"]
    return d


def test_validate_counts_a_large_space_from_a_random_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """590,000 combinations, TP the first knob: the first combinations in enumeration order
    all had TP 1, which breaks sp_needs_tp here, and validate said none of them passes."""
    assert main(["validate", str(_write(tmp_path, _plain_bridge()))]) == 0
    out, err = capsys.readouterr()
    assert "589824 knob combinations" in out
    share = float(out.split(" pass the rules")[0].rsplit("(", 1)[1].rstrip("%)"))
    assert 5.0 < share < 40.0, out  # TP 1 (a quarter) and EP 8 never pass; others often do
    # values no configuration can use are named, with the rules they break
    assert "knobs.tensor_model_parallel_size: value 1 is in no valid configuration" in err
    assert "sp_needs_tp" in err
    # EP 8 needs ETP*EP <= 8, and ETP is TP (> 1 here): the derived example sets ETP 1
    assert "knobs.expert_model_parallel_size: value 8 is in no valid configuration" in err


def test_validate_warns_about_values_no_configuration_can_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _tiny()
    d["knobs"]["tensor_model_parallel_size"]["values"] = [1, 2, 3]
    d["knobs"]["micro_batch_size"]["values"] = [1, 2, 4, 16]
    d["knobs"]["recompute_modules"] = {  # only read with selective recompute
        "values": ["core_attn", "mlp"],
        "when": {"recompute": "selective"},
    }
    assert main(["validate", str(_write(tmp_path, d))]) == 0
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if "warning:" in ln]
    assert len(lines) == 2, err
    assert "knobs.tensor_model_parallel_size: value 3 is in no valid configuration" in err
    assert "world_divisible" in err
    assert "knobs.micro_batch_size: value 16 is in no valid configuration" in err
    assert "gbs_divisible" in err
    # a value the space can use is not named; the example itself warns about nothing
    assert main(["validate", str(EXAMPLES / "tiny_gpt_cpu.yaml")]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "name",
    ["../x", "/tmp/abs", "a/b", "..", "line\nforged", "nel\x85forged", "ls\u2028forged",
     "csi\x9b2J", "bidi\u202egnp.exe", "zero\u200bwidth"],
)  # fmt: skip
def test_study_names_are_path_components(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    name = name.replace("\\n", "\n")
    p = _write(tmp_path, _tiny())
    url = f"sqlite:///{tmp_path}/s.db"
    assert main(["start", "--space", str(p), "--study", name, "--storage", url]) == 2
    assert "study" in capsys.readouterr().err
    d = _tiny()
    d["study"] = name
    assert main(["validate", str(_write(tmp_path, d))]) == 2
    assert main(["import", str(p), "--study", name, "--storage", url]) == 2
    assert not (tmp_path / "x").exists()


def test_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", "--space"]) == 2


def test_validate_examples(capsys: pytest.CaptureFixture[str]) -> None:
    for f in sorted(EXAMPLES.glob("*.yaml")):
        assert main(["validate", str(f)]) == 0, f
    assert "pass the rules" in capsys.readouterr().out


def test_best_without_a_complete_trial_is_not_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study that exists but has no complete trial yet: exit 1 (ask again later), not 2."""
    from dse.space.searchspace import parse_space
    from dse.storage import open_storage

    url = f"sqlite:///{tmp_path / 'x.db'}"
    st = open_storage(url)
    space = parse_space(_tiny(), "t")
    st.create_study(space_yaml=yaml.safe_dump(_tiny()), **space.study_fields())
    st.close()
    assert main(["best", "--storage", url, "--study", space.study]) == 1
    assert "no complete trial yet" in capsys.readouterr().err


def test_status_prints_names_safely(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stored name with a newline (an old database, an import) cannot forge a line."""
    from dse.storage import open_storage

    url = f"sqlite:///{tmp_path / 'x.db'}"
    st = open_storage(url)
    st.create_study(name="a\nstudy forged [complete]", space_yaml="{}", space_hash="h",
                    direction="maximize", metric="tflops_per_gpu", model={},
                    hardware={})  # fmt: skip
    st.close()
    for other in ("b\x85study forged2 [complete]", "c\u2028study forged3 [complete]"):
        st = open_storage(url)
        st.create_study(name=other, space_yaml="{}", space_hash="h", direction="maximize",
                        metric="tflops_per_gpu", model={}, hardware={})  # fmt: skip
        st.close()
    assert main(["status", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "study a\\nstudy forged [complete] [created]" in out
    assert "study b\\x85study forged2 [complete] [created]" in out
    assert "study c\\u2028study forged3 [complete] [created]" in out
    assert not any(line.startswith("study forged") for line in out.splitlines())
    assert "\x85" not in out and "\u2028" not in out
