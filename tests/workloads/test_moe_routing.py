"""Declared means applied: ``semantics.moe_routing`` reaches every workload or is refused by
name. The recipe launchers render it with the semantics (Megatron-LM flags, Bridge
``model.<field>``, NeMo ``model.config.<field>``), each name one the pinned upstream tool
has; the built-in trainer passes it to ``TransformerConfig``; the sim accepts it as
semantics that changes no estimate (only the simulated loss curve's seed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.core.exceptions import SpaceError
from dse.core.records import TrialSpec
from dse.space.searchspace import MoeRouting, SearchSpace, parse_space
from dse.workloads.launchers import NotTaken, check_launcher, launcher_for
from dse.workloads.launchers import megatron_lm as mlm
from dse.workloads.launchers.bridge import hydra_value
from dse.workloads.launchers.nemo import python_value
from tests.conftest import EXAMPLES, needs_megatron
from tests.workloads import upstream

#: Every field away from its default (a combination TransformerConfig accepts).
ROUTING: dict[str, Any] = {
    "moe_router_load_balancing_type": "seq_aux_loss",
    "moe_aux_loss_coeff": 1e-05,
    "moe_router_score_function": "sigmoid",
    "moe_router_topk_scaling_factor": 2.5,
    "moe_router_enable_expert_bias": True,
    "moe_router_dtype": "fp64",
    "moe_router_force_load_balancing": True,
    "moe_expert_capacity_factor": 1.25,
    "moe_pad_expert_input_to_capacity": True,
}
LAUNCHERS = ("megatron_lm", "bridge", "nemo")


def _space(launcher: str, routing: dict[str, Any] | None = ROUTING, **spec: Any) -> SearchSpace:
    """The MoE proxy example (a Megatron-Core MoE model) through ``launcher``."""
    data = yaml.safe_load((EXAMPLES / "moe_proxy_h200.yaml").read_text())
    if routing is not None:
        data["semantics"]["moe_routing"] = routing
    data["workload"] = {"name": launcher, "launcher": {"recipe": "moe_recipe", **spec}}
    return parse_space(data, "moe_routing")


def _argv(space: SearchSpace) -> list[str]:
    params = {**space.full_params(space.baseline()), "attention_backend": "flash"}
    return launcher_for(space).render(params).argv


def test_every_field_is_set_away_from_its_default() -> None:
    assert set(ROUTING) == set(MoeRouting.model_fields)
    assert all(v != MoeRouting.model_fields[f].default for f, v in ROUTING.items())
    MoeRouting.model_validate(ROUTING)


def _expected(launcher: str) -> list[list[str]]:
    """The words each routing field renders as, on ``launcher``."""
    if launcher == "bridge":
        return [[f"model.{f}={hydra_value(v)}"] for f, v in ROUTING.items()]
    if launcher == "nemo":
        return [[f"model.config.{f}={python_value(v)}"] for f, v in ROUTING.items()]
    out = []
    for f, v in ROUTING.items():
        flag = mlm.ROUTING_FLAG_OF_FIELD[f]
        out.append([flag] if v is True else [flag, str(v)])
    return out


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_each_launcher_renders_every_routing_field(launcher: str) -> None:
    argv = _argv(_space(launcher))
    for words in _expected(launcher):
        i = argv.index(words[0])
        assert argv[i : i + len(words)] == words, (words, argv[i : i + 3])
    assert upstream.problems(launcher, argv) == []
    if launcher == "nemo":
        assert upstream.nemo_problems(argv)[1] == []


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_no_routing_renders_nothing(launcher: str) -> None:
    """Without ``semantics.moe_routing`` the recipe's routing stands: nothing is rendered."""
    argv = _argv(_space(launcher, routing=None))
    assert not [a for a in argv if "moe_router_load" in a or "moe-router-load" in a]
    assert not [a for a in argv if "aux_loss_coeff" in a or "aux-loss-coeff" in a]


@pytest.mark.parametrize("launcher", ["bridge", "nemo"])
def test_a_recipes_own_routing_is_overridden_at_the_defaults_too(launcher: str) -> None:
    """A Bridge or NeMo recipe sets its own routing (a provider's sigmoid router): every
    declared field is given, also at Megatron's default (None, False)."""
    argv = _argv(_space(launcher, routing={}))
    value = hydra_value if launcher == "bridge" else python_value
    prefix = "model." if launcher == "bridge" else "model.config."
    for f, info in MoeRouting.model_fields.items():
        assert f"{prefix}{f}={value(info.default)}" in argv


def test_megatron_lm_gives_values_at_their_default_and_nothing_for_none_or_off() -> None:
    """Megatron-LM's arguments default to Megatron's TransformerConfig defaults: a value is
    given (pinned), None or a switch off has no flag and is that default."""
    assert mlm.routing_flags(MoeRouting()) == [
        "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "0.0",
        "--moe-router-score-function", "softmax",
    ]  # fmt: skip
    assert mlm.routing_flags(None) == []


