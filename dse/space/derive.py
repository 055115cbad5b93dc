"""Settings derived from other settings, and knobs that do nothing in a layout.

Two facts about a configuration live here, in one place, and every caller gets them through
:class:`dse.space.searchspace.SearchSpace` (``full_params`` applies the derivations,
``apply_conditions``
returns the canonical form):

* **Derived settings** (the space file's ``derived:`` section, ``knob: derivation``). A
  derived knob is set from the parallel layout the way Megatron-Bridge sets it when it
  finalizes a recipe's config, so a space never asks for a combination Bridge would not run
  (``sequence_parallel: true`` with TP 1, say). Where its derivation applies, the derived
  value is what the trial gets (``full_params``) and an explored derived knob is inactive
  there (one configuration, not two). Derivations (:data:`DERIVATIONS`):

  - ``sequence_parallel: bridge`` - off where TP is 1, otherwise the value given (knob or
    ``fixed``). Bridge ``TransformerConfig.finalize()``: ``sequence_parallel`` and
    ``tensor_model_parallel_size <= 1`` -> ``sequence_parallel = False``.
  - ``sequence_parallel: tp_gt_1`` - on exactly when TP > 1 (Bridge's rule applied to a
    recipe that sets it on, as most Bridge recipes with TP > 1 do).
  - ``expert_tensor_parallel_size: bridge`` - 1 where EP > 1 and no value is given
    (``None``), otherwise as given (Megatron-Core then uses TP). Bridge
    ``_set_moe_expert_tensor_parallel_default``.
  - ``tp_comm_overlap: bridge`` - off where TP < 2 or sequence parallelism is off. Bridge
    ``CommOverlapConfig._get_model_comm_overlap_cfgs``.
  - ``overlap_grad_reduce: bridge``, ``overlap_param_gather: bridge`` - with the distributed
    optimizer, on exactly when DP > 1; without it, as given. Bridge
    ``CommOverlapConfig._get_optimizer_overlap_cfgs`` (applied only with the distributed
    optimizer).
  - ``pipeline_model_parallel_layout: bridge_deepseek_v3`` - where no layout is given, the
    layout Bridge's DeepSeek-V3 recipes give the configuration's (PP, VP)
    (:data:`BRIDGE_DEEPSEEK_V3_LAYOUTS`); where Bridge has none for the pair, None (the even
    split, which the rules then judge; a launcher passes it on, so a recipe's own layout
    for another (PP, VP) is not left in place). Bridge
    ``set_deepseek_v3_pipeline_model_parallel_layout`` (recipes/deepseek), which the
    DeepSeek-V3 recipes and the performance launcher's PP / VP overrides call.

* **Inert knobs.** Megatron-Core ignores some knobs in some layouts; two configurations that
  differ only there are the same run. The canonical form puts such a knob at its baseline
  value, so no trial is spent twice and ``best`` cannot flip between twins on noise
  (:data:`INERT`):

  - ``use_distributed_optimizer`` with DP x CP = 1 (and, for MoE, expert-DP = 1): the
    optimizer state is sharded over the data-parallel (x context-parallel) group, here one
    rank, so each rank keeps all of it (Megatron's ``6 + 12/DP`` bytes per parameter is 18,
    the plain optimizer's figure). Not when a setting that needs it is on
    (``overlap_param_gather``, ``use_precision_aware_optimizer``).
  - ``moe_flex_dispatcher_backend`` unless ``moe_token_dispatcher_type`` is ``flex`` (only the
    flex dispatcher reads it).
  - ``cross_entropy_fusion_impl`` unless ``cross_entropy_loss_fusion`` is on (only the fused
    loss reads it).
  - ``moe_token_dispatcher_type`` on a dense model (no MoE layer builds a dispatcher).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dse.space.knobs import IGNORED, KNOBS, ignored_knobs
from dse.space.layout import Layout

__all__ = [
    "Derivation",
    "DERIVATIONS",
    "INERT",
    "BRIDGE_DEEPSEEK_V3_LAYOUTS",
    "derive",
    "forced",
    "inert",
    "ignored",
    "canonical",
]


class SpaceView(Protocol):
    """What the derivations read of a space (:class:`dse.space.searchspace.SearchSpace`, which
    calls
    them: this module does not import it)."""

    @property
    def model(self) -> Any: ...
    @property
    def semantics(self) -> Any: ...
    @property
    def resources(self) -> Any: ...
    @property
    def knobs(self) -> Mapping[str, Any]: ...
    @property
    def fixed(self) -> Mapping[str, Any]: ...
    @property
    def derived(self) -> Mapping[str, str]: ...


def _sizes(space: SpaceView, p: Mapping[str, Any]) -> Layout:
    """The parallel layout the configuration asks for (:class:`dse.space.layout.Layout`)."""
    return Layout.resolve(space.model, space.semantics, space.resources, p)


def _given(p: Mapping[str, Any], name: str) -> Any:
    return p[name] if name in p else KNOBS[name].default


@dataclass(frozen=True)
class Derivation:
    """How one knob is derived.

    Attributes:
        knob: the knob it sets.
        name: its name in a space file's ``derived:`` section.
        description: what it does and where Megatron-Bridge does the same.
        applies: ``applies(params, sizes)``: whether it sets the knob in this configuration
            (``params``: every setting, derivations of earlier knobs applied).
        value: ``value(params, sizes)``: the value it sets where it applies.
        always: it applies in every configuration (the knob cannot also be explored).
    """

    knob: str
    name: str
    description: str
    applies: Callable[[Mapping[str, Any], Layout], bool]
    value: Callable[[Mapping[str, Any], Layout], Any]
    always: bool = False


def _dp_overlap(knob: str) -> Derivation:
    return Derivation(
        knob,
        "bridge",
        "with the distributed optimizer, on exactly when DP > 1; without it, as given "
        "(Megatron-Bridge CommOverlapConfig)",
        lambda p, s: bool(_given(p, "use_distributed_optimizer")),
        lambda p, s: s.dp > 1,
    )


#: Megatron-Bridge's DeepSeek-V3 pipeline layouts by (PP, VP), in Megatron-Core's layout
#: string grammar (:func:`dse.space.layout.parse_pipeline_layout`): the table of Bridge's
#: ``_get_deepseek_v3_pipeline_layout`` (recipes/deepseek/h100/deepseek_v3.py), which
#: ``set_deepseek_v3_pipeline_model_parallel_layout`` applies. (1, 1) is Bridge's own None
#: (one stage, no layout). For a pair outside the table Bridge's function raises and catches
#: its ValueError and leaves the field as it was: None in a recipe that set none, a recipe's
#: own layout otherwise (which Megatron-Core then refuses for another (PP, VP); CloudAI's
#: MegatronBridge constraint keeps a DeepSeek-V3 test's (PP, VP) among these keys).
#:
#: Bridge ends the last stage with ``["mtp"] * mtp_num_layers + ["loss"]``; dse's DeepSeek-V3
#: (dse/space/catalog/models/deepseek_v3.yaml) has no multi-token-prediction layer, so these
#: are Bridge's layouts with ``mtp_num_layers`` 0: no ``m`` before the ``L`` (a layout with
#: ``m`` is refused for a model without MTP layers, :mod:`dse.space.layout`). The layouts place
#: DeepSeek-V3's 61 decoder layers; for a model of another depth the rules refuse them, as
#: Megatron-Core would.
BRIDGE_DEEPSEEK_V3_LAYOUTS: dict[tuple[int, int], str | None] = {
    (1, 1): None,
    (4, 1): "Et*16|t*16|t*16|t*13L",
    (8, 1): "Et*8|(t*8|)*6t*5L",
    (4, 2): "Et*8|(t*8|)*6t*5L",
    (16, 1): "Et*4|(t*4|)*14tL",
    (8, 2): "Et*4|(t*4|)*14tL",
    (4, 4): "Et*4|(t*4|)*14tL",
}


def _bridge_dsv3_layout(s: Layout) -> str | None:
    """The layout Bridge's DeepSeek-V3 recipe gives (PP, VP) (VP unset counts as 1, as in
    Bridge); None where it has none."""
    return BRIDGE_DEEPSEEK_V3_LAYOUTS.get((s.pp, s.vpp or 1))


#: knob -> derivation name -> derivation, in the order they are applied.
DERIVATIONS: dict[str, dict[str, Derivation]] = {
    "sequence_parallel": {
        "bridge": Derivation(
            "sequence_parallel",
            "bridge",
            "off where TP is 1, else as given (Megatron-Bridge TransformerConfig.finalize)",
            lambda p, s: s.tp <= 1,
            lambda p, s: False,
        ),
        "tp_gt_1": Derivation(
            "sequence_parallel",
            "tp_gt_1",
            "on exactly when TP > 1 (Megatron-Bridge's rule on a recipe that turns it on)",
            lambda p, s: True,
            lambda p, s: s.tp > 1,
            always=True,
        ),
    },
    "expert_tensor_parallel_size": {
        "bridge": Derivation(
            "expert_tensor_parallel_size",
            "bridge",
            "1 where EP > 1 and no value is given, else as given (Megatron-Bridge "
            "_set_moe_expert_tensor_parallel_default; Megatron-Core's default is TP)",
            lambda p, s: s.ep > 1 and _given(p, "expert_tensor_parallel_size") is None,
            lambda p, s: 1,
        ),
    },
    "tp_comm_overlap": {
        "bridge": Derivation(
            "tp_comm_overlap",
            "bridge",
            "off where TP < 2 or sequence parallelism is off, else as given "
            "(Megatron-Bridge CommOverlapConfig)",
            lambda p, s: s.tp < 2 or not _given(p, "sequence_parallel"),
            lambda p, s: False,
        ),
    },
    "overlap_grad_reduce": {"bridge": _dp_overlap("overlap_grad_reduce")},
    "overlap_param_gather": {"bridge": _dp_overlap("overlap_param_gather")},
    "pipeline_model_parallel_layout": {
        "bridge_deepseek_v3": Derivation(
            "pipeline_model_parallel_layout",
            "bridge_deepseek_v3",
            "where no layout is given, the one Megatron-Bridge's DeepSeek-V3 recipe gives the "
            "(PP, VP) pair (set_deepseek_v3_pipeline_model_parallel_layout, without the MTP "
            "layer dse's model lacks); none where Bridge has none for the pair (the even split)",
            lambda p, s: _given(p, "pipeline_model_parallel_layout") in (None, ""),
            lambda p, s: _bridge_dsv3_layout(s),
        ),
    },
}


def derive(space: SpaceView, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` (every setting: fixed and knob values) with the space's derivations
    applied, in :data:`DERIVATIONS` order."""
    out = dict(params)
    if not space.derived:
        return out
    s = _sizes(space, out)
    for knob, table in DERIVATIONS.items():
        name = space.derived.get(knob)
        if name is None:
            continue
        d = table[name]
        if d.applies(out, s):
            out[knob] = d.value(out, s)
    return out


