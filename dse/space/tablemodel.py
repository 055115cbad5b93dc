"""A measured table row's ``model`` as the space's model, semantics and resources.

One schema for every reader and writer of measured tables: the replay workload
(``dse.workloads.replay``), the cost model's evaluation (``dse estimate --table``,
``dse bench --table``), the estimate's basis (``dse.model.costmodel.basis``) and the table
writer (``bench/measure_table.py``) all go through :func:`row_problem` and :func:`model_row`.

A row's ``model`` holds every :class:`~dse.space.searchspace.ModelSpec` field the
architecture sets (the hybrid layer pattern and Mamba sizes, the MoE sizes, the dropout,
...) plus the semantics the estimate reads (``global_batch_size``, ``seq_length``,
``precision``; ``peft`` and ``packed_sequences`` where the study set them). Rules of the
schema:

* a key that is neither a ``ModelSpec`` field nor one of :data:`ROW_SEMANTICS` /
  :data:`ROW_INFORMATIONAL` is not part of the model dse estimates (an initialisation
  setting, a writer's own note): :func:`unknown_model_fields` names them, and the readers say
  so, rather than refuse a table whose model they can build;
* a hybrid row (``hybrid_layer_pattern``) must state its Mamba sizes
  (:data:`HYBRID_REQUIRED`; ``mamba_num_heads`` may be absent or null: Megatron derives it
  from the hidden size) and an MoE row (``num_moe_experts``) its routing width
  (:data:`MOE_REQUIRED`): a default would describe some other model silently;
* ``gated_linear_unit`` (Megatron's name) maps to the space's ``activation``: ``true`` is
  ``swiglu``, ``false`` with ``swiglu`` declared is ``silu``.

The resources: the row's ``world_size`` and ``hardware`` (``gpu``, ``gpu_memory_gib``, and
``features`` where the writer recorded them). A row without ``features`` ran, so the
optional software its architecture and knob values need (mamba-ssm for Mamba layers, ...)
was there: those are its features.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from dse.space.knobs import KNOBS
from dse.space.searchspace import ModelSpec, Resources, Semantics

__all__ = [
    "HYBRID_REQUIRED",
    "MOE_REQUIRED",
    "ROW_INFORMATIONAL",
    "ROW_SEMANTICS",
    "RowModelError",
    "features_needed",
    "model_row",
    "row_problem",
    "space_model_fields",
    "unknown_model_fields",
]

#: Semantics a row's ``model`` carries (what the estimate reads of them).
ROW_SEMANTICS = ("global_batch_size", "seq_length", "precision", "peft", "packed_sequences")
#: Keys a row's ``model`` may carry that define nothing more (Megatron's name of the gated
#: unit, the measured window).
ROW_INFORMATIONAL = ("gated_linear_unit", "steps", "warmup_steps")
#: Fields a hybrid row must state.
HYBRID_REQUIRED = (
    "mamba_head_dim",
    "mamba_state_dim",
    "mamba_num_groups",
    "mamba_chunk_size",
)
#: Fields an MoE row must state.
MOE_REQUIRED = ("moe_router_topk",)

#: The ``ModelSpec`` fields a row's model gives; ``seq_length`` is the row's semantics
#: (:data:`ROW_SEMANTICS`), which the model's optional field only repeats.
_MODEL_FIELDS = tuple(k for k in ModelSpec.model_fields if k not in ROW_SEMANTICS)


class RowModelError(ValueError):
    """A row's model cannot be read (the message names the field)."""


def space_model_fields(model: Mapping[str, Any]) -> dict[str, Any]:
    """The space file's ``model`` section from a row's ``model``: every ``ModelSpec`` field
    it has (a ``null`` is left to the field's default), the activation from
    ``gated_linear_unit``. Raises :class:`RowModelError` naming a missing field."""
    need: list[str] = []
    if model.get("hybrid_layer_pattern") is not None:
        need += [k for k in HYBRID_REQUIRED if k not in model]
    if model.get("num_moe_experts") is not None:
        need += [k for k in MOE_REQUIRED if k not in model]
    if need:
        raise RowModelError(
            f"model field(s) {need} missing: a hybrid or MoE row states them (a default would "
            "describe another model)"
        )
    out = {k: model[k] for k in _MODEL_FIELDS if model.get(k) is not None}
    act = model.get("activation")
    glu = model.get("gated_linear_unit")
    if glu is True:
        act = "swiglu"
    elif glu is False and act == "swiglu":
        act = "silu"
    if act is not None:
        out["activation"] = act
    return out


def unknown_model_fields(model: Mapping[str, Any]) -> list[str]:
    """The keys of a row's ``model`` that are not part of the model dse estimates (sorted)."""
    return sorted(k for k in model if k not in _MODEL_FIELDS + ROW_SEMANTICS + ROW_INFORMATIONAL)


def features_needed(
    params_rows: Iterable[Mapping[str, Any]], model: ModelSpec | None = None
) -> list[str]:
    """The optional software the knob values of these configurations, and the architecture
    (Mamba layers: mamba-ssm), need (sorted)."""
    out: set[str] = set(model.features_needed()) if model is not None else set()
    for params in params_rows:
        for name, value in params.items():
            knob = KNOBS.get(name)
            if knob is not None:
                out.update(knob.requires(value))
    return sorted(out)


def row_problem(
    model: Mapping[str, Any],
    world_size: int,
    hardware: Mapping[str, Any],
    params_rows: Iterable[Mapping[str, Any]] = (),
) -> tuple[ModelSpec, Semantics, Resources]:
    """(model, semantics, resources) of a row; :class:`RowModelError` names what is wrong.

    ``params_rows``: the table's configurations, whose needs are the features of a row that
    does not record its own (see the module docstring)."""
    try:
        spec = ModelSpec.model_validate(space_model_fields(model))
        sem = Semantics.model_validate(
            {
                "global_batch_size": int(model["global_batch_size"]),
                "seq_length": int(model["seq_length"]),
                "precision": model.get("precision", "bf16"),
                "peft": model.get("peft"),
                "packed_sequences": bool(model.get("packed_sequences", False)),
            }
        )
        feats = hardware.get("features")
        if not isinstance(feats, list):
            feats = features_needed(params_rows, spec)
        res = Resources.model_validate(
            {
                "world_size": world_size,
                "gpu": hardware.get("gpu"),
                "gpu_memory_gib": hardware.get("gpu_memory_gib"),
                "features": list(feats),
            }
        )
    except KeyError as e:
        raise RowModelError(f"model field {e.args[0]!r} missing") from e
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        raise RowModelError(f"model field {where or '?'}: {err.get('msg')}") from e
    except (TypeError, ValueError) as e:
        raise RowModelError(str(e)) from e
    return spec, sem, res


def model_row(model: ModelSpec, semantics: Semantics) -> dict[str, Any]:
    """A row's ``model`` for a space's model and semantics: every ``ModelSpec`` field (so
    the reader rebuilds the identical model) and the semantics the estimate reads."""
    out = model.model_dump(mode="json")
    out.update(
        global_batch_size=semantics.global_batch_size,
        seq_length=semantics.seq_length,
        precision=semantics.precision,
    )
    if semantics.peft is not None:  # training semantics: written only when set
        out["peft"] = semantics.peft.model_dump(mode="json")
    if semantics.packed_sequences:
        out["packed_sequences"] = True
    return out