def test_megatron_lm_renders_the_routing_without_the_model_flags() -> None:
    """``model_args: false`` (the recipe's arguments give the model): the declared routing
    is applied all the same."""
    space = _space("megatron_lm", model_args=False, args=["--num-layers", "8"])
    argv = _argv(space)
    assert "--hidden-size" not in argv
    assert argv[argv.index("--moe-router-dtype") + 1] == "fp64"
    assert "--moe-pad-expert-input-to-capacity" in argv


def test_megatron_lm_refuses_a_routing_flag_from_the_base_args() -> None:
    """A routing flag the declared routing leaves out (None, off) cannot come from the base
    args either: the routing is the semantics section's."""
    space = _space("megatron_lm", routing={}, args=["--moe-expert-capacity-factor", "1.0"])
    with pytest.raises(SpaceError, match=r"--moe-expert-capacity-factor.*moe_routing"):
        _argv(space)
    space = _space("megatron_lm", args=["--moe-router-dtype", "fp32"])  # given twice
    with pytest.raises(SpaceError, match="--moe-router-dtype"):
        _argv(space)


def test_the_builtin_trainers_megatron_lm_entry_reads_the_routing_back() -> None:
    """``-m dse.workloads.megatron.mlm`` takes the routing flags into its semantics."""
    space = _space("megatron_lm", module=mlm.BUILTIN_MODULE)
    argv = _argv(space)
    _model, sem, _knobs = mlm.parse_megatron_args(argv[argv.index(mlm.BUILTIN_MODULE) + 1 :])
    assert sem["moe_routing"] == ROUTING
    _model, sem, _knobs = mlm.parse_megatron_args(
        argv[argv.index(mlm.BUILTIN_MODULE) + 1 :][:4]  # no routing flag: Megatron's defaults
    )
    assert "moe_routing" not in sem


def test_a_field_a_target_has_no_name_for_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every routing field has a name on every target today; one without (here: Megatron-LM
    losing its ``--moe-router-dtype``) is refused naming the field, at render and at
    ``dse validate``, and passes at its default (Megatron-LM's own)."""
    table = dict(mlm.ROUTING_FLAG_OF_FIELD)
    del table["moe_router_dtype"]
    monkeypatch.setattr(mlm, "ROUTING_FLAG_OF_FIELD", table)
    space = _space("megatron_lm")
    with pytest.raises(NotTaken) as e:
        _argv(space)
    assert e.value.knob == "semantics.moe_routing.moe_router_dtype" and e.value.value == "fp64"
    with pytest.raises(SpaceError) as err:
        check_launcher(space, "s.yaml")
    lines = str(err.value).splitlines()
    assert [ln for ln in lines if "moe_router_dtype" in ln] == [
        "s.yaml: semantics.moe_routing.moe_router_dtype: the megatron_lm recipe cannot take "
        "semantics.moe_routing.moe_router_dtype='fp64': no Megatron-LM argument sets "
        "moe_router_dtype"
    ]
    assert "--moe-router-dtype" not in _argv(_space("megatron_lm", routing={}))


# --- the built-in trainer ------------------------------------------------------------------


def _trainer_spec(tmp_path: Path, routing: dict[str, Any] | None) -> TrialSpec:
    model = {
        "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128,
        "vocab_size": 1024, "num_moe_experts": 4, "moe_router_topk": 2,
    }  # fmt: skip
    sem: dict[str, Any] = {"global_batch_size": 4, "seq_length": 32, "steps": 3,
                           "warmup_steps": 1, "precision": "fp32"}  # fmt: skip
    if routing is not None:
        sem["moe_routing"] = routing
    return TrialSpec(
        study="t", trial_number=0, params={}, model=model, semantics=sem, world_size=1,
        device="cpu", metrics_path=str(tmp_path / "m.jsonl"),
    )  # fmt: skip


@needs_megatron
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_the_builtin_trainers_transformer_config_receives_the_routing(tmp_path: Path) -> None:
    import dataclasses

    from megatron.core.transformer.transformer_config import TransformerConfig

    from dse.workloads.megatron._plan import make_plan
    from dse.workloads.megatron.trainer import transformer_config_kwargs

    kw = transformer_config_kwargs(make_plan(_trainer_spec(tmp_path, ROUTING), []))
    assert {f: kw[f] for f in ROUTING} == ROUTING
    assert set(ROUTING) <= {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = transformer_config_kwargs(make_plan(_trainer_spec(tmp_path, None), []))
    assert not set(ROUTING) & set(kw)  # None: Megatron's defaults


# --- the sim -------------------------------------------------------------------------------


def test_the_sim_takes_the_routing_as_semantics_that_changes_no_estimate(
    tmp_path: Path,
) -> None:
    from dse.workloads import sim

    lines = {}
    for name, routing in (("none", None), ("set", ROUTING)):
        spec = _trainer_spec(tmp_path, routing).model_copy(update={"device": "cuda"})
        lines[name] = [x.model_dump() for x in sim.simulate(spec, "NVIDIA H200", 139.8)]
    drop = {"loss", "losses", "loss_model"}
    strip = [{k: v for k, v in x.items() if k not in drop} for x in lines["none"]]
    assert strip == [{k: v for k, v in x.items() if k not in drop} for x in lines["set"]]
    # the routing defines the training: another simulated loss curve
    assert [x.get("loss") for x in lines["none"]] != [x.get("loss") for x in lines["set"]]
