"""Each validity rule against the Megatron-Core source line it encodes (issue 40).

A rule of :mod:`dse.model.rules` mirrors a check Megatron makes at build time. These tests read
the installed Megatron-Core (0.16.1) source to show the check is still there, then show the rule
rejects the configuration the check refuses and accepts the one it lets through: both halves of
a conjunction, each on its own. The last test keeps the catalog honest: a knob that sets a field
Megatron-Core's config classes constrain (an ``assert`` or a ``raise`` in their
``__post_init__``) needs a rule that reads it, or a written reason why none is needed.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import inspect
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from dse.model.rules import RULES, check
from dse.space.knobs import KNOBS, FieldAssignment, Knob
from dse.space.searchspace import parse_space


def _mcore_root() -> Path:
    spec = importlib.util.find_spec("megatron.core")  # found, not imported (no torch)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core is not installed (extra 'megatron')")
    return Path(next(iter(spec.submodule_search_locations)))


def _source(rel: str) -> str:
    return (_mcore_root() / rel).read_text()


def _squash(text: str) -> str:
    """The text with all whitespace removed (a line Megatron re-wraps is still found)."""
    return "".join(text.split())


def _space(tiny: dict, knobs: dict[str, Any], **sections: dict[str, Any]) -> Any:
    """The tiny space with ``knobs`` added and ``sections`` (``model``, ``resources``)
    updated."""
    d = copy.deepcopy(tiny)
    d["knobs"].update(knobs)
    for name, fields in sections.items():
        d[name].update(fields)
    return parse_space(d)


def _fired(space: Any, params: dict[str, Any], features: list[str] | None = None) -> list[str]:
    return [v.rule for v in check(space, params, features)]


_BOOL = {"type": "bool"}

# A violation's name (``Violation.rule``) -> (Megatron-Core file, the line(s) it encodes, knobs
# of the space, a configuration it refuses, one it accepts).
SOURCES: dict[str, tuple[str, str, dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "sp_needs_tp": (
        "model_parallel_config.py",
        "if self.sequence_parallel:\n"
        "    if self.tensor_model_parallel_size <= 1:\n"
        '        raise ValueError("Cannot use sequence parallelism without tensor parallelism")',
        {"sequence_parallel": _BOOL},
        {"sequence_parallel": True, "tensor_model_parallel_size": 1},
        {"sequence_parallel": True, "tensor_model_parallel_size": 2},
    ),
    "precision_aware_optimizer": (
        "optimizer/optimizer_config.py",
        "assert (\n    self.use_distributed_optimizer\n"
        "), '--use-precision-aware-optimizer only supported with distributed optimizer'",
        {"use_precision_aware_optimizer": _BOOL},
        {"use_precision_aware_optimizer": True, "use_distributed_optimizer": False},
        {"use_precision_aware_optimizer": True, "use_distributed_optimizer": True},
    ),
    "fp8": (
        "transformer/transformer_config.py",
        "if self.fp8_param and not self.fp8:\n"
        '    raise ValueError("fp8_param must be used together with fp8 mode.")',
        {"fp8_param": _BOOL, "fp8": {"values": [None, "e4m3"]}},
        {"fp8_param": True, "fp8": None},
        {"fp8_param": True, "fp8": "e4m3"},
    ),
    "overlap_param_gather": (
        # The param all-gather is overlapped by a forward pre-hook that Megatron-Core installs
        # only with the distributed optimizer (the first half of the rule).
        "distributed/distributed_data_parallel.py",
        "self.use_forward_hook = (\n"
        "    self.ddp_config.use_distributed_optimizer and self.ddp_config.overlap_param_gather\n"
        ")",
        {"overlap_param_gather": _BOOL, "overlap_grad_reduce": _BOOL},
        {
            "overlap_param_gather": True,
            "overlap_grad_reduce": True,
            "use_distributed_optimizer": False,
        },
        {
            "overlap_param_gather": True,
            "overlap_grad_reduce": True,
            "use_distributed_optimizer": True,
        },
    ),  # fmt: skip
    "heads_tp": (
        "transformer/transformer_config.py",
        "if self.num_attention_heads % self.tensor_model_parallel_size != 0:",
        {"tensor_model_parallel_size": {"values": [1, 2, 4]}},
        {"tensor_model_parallel_size": 4},  # 2 heads
        {"tensor_model_parallel_size": 2},
    ),
    "ep_needs_moe": (
        "transformer/transformer_config.py",
        "if self.expert_model_parallel_size > 1 and self.num_moe_experts is None:\n"
        '    raise ValueError("num_moe_experts must be non None to use expert-parallel.")',
        {"expert_model_parallel_size": {"values": [1, 2]}},
        {"expert_model_parallel_size": 2},  # a dense model
        {"expert_model_parallel_size": 1},
    ),
}

#: The sections of the tiny space a rule's case changes (the rest is the tiny space's).
SECTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "heads_tp": {
        "model": {"num_attention_heads": 2, "num_query_groups": 2},
        "resources": {"world_size": 4},
    },
}


@pytest.mark.parametrize("rule", sorted(SOURCES))
def test_each_rule_encodes_a_megatron_core_line_still_there(
    rule: str, tiny_space_dict: dict
) -> None:
    rel, line, knobs, refused, accepted = SOURCES[rule]
    assert _squash(line) in _squash(_source(rel)), f"{rel} no longer has: {line}"
    space = _space(tiny_space_dict, knobs, **SECTIONS.get(rule, {}))
    te = ["transformer_engine"]  # a TE norm: the sequence-parallel rule's other condition
    assert rule in _fired(space, refused, te), (rule, refused)
    assert rule not in _fired(space, accepted, te), (rule, accepted)


def test_overlap_param_gather_needs_both_the_distributed_optimizer_and_overlap_grad_reduce(
    tiny_space_dict: dict,
) -> None:
    """Megatron-LM's validate_args (megatron/training/arguments.py, not part of the
    megatron-core wheel) asserts both: ``--overlap-param-gather only supported with
    distributed optimizer`` and ``Must use --overlap-param-gather with --overlap-grad-reduce``.
    Megatron-Core's side of the second: without overlap_grad_reduce the DDP wrapper makes a
    single bucket (bucket_size None), so there is no next bucket's all-gather to overlap."""
    ddp = _source("distributed/distributed_data_parallel.py")
    one_bucket = "if not ddp_config.overlap_grad_reduce:\n    ddp_config.bucket_size = None"
    assert _squash(one_bucket) in _squash(ddp)
    space = _space(tiny_space_dict, {"overlap_param_gather": _BOOL, "overlap_grad_reduce": _BOOL})
    on = {"overlap_param_gather": True}
    for dist in (False, True):
        for grad in (False, True):
            fired = _fired(space, {**on, "use_distributed_optimizer": dist,
                                   "overlap_grad_reduce": grad})  # fmt: skip
            assert ("overlap_param_gather" in fired) is not (dist and grad), (dist, grad, fired)
            off = {"overlap_param_gather": False, "use_distributed_optimizer": dist,
                   "overlap_grad_reduce": grad}  # fmt: skip
            assert "overlap_param_gather" not in _fired(space, off)
    # the violation names both values it was judged on
    (v,) = [
        v
        for v in check(
            space, {**on, "use_distributed_optimizer": True, "overlap_grad_reduce": False}
        )
        if v.rule == "overlap_param_gather"
    ]
    assert v.values == {"use_distributed_optimizer": True, "overlap_grad_reduce": False}


