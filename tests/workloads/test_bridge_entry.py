"""dse's Bridge entry script on a trial: the mixed-precision field emitted with the knob, the
configuration read back after runtime_config_update, a recipe that overwrites a knob failing
the trial ``invalid`` naming the field. Bridge itself does not import on this machine (it needs
transformers and Transformer Engine): the recipe here runs on the stand-in of
tests/workloads/bridge_standin (Bridge 0.6's order of overrides, runtime_config_update and
MixedPrecisionConfig.setup); bench/bridge_node.sh runs the same entry on the real Bridge."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from dse.core.records import MetricsWriter, TrialSpec, read_metrics
from dse.space.searchspace import parse_space
from dse.workloads.launchers import launcher_for
from dse.workloads.launchers.bridge import ENTRY_FILE, RUN_RECIPE
from dse.workloads.launchers.resolved import RESOLVED_FILE
from dse.workloads.launchers.run import run_rendered

STANDIN = Path(__file__).resolve().parent / "bridge_standin"


def _space(recipe: str = "omni_like", **launcher: object) -> object:
    data = {
        "version": 1, "study": "bridge-entry", "recipe": "stand-in Bridge recipe",
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                  "ffn_hidden_size": 128, "vocab_size": 1024},
        "semantics": {"global_batch_size": 8, "seq_length": 64, "steps": 4, "warmup_steps": 1,
                      "precision": "bf16", "lr": 1e-4, "data": {"kind": "synthetic"}},
        "resources": {"world_size": 1, "device": "cpu", "features": []},
        "knobs": {"grad_reduce_in_fp32": {"type": "bool", "baseline": True},
                  "micro_batch_size": {"values": [1, 2], "baseline": 1}},
        "objective": {"metric": "tflops_per_gpu", "direction": "maximize"},
        "budget": {"n_trials": 2},
        "workload": {"name": "bridge", "launcher": {
            "recipe": recipe, "script": str(STANDIN / "run_recipe.py"), "python": sys.executable,
            **launcher}},
    }  # fmt: skip
    return parse_space(data, "bridge-entry")


def _run(space, params, tmp_path: Path, argv=None):  # type: ignore[no-untyped-def]
    r = launcher_for(space).render(space.full_params(params), python=sys.executable)
    rendered = r.to_dict()
    if argv is not None:
        rendered["argv"] = argv
    spec = TrialSpec(
        study="s", trial_number=0, params=space.full_params(params),
        model=space.model.model_dump(), semantics=space.semantics.model_dump(), world_size=1,
        device="cpu", metrics_path=str(tmp_path / "metrics.jsonl"),
        workload={"name": "bridge", "launcher": space.workload.launcher.model_dump(),
                  "rendered": rendered},
    )  # fmt: skip
    out = io.StringIO()
    rc = run_rendered(spec, MetricsWriter(spec.metrics_path), out)
    return rc, read_metrics(spec.metrics_path), rendered, out.getvalue()


def test_default_script_is_the_containers_bridge_checkout_absolute() -> None:
    """Issue item 2: trials start in their own folder; the script path is absolute."""
    space = _space(script=None)
    argv = launcher_for(space).render(space.full_params(space.baseline())).argv  # type: ignore[attr-defined]
    assert RUN_RECIPE == "/opt/Megatron-Bridge/scripts/training/run_recipe.py"
    assert argv[argv.index("--script") + 1] == RUN_RECIPE
    space = _space(script=None, check_resolved=False)
    argv = launcher_for(space).render(space.full_params(space.baseline())).argv  # type: ignore[attr-defined]
    assert RUN_RECIPE in argv and ENTRY_FILE not in argv  # plain Bridge command, still absolute


def test_the_knob_lands_on_the_mixed_precision_config_and_resolves_as_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue item 1: grad_reduce_in_fp32 is also given as mixed_precision.grad_reduce_in_fp32,
    which runtime_config_update copies onto the DDP config; the check reads it back."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(STANDIN))  # the stand-in Bridge, as the image has it
    space = _space()
    rc, o, rendered, log = _run(space, space.baseline(), tmp_path)  # type: ignore[attr-defined]
    assert "ddp.grad_reduce_in_fp32=true" in rendered["argv"]
    assert "mixed_precision.grad_reduce_in_fp32=true" in rendered["argv"]
    assert rc == 0, log
    assert o is not None and o.ok
    assert "fields as asked" in o.metrics["resolved_check"]
    fields = json.loads((tmp_path / RESOLVED_FILE).read_text())["fields"]
    assert fields["ddp.grad_reduce_in_fp32"] is True
    assert fields["mixed_precision.grad_reduce_in_fp32"] is True
    assert (tmp_path / ENTRY_FILE).is_file()  # the trial process placed the entry script
    assert o.metrics["step_time_s"] == pytest.approx(0.1)


def test_a_recipe_that_overwrites_a_knob_fails_the_trial_invalid_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is the capability: the same trial without the mixed-precision field (the
    command dse rendered before) runs with the recipe's bf16 reduction and is refused."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(STANDIN))  # the stand-in Bridge, as the image has it
    space = _space()
    r = launcher_for(space).render(space.full_params(space.baseline()), python=sys.executable)  # type: ignore[attr-defined]
    old = [a for a in r.argv if not a.startswith("mixed_precision.")]
    rc, o, _rendered, log = _run(space, space.baseline(), tmp_path, argv=old)  # type: ignore[attr-defined]
    assert rc == 3, log
    assert o is not None and o.failure_class == "invalid"
    assert "ddp.grad_reduce_in_fp32: asked True, resolved False" in (o.reason or "")
    assert "bridge recipe resolved another configuration" in (o.reason or "")


def test_a_preset_string_is_resolved_before_its_fields_are_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe naming its mixed precision by a preset (``mixed_precision: bf16_mixed``,
    fp32 reduction on): the entry resolves the preset with Bridge's own function first, so
    grad_reduce_in_fp32=false is not undone."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(STANDIN))  # the stand-in Bridge, as the image has it
    space = _space("preset_like")
    params = {**space.baseline(), "grad_reduce_in_fp32": False}  # type: ignore[attr-defined]
    rc, o, _rendered, log = _run(space, params, tmp_path)
    assert rc == 0, log
    fields = json.loads((tmp_path / RESOLVED_FILE).read_text())["fields"]
    assert fields["ddp.grad_reduce_in_fp32"] is False and fields["model.bf16"] is True


def test_validate_reports_a_knob_the_recipe_overwrites_where_it_resolves_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where Bridge imports on the controller, dse validate resolves the recipe for every
    rendering it checks and names a field the recipe overwrites: without the mixed-precision
    field (the plain Bridge command) the recipe's bf16 reduction undoes the knob."""
    from dse.core.exceptions import SpaceError
    from dse.workloads.launchers import check_launcher

    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("PYTHONPATH", str(STANDIN))
    with pytest.raises(SpaceError) as e:
        check_launcher(_space("omni_like_config", script=None, check_resolved=False))
    assert "the recipe overwrites ddp.grad_reduce_in_fp32: asked True, resolved False" in str(
        e.value
    )
    assert check_launcher(_space("omni_like_config", script=None)) > 0  # as dse renders it