def forced(space: SpaceView, knob: str, params: Mapping[str, Any]) -> bool:
    """Whether the space's derivation of ``knob`` sets it in this configuration (``params``:
    fixed and knob values, before derivation)."""
    name = space.derived.get(knob)
    if name is None:
        return False
    full = {**space.fixed, **params}
    # the derivations of the knobs before this one are in effect
    before: dict[str, Any] = dict(full)
    s = _sizes(space, full)
    for k, table in DERIVATIONS.items():
        if k == knob:
            return table[name].applies(before, s)
        n = space.derived.get(k)
        if n is not None and table[n].applies(before, s):
            before[k] = table[n].value(before, s)
    return False  # pragma: no cover - every derivable knob is in DERIVATIONS


def _distopt_inert(space: SpaceView, p: Mapping[str, Any], s: Layout) -> bool:
    if s.dp * s.cp != 1 or p.get("overlap_param_gather") or p.get("use_precision_aware_optimizer"):
        return False
    return space.model.num_moe_experts is None or s.edp == 1  # experts: expert-DP too


def _ignored_rule(
    fn: Callable[[Mapping[str, Any]], bool],
) -> Callable[[SpaceView, Mapping[str, Any], Layout], bool]:
    return lambda sp, p, s: fn(p)


#: knob -> ``inert(space, effective params, layout)``: Megatron-Core ignores the knob there.
#: The knobs Megatron-Core does not read under the others' values
#: (:data:`dse.space.knobs.IGNORED`) are among them.
INERT: dict[str, Callable[[SpaceView, Mapping[str, Any], Layout], bool]] = {
    "use_distributed_optimizer": _distopt_inert,
    **{name: _ignored_rule(fn) for name, fn in IGNORED.items()},
    "moe_token_dispatcher_type": lambda sp, p, s: sp.model.num_moe_experts is None,
}


