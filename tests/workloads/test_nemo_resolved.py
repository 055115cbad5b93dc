"""dse's NeMo 2.0 overrides resolved by the real NeMo (``launchers.nemo_installed``).

The NeMo tests run where an interpreter has NeMo 2.0 (nemo-toolkit 2.7.3 with its LLM
collection: ``DSE_NEMO_PYTHON=/path/to/python``, see docs/interop.md); elsewhere they skip,
naming that. The answer without NeMo is checked everywhere."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from dse.core.records import MetricsWriter, TrialSpec, read_metrics
from dse.model.rules import check
from dse.space.searchspace import load_space
from dse.workloads.launchers._core import launcher_for
from dse.workloads.launchers.nemo_installed import mismatch_reasons, nemo_python, resolve
from dse.workloads.launchers.resolved import check_for
from dse.workloads.launchers.run import run_rendered
from tests.conftest import LOGS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b.yaml"
#: the seed's NeMo 2.0 recipes (NeMo's factory module names)
SEED_RECIPES = [
    "llama3_8b", "llama3_70b", "llama31_405b", "nemotron3_8b", "nemotron4_15b", "nemotron4_340b",
]  # fmt: skip

needs_nemo = pytest.mark.skipif(
    not os.environ.get("DSE_NEMO_PYTHON"),
    reason="NeMo 2.0 is not installed beside dse (set DSE_NEMO_PYTHON to an interpreter that "
    "has nemo-toolkit 2.7.3 with nemo.collections.llm)",
)


def _overrides(params: dict) -> list[str]:
    space = load_space(EXAMPLE)
    launcher = launcher_for(space)
    return [*launcher.knob_overrides(params), *launcher.semantics_overrides()]


def _configurations(limit: int) -> list[dict]:
    space = load_space(EXAMPLE)
    out = []
    for params in space.iter_configs():
        if not check(space, params):
            out.append(params)
        if len(out) == limit:
            break
    return out


def test_without_nemo_the_answer_says_so_and_checks_nothing() -> None:
    got = resolve([{"recipe": "llama3_8b", "overrides": []}], python=sys.executable)
    if nemo_python() == sys.executable:
        pytest.skip("this interpreter has NeMo")
    assert got["importable"] is False
    assert "results" not in got


@needs_nemo
def test_the_seed_recipes_resolve_with_dses_overrides() -> None:
    configs = _configurations(6)
    assert configs
    requests = [{"recipe": "llama3_8b", "overrides": _overrides(p)} for p in configs]
    base = load_space(EXAMPLE).baseline()
    requests += [{"recipe": r, "overrides": _overrides(base)} for r in SEED_RECIPES]
    got = resolve(requests)
    assert got["importable"], got
    for req, res in zip(requests, got["results"], strict=True):
        assert res["recipe"] == req["recipe"]
        assert res["resolved"], res  # the fields were read back
        assert mismatch_reasons(res) == [], (req, res)


@needs_nemo
def test_a_field_nemo_overwrites_is_caught() -> None:
    """NeMo's strategy copies its parallel sizes into the model's config, and the optimizer's
    distributed-optimizer flag into the DDP config: a value set on the other side is not what
    runs."""
    base = load_space(EXAMPLE).baseline()
    planted = [
        *_overrides(base),
        "model.config.tensor_model_parallel_size=4",  # the strategy says 1
        "optim.config.use_distributed_optimizer=True",
        "trainer.strategy.ddp.use_distributed_optimizer=False",
    ]
    got = resolve([{"recipe": "llama3_8b", "overrides": planted}])
    reasons = mismatch_reasons(got["results"][0])
    assert any(r.startswith("model.config.tensor_model_parallel_size: dse set 4") for r in reasons)
    assert any(r.startswith("trainer.strategy.ddp.use_distributed_optimizer") for r in reasons)
    assert len(reasons) == 2, reasons


@needs_nemo
def test_dse_validate_resolves_a_nemo_space_through_nemo(tmp_path: Path) -> None:
    """``dse validate`` (the launcher check) resolves the NeMo example's renderings through
    NeMo; a recipe override NeMo overwrites fails it, naming the field."""
    from dse.core.exceptions import SpaceError
    from dse.workloads.launchers._core import check_launcher

    assert check_launcher(load_space(EXAMPLE), "llama3_8b.yaml") > 0
    text = EXAMPLE.read_text().replace(
        "      log.ckpt: null\n",
        "      log.ckpt: null\n      model.config.tensor_model_parallel_size: 4\n",
    )
    planted = tmp_path / "planted.yaml"
    planted.write_text(text)
    with pytest.raises(SpaceError, match="model.config.tensor_model_parallel_size: dse set 4"):
        check_launcher(load_space(planted), "planted.yaml")


# --- the trial: its own rendered overrides resolved through NeMo before the recipe starts ---

LOG = LOGS / "nemo2_llama3_8b_memory.log"
#: A stand-in for ``nemo llm pretrain``: it marks that it started and prints a real NeMo 2.0
#: log; the arguments after the script are the rendered command's (``--factory ... -y ...``).
STANDIN = (
    "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('started'); "
    "print(pathlib.Path(sys.argv[2]).read_text())"
)


def _trial(tmp_path: Path, overrides: list[str], env: dict[str, str] | None = None) -> TrialSpec:
    argv = [sys.executable, "-c", STANDIN, str(tmp_path / "started"), str(LOG),
            "--factory", "llama3_8b", "-y", *overrides]  # fmt: skip
    space = load_space(EXAMPLE)
    return TrialSpec(
        study="s", trial_number=0, params=space.baseline(), model=space.model.model_dump(),
        semantics=space.semantics.model_dump(), world_size=8, device="cuda",
        metrics_path=str(tmp_path / "metrics.jsonl"),
        workload={"name": "nemo", "launcher": {"recipe": "llama3_8b"},
                  "rendered": {"launcher": "nemo", "argv": argv, "env": env or {},
                               "log_format": "nemo", "world_size": 8}},
    )  # fmt: skip


def test_without_nemo_a_trial_runs_unchecked_and_its_log_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DSE_NEMO_PYTHON", raising=False)
    if nemo_python() is not None:
        pytest.skip("this interpreter has NeMo")
    base = load_space(EXAMPLE).baseline()
    spec = _trial(tmp_path, [*_overrides(base), "model.config.tensor_model_parallel_size=4"])
    out = io.StringIO()
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), out) == 0
    log = out.getvalue()
    said = [ln for ln in log.splitlines() if "resolved-configuration check" in ln]
    assert len(said) == 1 and "no interpreter here has NeMo 2.0" in said[0], log
    assert "fields not checked" in said[0]
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and (tmp_path / "started").exists()
    assert "no interpreter here has NeMo 2.0" in o.metrics["resolved_check"]


def test_a_nemo_interpreter_that_does_not_answer_leaves_the_trial_unchecked(
    tmp_path: Path,
) -> None:
    # the trial's own environment names the interpreter; one that is not there is said
    spec = _trial(tmp_path, ["trainer.devices=8"], env={"DSE_NEMO_PYTHON": str(tmp_path / "no")})
    out = io.StringIO()
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), out) == 0
    assert "the NeMo child" in out.getvalue() and "did not answer" in out.getvalue()
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and "1 fields not checked" in o.metrics["resolved_check"]


def test_check_for_a_nemo_trial_leaves_a_module_of_the_spaces_own(tmp_path: Path) -> None:
    spec = _trial(tmp_path, ["trainer.devices=8"])
    check = check_for(spec, spec.workload["rendered"]["argv"], tmp_path)
    assert check is not None and check.asked == {"trainer.devices": "8"}
    spec.workload["launcher"]["module"] = "my_pretrain"
    assert check_for(spec, spec.workload["rendered"]["argv"], tmp_path) is None
    spec.workload["launcher"] = {"recipe": "llama3_8b", "check_resolved": False}
    assert check_for(spec, spec.workload["rendered"]["argv"], tmp_path) is None


@needs_nemo
def test_a_nemo_trial_whose_override_nemo_overwrites_ends_invalid_naming_it(
    tmp_path: Path,
) -> None:
    base = load_space(EXAMPLE).baseline()
    spec = _trial(tmp_path, [*_overrides(base), "model.config.tensor_model_parallel_size=4"])
    out = io.StringIO()
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), out) == 3
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.failure_class == "invalid"
    # the Megatron-LM check's shape: target, origin, then "field: asked X, resolved Y"
    assert (o.reason or "").startswith("the nemo recipe resolved another configuration")
    assert "model.config.tensor_model_parallel_size: asked 4, resolved 1" in (o.reason or "")
    assert "MegatronStrategy.connect" in (o.reason or "")
    assert "dse: not starting the recipe" in out.getvalue()
    assert not (tmp_path / "started").exists() and o.steps == ()


@needs_nemo
def test_a_nemo_trial_as_asked_runs_and_says_what_was_checked(tmp_path: Path) -> None:
    base = load_space(EXAMPLE).baseline()
    spec = _trial(tmp_path, _overrides(base))
    out = io.StringIO()
    assert run_rendered(spec, MetricsWriter(spec.metrics_path), out) == 0
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.ok and (tmp_path / "started").exists()
    assert "fields as asked" in o.metrics["resolved_check"]
    assert "llm.llama3_8b.pretrain_recipe" in o.metrics["resolved_check"]
