"""launch_flags: every catalog knob value on every recipe target renders or is refused by
name, and the flags of a trial are the knob and environment part of its launch command."""

from __future__ import annotations

import pytest
import yaml

from dse.space.knobs import KNOBS
from dse.space.searchspace import parse_space
from dse.workloads.launchers import NotTaken, launcher_for
from dse.workloads.launchers.flags import TARGETS, launch_flags
from tests.conftest import EXAMPLES


def _space(name: str):  # type: ignore[no-untyped-def]
    return parse_space(yaml.safe_load((EXAMPLES / name).read_text()), name)


MOE = _space("qwen3_30b_a3b.yaml")


def _values(k) -> list:  # type: ignore[no-untyped-def]
    if k.kind == "bool":
        return [True, False]
    if k.kind == "choice":
        return list(k.choices)
    if k.kind == "int":
        return sorted({k.default if k.default is not None else k.min_value, 2})
    return [k.default if k.default is not None else 1]


CASES = [(n, v, t) for n, k in KNOBS.items() for v in _values(k) for t in TARGETS]


@pytest.mark.parametrize(("knob", "value", "target"), CASES)
def test_every_knob_value_renders_or_is_refused_by_name(knob: str, value: object, target: str):
    params = {knob: value}
    if knob == "virtual_pipeline_model_parallel_size":
        params["pipeline_model_parallel_size"] = 2
    if knob == "moe_flex_dispatcher_backend":
        params["moe_token_dispatcher_type"] = "flex"
    try:
        out = launch_flags(MOE, params, target)
    except NotTaken as e:
        assert e.knob == knob and e.why, (knob, value, target, str(e))
        return
    assert isinstance(out.args, list) and isinstance(out.env, dict)
    if knob.startswith("env."):
        assert out.env.get(knob[4:]) == str(int(value) if isinstance(value, bool) else value)


@pytest.mark.parametrize(
    "name", ["qwen3_30b_a3b.yaml", "llama3_8b.yaml", "llama3_8b_megatron_lm.yaml",
             "nemotron_omni.yaml"],
)  # fmt: skip
def test_flags_are_the_knob_and_env_part_of_the_launch_command(name: str) -> None:
    space = _space(name)
    for params in (space.baseline(), *list(space.iter_configs(max_combinations=6))[:3]):
        full = space.full_params(params)
        r = launcher_for(space).render(full)
        f = launch_flags(space, full, space.workload.name)
        assert r.argv[len(r.argv) - len(f.args) :] == f.args  # the command ends with them
        assert all(r.env[k] == v for k, v in f.env.items())


def test_a_value_the_target_cannot_express_names_the_nearest_upstream_setting() -> None:
    with pytest.raises(NotTaken) as e:
        launch_flags(MOE, {"attention_backend": "sdpa"}, "megatron_lm")
    assert e.value.knob == "attention_backend" and "use flash/fused/te" in e.value.why
    assert launch_flags(MOE, {"attention_backend": "sdpa"}, "builtin").args  # dse's own
    with pytest.raises(ValueError, match="unknown recipe target"):
        launch_flags(MOE, {}, "torchtitan")


def test_megatron_fsdp_renders_where_the_target_runs_it_and_is_refused_elsewhere(
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    """use_megatron_fsdp: Megatron-LM's switch with the checkpoint format its validate_args
    asserts, Bridge's ddp field; NeMo (its strategy's fsdp argument) and dse's built-in
    trainer (Megatron-Core's DDP wrapper) refuse it by name, in the launcher and in the
    trial process alike."""
    from dse.core.records import TrialSpec
    from dse.workloads.megatron._plan import TrialFailure, make_plan

    on = {"use_megatron_fsdp": True, "use_distributed_optimizer": True}
    mlm = launch_flags(MOE, on, "megatron_lm").args
    i = mlm.index("--use-megatron-fsdp")
    assert mlm[i : i + 3] == ["--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor"]
    assert "ddp.use_megatron_fsdp=true" in launch_flags(MOE, on, "bridge").args
    sharded = {**on, "data_parallel_sharding_strategy": "optim_grads_params"}
    args = launch_flags(MOE, sharded, "megatron_lm").args
    i = args.index("--data-parallel-sharding-strategy")
    assert args[i + 1] == "optim_grads_params"
    for target in ("nemo", "builtin"):
        with pytest.raises(NotTaken) as e:
            launch_flags(MOE, on, target)
        assert e.value.knob == "use_megatron_fsdp"
    assert (
        "--use-megatron-fsdp"
        not in launch_flags(MOE, {"use_megatron_fsdp": False}, "builtin").args
    )
    spec = TrialSpec(
        study="s", trial_number=0, params=on, model=MOE.model.model_dump(),
        semantics=MOE.semantics.model_dump(), world_size=1, device="cpu",
        metrics_path=str(tmp_path / "m.jsonl"), features=[],
    )  # fmt: skip
    with pytest.raises(TrialFailure, match="use_megatron_fsdp=True: dse's built-in trainer"):
        make_plan(spec, None)