def ignored(space: SpaceView, params: Mapping[str, Any]) -> set[str]:
    """The knobs of ``params`` (a configuration's knob and fixed values, derivations applied)
    that Megatron-Core does not read there: :func:`dse.space.knobs.ignored_knobs`, and on a
    dense model every MoE-only knob but the expert parallel sizes (no MoE layer reads it;
    the sizes still shape the layout Megatron checks)."""
    out = ignored_knobs(params)
    if space.model.num_moe_experts is None:
        sizes = ("expert_model_parallel_size", "expert_tensor_parallel_size")
        out |= {n for n in params if n in KNOBS and KNOBS[n].moe_only and n not in sizes}
    return out


def inert(space: SpaceView, knob: str, params: Mapping[str, Any]) -> bool:
    """Whether Megatron-Core ignores ``knob`` in this configuration (see :data:`INERT`)."""
    fn = INERT.get(knob)
    if fn is None:
        return False
    eff = derive(space, {**space.fixed, **params})
    return fn(space, eff, _sizes(space, eff))


def canonical(
    space: SpaceView,
    params: Mapping[str, Any],
    inactive: Callable[[str], Any],
    settable: Iterable[str] | None = None,
) -> dict[str, Any]:
    """``params`` (every knob) with each knob that a derivation sets here at the derived
    value (its ``inactive`` value when that is outside its domain) and each inert knob at its
    ``inactive`` value. Used by :meth:`dse.space.searchspace.SearchSpace.apply_conditions`.

    ``settable``: the space's knobs that are derived or in :data:`INERT`, in the order of
    ``space.knobs`` (found once by a caller that canonicalizes many configurations; None:
    found here)."""
    out = dict(params)
    names = (
        tuple(n for n in space.knobs if n in space.derived or n in INERT)
        if settable is None
        else tuple(settable)
    )
    if not names:
        return out
    for _ in range(3):  # a change can make another knob inert (ETP -> expert-DP); settles fast
        changed = False
        eff = derive(space, {**space.fixed, **out})
        s = _sizes(space, eff)
        for name in names:
            spec = space.knobs[name]
            if name in space.derived and forced(space, name, out):
                want = eff[name]
                if not any(type(want) is type(v) and want == v for v in spec.values()):
                    want = inactive(name)
            elif name in INERT and INERT[name](space, eff, s):
                want = inactive(name)
            else:
                continue
            if not (type(out.get(name)) is type(want) and out.get(name) == want):
                out[name] = want
                changed = True
        if not changed:
            break
    return out