# --- a knob for a constrained field needs a rule ---------------------------------------------

#: The config classes whose ``__post_init__`` checks decide what "Megatron constrains" means,
#: by the section name a :class:`~dse.space.knobs.FieldAssignment` uses.
CONFIG_FILES = {
    "model": ("transformer/transformer_config.py", "model_parallel_config.py"),
    "optimizer": ("optimizer/optimizer_config.py",),
    "ddp": ("distributed/distributed_data_parallel_config.py",),
}

#: Knobs whose fields Megatron-Core checks but that need no rule of dse, and why. Every entry is
#: checked to be still needed (its knob exists, sets a constrained field and no rule reads it).
NO_RULE_NEEDED = {
    "tensor_model_parallel_size": "read by the rules through the Layout (L.tp)",
    "pipeline_model_parallel_size": "read by the rules through the Layout (L.pp)",
    "context_parallel_size": "read by the rules through the Layout (L.cp)",
    "expert_model_parallel_size": "read by the rules through the Layout (L.ep)",
    "expert_tensor_parallel_size": "read by the rules through the Layout (L.etp)",
    "apply_rope_fusion": "checked only against multi-latent attention, interleaved RoPE and "
    "DSA, which the model fixes and dse does not explore; its TE need is rule 'features'",
    "gradient_accumulation_fusion": "checked only with defer_embedding_wgrad_compute, which "
    "dse does not explore; its apex/TE need is rule 'features'",
    "moe_permute_fusion": "the check imports TE's fused permute (a missing TE is rule "
    "'features'); also MoE-only (rule 'moe_only')",
    **dict.fromkeys(
        (
            "num_layers_in_first_pipeline_stage",
            "num_layers_in_last_pipeline_stage",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
        ),
        "read by the rules through the Layout's split (L.split, "
        "dse.space.layout.pipeline_chunks: Megatron-Core's checks of uneven stages)",
    ),
}


