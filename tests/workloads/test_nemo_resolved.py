"""dse's NeMo 2.0 overrides resolved by the real NeMo (``launchers.nemo_installed``).

The NeMo tests run where an interpreter has NeMo 2.0 (nemo-toolkit 2.7.3 with its LLM
collection: ``DSE_NEMO_PYTHON=/path/to/python``, see docs/interop.md); elsewhere they skip,
naming that. The answer without NeMo is checked everywhere."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dse.model.rules import check
from dse.space.searchspace import load_space
from dse.workloads.launchers._core import launcher_for
from dse.workloads.launchers.nemo_installed import mismatch_reasons, nemo_python, resolve

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