@cache
def _constrained_fields() -> dict[str, frozenset[str]]:
    """Per section, the fields a Megatron-Core config ``__post_init__`` asserts on or raises
    over (``self.<field>`` in the test of an ``assert`` or of an ``if`` that raises)."""
    out: dict[str, frozenset[str]] = {}
    for section, files in CONFIG_FILES.items():
        names: set[str] = set()
        for rel in files:
            for node in ast.walk(ast.parse(_source(rel))):
                if isinstance(node, ast.FunctionDef) and node.name == "__post_init__":
                    names |= set(_checked_self_fields(node))
        out[section] = frozenset(names)
    return out


def _checked_self_fields(fn: ast.FunctionDef) -> Iterator[str]:
    for sub in ast.walk(fn):
        tests: list[ast.expr] = []
        if isinstance(sub, ast.Assert):
            tests.append(sub.test)
        elif isinstance(sub, ast.If) and any(
            isinstance(x, ast.Raise) for stmt in sub.body for x in ast.walk(stmt)
        ):
            tests.append(sub.test)
        for t in tests:
            for a in ast.walk(t):
                if (
                    isinstance(a, ast.Attribute)
                    and isinstance(a.value, ast.Name)
                    and a.value.id == "self"
                ):
                    yield a.attr


def _knob_fields(k: Knob) -> set[tuple[str, str]]:
    if k.kind == "choice":
        values: list[Any] = list(k.choices)
    elif k.kind == "bool":
        values = [True, False]
    elif k.kind == "int":
        values = [2]
    else:
        values = []
    return {(a.section, a.field) for v in values for a in k.fields(v)}


def _constrained(k: Knob) -> list[str]:
    cons = _constrained_fields()
    return sorted(f for s, f in _knob_fields(k) if f in cons.get(s, frozenset()))


def _ruled_knobs() -> set[str]:
    """The knobs a rule reads by name (a string constant in its body)."""
    out: set[str] = set()
    for fn in RULES.values():
        for node in ast.walk(ast.parse(inspect.getsource(fn))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.add(node.value)
    return out & set(KNOBS)


def unruled(knobs: dict[str, Knob]) -> dict[str, list[str]]:
    """The knobs that set a constrained field, have no rule and no written reason."""
    ruled = _ruled_knobs()
    return {
        n: c
        for n, k in knobs.items()
        if (c := _constrained(k)) and n not in ruled and n not in NO_RULE_NEEDED
    }


def test_the_constrained_fields_are_read_from_megatron_core() -> None:
    cons = _constrained_fields()
    # facts of Megatron-Core 0.16.1 that the rules above encode
    assert {"sequence_parallel", "fp8_param", "num_attention_heads"} <= cons["model"]
    assert "use_distributed_optimizer" in cons["optimizer"]


def test_every_knob_for_a_constrained_field_has_a_rule_or_a_reason() -> None:
    assert unruled(KNOBS) == {}, (
        "these knobs set fields Megatron-Core checks in __post_init__ but no rule of "
        "dse.model.rules reads them: write the rule (or a reason in NO_RULE_NEEDED)"
    )
    ruled = _ruled_knobs()
    for name in NO_RULE_NEEDED:  # the reasons are still needed
        assert name in KNOBS and _constrained(KNOBS[name]) and name not in ruled, name


def test_a_knob_added_without_its_rule_is_caught() -> None:
    """The check above, on a catalog with one more knob: ``defer_embedding_wgrad_compute``, a
    real ModelParallelConfig field that its ``__post_init__`` checks (it raises without
    pipeline parallelism or without gradient_accumulation_fusion), with no rule."""
    extra = Knob(
        "defer_embedding_wgrad_compute",
        "bool",
        False,
        "defer the embedding's weight-gradient GEMMs to the pipeline flush",
        lambda v: [FieldAssignment("model", "defer_embedding_wgrad_compute", v)],
    )
    got = unruled({**KNOBS, extra.name: extra})
    assert got == {"defer_embedding_wgrad_compute": ["defer_embedding_wgrad_compute"]}
